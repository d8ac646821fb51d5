"""CPU rule that always applies: the outer loop of each nest in parallel, nothing clever.

The last rule of the CPU order. It changes nothing but a ``parallel`` annotation on
the outermost loop of each top-level nest whose first iterator is spatial, so anything
LegalizeOps produced compiles with it; a nest it cannot annotate stays serial, and a
kernel written as plain loops without blocks (a TE extern such as ROIAlign's CPU
version, already parallel) is left as written.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight

from .loop_nest import PARALLEL_MIN_ELEMENTS, extent, iter_kinds


class SafeParallel(dlight.ScheduleRule):
    """Outermost spatial loop of each nest in parallel."""

    def apply(
        self, func: tirx.PrimFunc, target: tvm.target.Target, tunable: bool
    ) -> s_tir.Schedule:
        sch = s_tir.Schedule(func)
        try:
            root = sch.get_sblock("root")
        except s_tir.ScheduleError:  # plain loops, no blocks (a TE extern): as written
            return sch
        for block in sch.get_child_blocks(root):
            loops = sch.get_loops(block)
            kinds = iter_kinds(sch, block)
            if not loops or not kinds.startswith("S") or len(loops) != len(kinds):
                continue
            total = 1
            for loop in loops:
                total *= extent(sch, loop)
            if total >= PARALLEL_MIN_ELEMENTS and extent(sch, loops[0]) > 1:
                try:
                    sch.parallel(loops[0])
                except Exception:  # not a plain outer loop: leave the nest serial
                    continue
        return sch
