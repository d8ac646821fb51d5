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

from .conv2d import Conv2d
from .conv2d_packed import PackedConv2d
from .dense import DenseColumns
from .depthwise import DepthwiseConv2d
from .injective import Injective
from .pool import Pool
from .safe import SafeFallback


def default_rules(target: Target, subgroup: int | None = None) -> list[ScheduleRule]:
    """The rules to try on each kernel for ``target``, in order.

    Parameters
    ----------
    target : tvm.target.Target
        An OpenCL or CUDA target (the rules return None on others).
    subgroup : int or None
        The device's Intel subgroup size; no rule uses subgroups yet, so it changes
        nothing today (the parameter is the schedule stage's stable interface).

    Returns
    -------
    list of ScheduleRule
        edgecv's rules (conv2d, depthwise/grouped conv, pooling, dense, injective),
        then dlight's that still pay for what ours leave: GEMV for dense layers
        with ``[N, K]`` weights, cross-thread reductions for softmax, sums and large
        means.
    """
    del target, subgroup  # the rules read the target when they apply
    return [
        PackedConv2d(),
        Conv2d(),
        DepthwiseConv2d(),
        Pool(),
        DenseColumns(),
        Injective(),
        dlight.gpu.GEMV(),
        dlight.gpu.Reduction(),
        dlight.gpu.GeneralReduction(),
    ]


def safe_rule() -> ScheduleRule:
    """The rule that schedules any kernel into something that compiles (slowly, maybe)."""
    return SafeFallback()


__all__ = [
    "Conv2d",
    "DenseColumns",
    "DepthwiseConv2d",
    "Injective",
    "Pool",
    "SafeFallback",
    "default_rules",
    "safe_rule",
]
