"""edgecv's default GPU schedule rules (OpenCL and CUDA), one kernel class per module."""

from __future__ import annotations

from tvm.s_tir.dlight import ScheduleRule
from tvm.target import Target

from .conv2d import Conv2d
from .depthwise import DepthwiseConv2d


def default_rules(target: Target, subgroup: int | None = None) -> list[ScheduleRule]:
    return [Conv2d(), DepthwiseConv2d()]
