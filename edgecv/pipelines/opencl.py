"""The OpenCL pipeline (Intel Graphics, Mali), in order.

0. ``--precision fp16`` only, first: operators in float16 per edgecv's table
   (:func:`.fp16.convert`; the CPU launches of step 8 stay float32). Then the graph
   tuner: a data layout per convolution (NCHW or packed), from measured costs
   (:func:`edgecv.graph_tuner.choose_layouts`).
1. Relax passes, fused kernels, the static plan (:func:`edgecv.lowering.lower`).
2. Placement, pass 1: each launch GPU or CPU from the profile's declared capabilities
   (``gpu_ops``) and ``--cpu-ops``.
3. Schedule + lowering of the GPU kernels, per kernel, contained and time-limited:
   edgecv's operators in their GPU versions (Intel-subgroup variants where the profile
   has subgroups); every other kernel tuned record -> edgecv's GPU rule -> safe rule.
4. OpenCL C for the kernels that lowered, one program.
5. The program compiled on a local device of the profile's kind (when there is one);
   kernels its compiler rejects leave the program.
6. Placement, pass 2: kernels without a GPU kernel after 3-5 go to the CPU.
7. Device copies on every edge between devices; the memory plan, with each GPU
   launch's workspaces (its kernel's global scratch buffers) among its buffers.
8. The CPU launches scheduled and compiled for the profile's host CPU.
"""

from __future__ import annotations

import time

import tvm

from ..board.precision import Precision
from ..codegen.opencl import program_of
from ..fallback import widened_constants
from ..graph_tuner import choose_layouts
from ..graph_tuner.stage import winograd_plan
from ..lowering import lower
from ..profiles import Profile
from . import fp16
from . import gpu_steps as g
from .steps import BuildOptions, Built, Progress


def build(mod: tvm.IRModule, profile: Profile, options: BuildOptions, progress: Progress) -> Built:
    """Compile the imported Relax module ``mod`` for an OpenCL profile."""
    mod = fp16.convert(mod, options, progress)  # 0
    mod, layouts = choose_layouts(mod, profile, options, progress)  # 0
    progress("lowering (Relax passes, fusion, memory plan)")
    lowered = lower(mod, winograd_plan(layouts))  # 1
    g.check_forced_cpu_link(lowered, profile, options)
    started = time.perf_counter()
    gpu_names, compiled, work = g.schedule_gpu_kernels(lowered, profile, options, progress)  # 2, 3
    no_kernel = g.no_gpu_kernel(compiled)
    target, subgroup = profile.tvm_target(), profile.intel_subgroup_size

    def program(names: set[str]) -> tuple[str, list[str], dict]:
        source, requires = program_of([compiled[n].facts for n in sorted(names)], target, subgroup)
        return source, requires, {n: compiled[n].facts["launches"] for n in sorted(names)}

    failed: dict[str, str] = {}
    while True:
        source, requires, launches = program(gpu_names - set(no_kernel) - set(failed))  # 4
        newly = g.check_on_device(
            profile, source, requires, launches, options.check_on, progress, program
        )  # 5
        if not newly:
            break
        failed.update(newly)
    work.cleanup()
    placement = g.place_launches(lowered, profile, options, no_kernel, failed)  # 6
    g.warn_fallbacks(placement)
    plan, facts, write_cpu = g.copies_and_cpu_kernels(
        lowered, placement, profile, options, progress, launches
    )  # 7, 8
    facts["requires"] = requires
    facts["layouts"] = layouts
    constants = lowered.constants
    if options.precision is Precision.FP16:
        facts["fp16"] = fp16.launch_facts(plan, lowered)
        constants = widened_constants(plan, constants)
    facts["schedules"] = {"gpu": g.gpu_schedule_facts(compiled, lowered)}
    if "cpu_schedules" in facts:
        facts["schedules"]["cpu"] = facts.pop("cpu_schedules")
    timings = {**lowered.timings, "build_s": time.perf_counter() - started}
    write = g.package_writer("opencl", source, launches, write_cpu)
    return Built(plan, constants, write, facts, timings, lowered.kernel_ops)
