"""CPU rule: kernels without a reduction (elementwise, transpose, concat, slicing, pad).

Every intermediate nest is inlined into the outputs; each remaining nest runs its outer
axes in parallel and its innermost axis in vectors.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight

from .loop_nest import Simd, iter_kinds, schedule_spatial


class Injective(dlight.ScheduleRule):
    """No reduction anywhere in the kernel."""

    def apply(
        self, func: tirx.PrimFunc, target: tvm.target.Target, tunable: bool
    ) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        root = sch.get_sblock("root")
        blocks = sch.get_child_blocks(root)
        if any("R" in iter_kinds(sch, b) for b in blocks):
            return None
        outputs = {sch.get(b).name_hint for b in sch.get_output_blocks(root)}
        for block in blocks:
            if sch.get(block).name_hint not in outputs:
                try:
                    sch.compute_inline(block)
                except Exception:  # read by several consumers at different indices: keep
                    pass
        simd = Simd.of(target)
        for block in sch.get_child_blocks(root):
            schedule_spatial(sch, block, simd)
        return sch
