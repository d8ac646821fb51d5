"""Depthwise (groups = channels) and grouped (1 < groups < channels) NCHW conv2d.

TVM legalizes both to one ``group_conv2d_nchw`` block whose reduction runs over the
input channels of one group, so they share :mod:`.conv2d`'s schedule: work-items along
the output width, a register tile, the padded input staged in registers. Only the
tile differs: a depthwise channel shares no input with its neighbours, so its
work-items hold one channel and several rows instead.
"""

from __future__ import annotations

from dataclasses import replace

from tvm import s_tir, tirx
from tvm.target import Target

from .base import GPURule
from .conv2d import conv_shape, conv_tile, find_conv, schedule_conv


class DepthwiseConv2D(GPURule):
    """``group_conv2d_nchw``: depthwise and grouped convs with their fused neighbours."""

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = self.new_schedule(func)
        conv, found = find_conv(sch, "group_conv2d_nchw")
        if conv is None:
            return None
        shape = conv_shape(sch, conv)
        depthwise = shape["c"] == 1
        tile = conv_tile(shape, target, depthwise=depthwise)
        if not depthwise:
            # channels of one tile must share a group to share its input: the tile
            # divides the group's output channels
            groups = int(sch.get(conv).reads[0].source.shape[1]) // shape["c"]
            per_group = shape["f"] // groups
            tile = replace(tile, channels=next(c for c in (8, 4, 2, 1) if per_group % c == 0))
        schedule_conv(sch, conv, found, tile)
        return sch
