"""edgecv's default CPU (LLVM) rules, one kernel class per file, in the order tried.

=========================================  ==============================================
kernel (main block)                        rule
=========================================  ==============================================
Winograd conv2d in NCHW[x]c (the graph     :class:`.winograd.Winograd`: transforms in
tuner's choice for some 3x3 convolutions)  vectors, products as packed 1x1 convs
conv2d / depthwise in NCHW[x]c (the graph  :class:`.conv2d_packed.PackedConv2D`: register
tuner's packed layouts)                    tiles of channel-block vectors
INT8 conv2d NCHW, uint8 x int8, groups 1   :class:`.conv2d_int8.Conv2DInt8`: the tile
                                           of Conv2D on the CPU's dot-product
                                           instructions (VNNI, vpmaddubsw)
conv2d NCHW, groups 1                      :class:`.conv2d.Conv2D`: register tiles
                                           vectorized over output channels
depthwise / grouped conv2d, pooling,       :class:`.window.Window`: tiles vectorized
other reductions over an image (a          along output rows (and along output axes
registered conv-like op)                   the loaded inputs do not depend on)
dense ``x @ w`` (``w`` as ``[in, out]``)   :class:`.dense.Dense`
no reduction (elementwise, transpose,      :class:`.injective.Injective`: producers
concat, slicing, padding)                  inlined; outer axes parallel, inner vectorized
other reductions (softmax, mean)           :class:`.reduction.Rows`: rows in parallel
anything (the safe rule)                   :class:`.safe.SafeParallel`
=========================================  ==============================================

The elementwise ops after a reduction (bias, BatchNorm, activation, residual add) are
applied to each register tile as it is written back. A rule returns None for a kernel
that is not its kind; the schedule stage (:mod:`edgecv.schedules.stage`) tries the next.

Not rules: what the rules share (:mod:`.loop_nest`, :mod:`.base`), the CPU's 8-bit dot
products (:mod:`.dot_product`, which the INT8 step, the graph tuner and the CPU
pipeline read too) and their tensor intrinsics (:mod:`.tensor_intrin`).
"""

from __future__ import annotations

import tvm
from tvm import tirx
from tvm.s_tir import dlight

from .conv2d import Conv2D
from .conv2d_int8 import Conv2DInt8
from .conv2d_packed import PackedConv2D
from .dense import Dense
from .injective import Injective
from .loop_nest import Simd
from .reduction import Rows
from .safe import SafeParallel
from .window import Window
from .winograd import Winograd


def default_rules(target: tvm.target.Target) -> list[dlight.ScheduleRule]:
    """The CPU rules for ``target``, in the order the schedule stage tries them."""
    return [
        Winograd(),
        PackedConv2D(),
        Conv2DInt8(),
        Conv2D(),
        Window(),
        Dense(),
        Injective(),
        Rows(),
    ]


def safe_rule() -> dlight.ScheduleRule:
    """The CPU rule that applies to every kernel."""
    return SafeParallel()


def schedule_cpu(func: tirx.PrimFunc, target: tvm.target.Target) -> tirx.PrimFunc:
    """``func`` scheduled by the first CPU rule that applies (tests, benchmarks)."""
    from ..stage import ScheduleOrder

    order = ScheduleOrder(target, default_rules(target), safe_rule())
    return next(c.func for c in order.attempts(func) if c.func is not None)


__all__ = [
    "Conv2D",
    "Conv2DInt8",
    "Dense",
    "Injective",
    "PackedConv2D",
    "Rows",
    "SafeParallel",
    "Simd",
    "Window",
    "Winograd",
    "default_rules",
    "safe_rule",
    "schedule_cpu",
]
