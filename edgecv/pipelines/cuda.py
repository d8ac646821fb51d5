"""The CUDA pipeline (Jetson), in order.

0. ``--precision fp16`` only: operators in float16 per edgecv's table
   (:func:`.fp16.convert`; the CPU launches of step 6 stay float32).
1. Relax passes, fused kernels, the static plan (:func:`edgecv.lowering.lower`).
2. Placement, pass 1: from the profile's declared capabilities and ``--cpu-ops``.
3. Schedule + lowering of the GPU kernels, per kernel, contained and time-limited
   (edgecv's operators in their GPU versions; tuned record -> GPU rule -> safe rule).
4. CUDA C++ for the kernels that lowered, compiled by nvcc to a cubin + PTX when this
   nvcc supports the profile's architecture (else the source ships, compiled on the
   device).
5. Placement, pass 2: kernels without a GPU kernel go to the CPU.
6. Device copies; the memory plan, with each GPU launch's workspaces among its
   buffers; the CPU launches compiled for the profile's host CPU.
"""

from __future__ import annotations

import time

import tvm

from ..board.precision import Precision
from ..codegen.cuda import generate_cuda
from ..fallback import widened_constants
from ..lowering import lower
from ..profiles import Profile
from . import fp16
from . import gpu_steps as g
from .steps import BuildOptions, Built, Progress


def build(mod: tvm.IRModule, profile: Profile, options: BuildOptions, progress: Progress) -> Built:
    """Compile the imported Relax module ``mod`` for a CUDA profile."""
    mod = fp16.convert(mod, options, progress)  # 0
    progress("lowering (Relax passes, fusion, memory plan)")
    lowered = lower(mod)  # 1
    g.check_forced_cpu_link(lowered, profile, options)
    started = time.perf_counter()
    gpu_names, compiled, work = g.schedule_gpu_kernels(lowered, profile, options, progress)  # 2, 3
    no_kernel = g.no_gpu_kernel(compiled)
    device_mod, launches, _ = g.device_code_of(compiled, gpu_names - set(no_kernel))
    work.cleanup()
    target = profile.tvm_target()
    progress(f"generating CUDA and compiling it with nvcc for {target.attrs['arch']}")
    code = generate_cuda(device_mod, target)  # 4
    if code.cubin is None:
        progress(
            f"shipping CUDA source only: {code.not_compiled_because}; the device "
            "compiles it with its own nvcc on first run (then cached)"
        )
    placement = g.place_launches(lowered, profile, options, no_kernel)  # 5
    g.warn_fallbacks(placement)
    plan, facts, write_cpu = g.copies_and_cpu_kernels(
        lowered, placement, profile, options, progress, launches
    )  # 6
    facts["cuda"] = {
        "arch": code.arch,
        "binaries": [k for k in ("cubin", "ptx") if getattr(code, k) is not None],
        "compile_on_device": code.cubin is None,
        "why_source_only": code.not_compiled_because,
    }
    facts["schedules"] = {"gpu": g.gpu_schedule_facts(compiled, lowered)}
    if "cpu_schedules" in facts:
        facts["schedules"]["cpu"] = facts.pop("cpu_schedules")
    constants = lowered.constants
    if options.precision is Precision.FP16:
        facts["fp16"] = fp16.launch_facts(plan, lowered)
        constants = widened_constants(plan, constants)

    def binaries(writer) -> dict[str, str]:
        files = {}
        if code.cubin is not None:
            files["cuda_cubin"] = f"kernels/cuda_{code.arch}.cubin"
            writer.path(files["cuda_cubin"]).write_bytes(code.cubin)
        if code.ptx is not None:
            files["cuda_ptx"] = f"kernels/cuda_{code.arch}.ptx"
            writer.write_text(files["cuda_ptx"], code.ptx)
        return files

    timings = {**lowered.timings, "build_s": time.perf_counter() - started}
    write = g.package_writer("cuda", code.source, launches, write_cpu, binaries)
    return Built(plan, constants, write, facts, timings, lowered.kernel_ops)
