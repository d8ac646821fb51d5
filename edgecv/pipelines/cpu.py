"""The CPU pipeline, in order.

The INT8 decision is made here, once per build: the dot product an INT8 build's
convolutions run on (:func:`edgecv.schedules.cpu.dot_product.dot_product_of`; None in
another build, or on a CPU without one), handed to the stages 0-2.

0. ``--precision int8`` only: calibrate (or reuse the statistics), quantize the
   convolutions and dense layers (:func:`.int8.quantize_model`).
1. Graph tuner: a data layout per convolution (NCHW or packed), from measured costs
   (:func:`edgecv.graph_tuner.choose_layouts`).
2. Relax passes: legalize (INT8 convolutions with their weights packed for the CPU's
   dot-product instruction), fold, fuse into kernels; the static plan and memory plan
   (:func:`edgecv.lowering.lower`).
3. Schedule + code, per kernel, contained and time-limited, on every core: tuned record
   -> edgecv's CPU rule for the kernel's class -> the safe rule; LLVM to an object file
   (:func:`.steps.compile_cpu_kernels`).
4. Link the objects into ``kernels/cpu.so`` when the package is written.
"""

from __future__ import annotations

import time

import tvm

from ..board.precision import Precision
from ..graph_tuner import choose_layouts
from ..graph_tuner.stage import winograd_plan
from ..lowering import lower
from ..lowering.legalize import fast_exp_for
from ..profiles import Profile
from ..schedules.cpu.dot_product import dot_product_of, int8_lowering
from .int8 import quantize_model
from .int8_given import quantize_given
from .steps import BuildOptions, Built, Progress, compile_cpu_kernels


def build(mod: tvm.IRModule, profile: Profile, options: BuildOptions, progress: Progress) -> Built:
    """Compile the imported Relax module ``mod`` for a CPU profile."""
    precision: dict = {"precision": options.precision.value}
    files: dict[str, str] = {}
    target = profile.tvm_target()
    int8 = options.precision is Precision.INT8
    dot = dot_product_of(target) if int8 else None
    if int8:  # 0
        given = options.model_quantization is not None  # a QDQ model's own scales
        step = quantize_given if given else quantize_model
        mod, quantization, files = step(mod, profile, options, progress, dot)
        precision["quantization"] = quantization
    mod, layouts = choose_layouts(mod, profile, options, progress, dot)  # 1
    progress("lowering (Relax passes, fusion, memory plan)")
    lowered = lower(mod, winograd_plan(layouts), *int8_lowering(dot), fast_exp_for(target))  # 2
    progress(
        f"scheduling and compiling {len(lowered.kernels.functions)} kernels for "
        f"{target.attrs.get('mcpu', 'the CPU')}"
    )
    started = time.perf_counter()
    write, facts = compile_cpu_kernels(lowered.kernels, target, lowered, options, progress)
    host = facts.pop("host")
    timings = {**lowered.timings, "build_s": time.perf_counter() - started}
    return Built(
        lowered.plan,
        lowered.constants,
        write,
        {**precision, "schedules": {"cpu": facts}, "layouts": layouts, "host": host},
        timings,
        lowered.kernel_ops,
        files,
    )
