"""CPU rule: any kernel with reductions the other rules did not take (softmax, mean,
normalizations, a reduction no rule fits): each reduction runs its leading spatial axes
(the rows) in parallel, the injective nests between them vectorized."""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight

from .loop_nest import Simd, iter_kinds, parallelize_outer, schedule_spatial


class Rows(dlight.ScheduleRule):
    """Reductions by rows in parallel."""

    def apply(
        self, func: tirx.PrimFunc, target: tvm.target.Target, tunable: bool
    ) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        if not any("R" in iter_kinds(sch, b) for b in blocks):
            return None
        simd = Simd.of(target)
        for block in blocks:
            if "R" in iter_kinds(sch, block):
                parallelize_outer(sch, block)
            else:
                schedule_spatial(sch, block, simd)
        return sch
