"""``--precision fp16`` on GPU profiles: the checks before compiling, the conversion step
of the GPU pipelines and what the manifest and ``deploy --explain`` say about it.

The conversion itself is :func:`edgecv.lowering.precision.to_half` (TVM's
``ToMixedPrecision`` under edgecv's per-operator table); launches the placement moves to
the CPU run float32 kernels (:func:`edgecv.lowering.precision.widen_kernels`), with the
device copies converting (:func:`edgecv.fallback.insert_copies`). See ``docs/fp16.md``.
"""

from __future__ import annotations

import tvm

from ..board.errors import EdgecvError
from ..board.manifest import Manifest
from ..board.plan import Plan
from ..board.precision import Precision
from ..lowering import Lowered
from ..lowering.precision import ACCUMULATE, computes_in_half, to_half
from ..profiles import Profile
from .steps import BuildOptions, Progress

# The OpenCL extension a float16 program needs (TVM's source enables it with a pragma).
EXTENSION = "cl_khr_fp16"


def check_request(options: BuildOptions, profile: Profile, progress: Progress) -> None:
    """Refuse, before anything is compiled, fp16 where it cannot run: the ``cpu`` profile,
    a profile whose device has no float16 arithmetic, ``local`` on a machine without an
    OpenCL device that has it. Say so when the device the program would be checked on at
    deploy time lacks ``cl_khr_fp16`` (the check then moves to one that has it, or is
    skipped)."""
    if options.precision is not Precision.FP16:
        return
    if profile.runtime == "cpu":
        raise EdgecvError(
            f"--precision fp16 builds for GPU profiles only (deeplens, aisage, the Jetsons, "
            f"local); profile `{profile.name}` runs float32 kernels on the CPU: deploy with "
            "a GPU profile, or without --precision fp16"
        )
    if has_fp16(profile) is False:
        raise EdgecvError(
            f"profile `{profile.name}` says its device has no float16 arithmetic (gpu.fp16 "
            "is false"
            + (", and no OpenCL device here has cl_khr_fp16" if profile.fp16 == "auto" else "")
            + "): deploy without --precision fp16"
        )
    if profile.runtime != "opencl" or options.check_on is None:
        return
    from ..board.runtime.opencl_devices import opencl_devices

    query = profile.default_opencl_device if options.check_on == "auto" else options.check_on
    devices = opencl_devices()
    matching = [d for d in devices if d.matches(query)]
    if matching and not any(d.fp16 for d in matching):
        able = [d.label for d in devices if d.fp16]
        progress(
            f"the fp16 program cannot be checked on {'; '.join(d.label for d in matching)}: "
            f"it lacks {EXTENSION}"
            + (f" (devices that have it: {'; '.join(able)})" if able else "; it is built unchecked")
        )


def has_fp16(profile: Profile) -> bool:
    """Whether the profile's device computes in float16; ``local``'s (``"auto"``): whether
    an OpenCL device on this machine has ``cl_khr_fp16`` (the runtime picks one that has)."""
    if profile.fp16 != "auto":
        return bool(profile.fp16)
    if profile.runtime != "opencl":
        return False
    from ..board.runtime.opencl_devices import opencl_devices

    return any(d.fp16 for d in opencl_devices())


def convert(mod: tvm.IRModule, options: BuildOptions, progress: Progress) -> tvm.IRModule:
    """Step 0 of the GPU pipelines: ``mod`` in float16 where the table says (fp16 only)."""
    if options.precision is not Precision.FP16:
        return mod
    progress(f"converting to float16 (ToMixedPrecision, accumulating in {ACCUMULATE})")
    return to_half(mod)


def launch_facts(plan: Plan, lowered: Lowered) -> dict:
    """The manifest's ``build.fp16``: the precision of every launch in plan order (CPU
    launches are float32 by construction), counts, and the float32 GPU launches with
    their operators (the table's choices as they fell in this model)."""
    kernels = {gv.name_hint: f for gv, f in lowered.kernels.functions.items()}
    launches, counts, fp32_gpu = [], {}, {}
    for step in plan.steps:
        if step.kind == "copy":
            continue
        half = step.device == "gpu" and computes_in_half(kernels[step.kernel])
        precision = (Precision.FP16 if half else Precision.FP32).value
        launches.append({"kernel": step.kernel, "device": step.device, "precision": precision})
        key = f"{step.device}_{precision}"
        counts[key] = counts.get(key, 0) + 1
        if step.device == "gpu" and not half:
            fp32_gpu[step.kernel] = lowered.kernel_ops.get(step.kernel, [step.kernel])
    return {
        "accumulate": ACCUMULATE,
        "counts": counts,
        "fp32_gpu_kernels": fp32_gpu,
        "launches": launches,
    }


def explain_lines(manifest: Manifest) -> list[str]:
    """``deploy --explain``: which launches run in which precision (an fp16 package), or
    what fp16 would save (an fp32 package for a profile whose device has float16)."""
    build, recorded = manifest.build, manifest.precision
    if recorded is Precision.FP16 and "fp16" in build:
        facts = build["fp16"]
        counts = ", ".join(f"{n} {key.replace('_', ' ')}" for key, n in facts["counts"].items())
        lines = [f"precision: fp16 (accumulating in {facts['accumulate']}): {counts} launches"]
        lines += [
            f"  gpu fp32  {kernel} ({', '.join(ops)})"
            for kernel, ops in facts["fp32_gpu_kernels"].items()
        ]
        return lines
    if recorded is not Precision.FP32 or manifest.gpu.get("fp16") not in (True, "auto"):
        return []
    weights, activations = build.get("constant_bytes", 0), build.get("intermediate_bytes", 0)
    return [
        f"precision: fp32; --precision fp16 would store the weights in {weights / 2:,.0f} "
        f"instead of {weights:,} bytes and plan activations in up to about half of "
        f"{activations:,} bytes (reductions, softmax and the vision operators stay float32)"
    ]
