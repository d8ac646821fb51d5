"""edgecv's default GPU schedule rules (OpenCL and CUDA), one kernel class per module.

Each rule is a :class:`tvm.s_tir.dlight.ScheduleRule`: ``apply(func, target, tunable)``
returns a schedule whose function is marked scheduled (``tirx.is_scheduled``), or None
when the kernel is not its kind. The schedule stage tries :func:`default_rules` in
order and falls back to :func:`safe_rule`; a rule may also raise, which the caller
contains like a None. Tile sizes come from the target (``max_num_threads``), so one
rule serves Intel Graphics, Mali and Jetson profiles.
"""

from __future__ import annotations

from tvm.s_tir import dlight
from tvm.s_tir.dlight import ScheduleRule
from tvm.target import Target

from .conv2d import Conv2D
from .conv2d_packed import PackedConv2D
from .dense import DenseColumns
from .depthwise import DepthwiseConv2D
from .injective import Injective
from .pool import Pool
from .rows import RowReduction
from .safe import SafeFallback
from .winograd import Winograd


def default_rules(target: Target, subgroup: int | None = None) -> list[ScheduleRule]:
    """The rules to try on each kernel for ``target``, in order.

    Parameters
    ----------
    target : tvm.target.Target
        An OpenCL or CUDA target (the rules return None on others).
    subgroup : int or None
        The device's Intel subgroup size. No rule uses it: the Intel-subgroup 1x1 conv
        (weights one per lane, broadcast by shuffles; ``benchmarks/subgroup_pointwise.py``)
        ran slower than the plain rule on Intel's CPU OpenCL runtime, so it stays out of
        the order until it pays on a device (the times: ``benchmarks/results/``,
        ``subgroup_pointwise-2026-11-23-intel-cpu-opencl.md``).

    Returns
    -------
    list of ScheduleRule
        edgecv's rules (Winograd and direct conv2d, depthwise/grouped conv, pooling,
        dense, injective),
        dlight's GEMV for dense layers with ``[N, K]`` weights, edgecv's rule for
        many short reductions (softmax over classes), then dlight's cross-thread
        reductions for few long ones.
    """
    del target, subgroup  # the rules read the target when they apply
    return [
        Winograd(),
        PackedConv2D(),
        Conv2D(),
        DepthwiseConv2D(),
        Pool(),
        DenseColumns(),
        Injective(),
        dlight.gpu.GEMV(),
        RowReduction(),
        dlight.gpu.Reduction(),
        dlight.gpu.GeneralReduction(),
    ]


def safe_rule() -> ScheduleRule:
    """The rule that schedules any kernel into something that compiles (slowly, maybe)."""
    return SafeFallback()


__all__ = [
    "Conv2D",
    "DenseColumns",
    "DepthwiseConv2D",
    "Injective",
    "Pool",
    "RowReduction",
    "SafeFallback",
    "Winograd",
    "default_rules",
    "safe_rule",
]
