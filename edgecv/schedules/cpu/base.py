"""The shape every CPU rule for a kernel with one reduction shares.

A fused kernel from LegalizeOps + FuseOps + FuseTIR is a chain of loop nests: producers
(padding, a copy of the input), one reduction (the convolution, the pooling window,
the dense product) and an elementwise epilogue (bias, BatchNorm, activation, residual
add). :class:`OneReductionRule` finds the three, inlines the epilogue into one nest and
lets the subclass schedule the reduction with it; producers the subclass did not place
are scheduled as plain loop nests. The subclass raises :class:`NotApplicable` when the
kernel is not its kind: the rule then returns None, so the stage tries the next one.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight
from tvm.s_tir.schedule import SBlockRV

from .loop_nest import NotApplicable, Simd, iter_kinds, schedule_spatial


class OneReductionRule(dlight.ScheduleRule):
    """Base of the CPU rules that schedule the one reduction of a kernel."""

    def apply(
        self, func: tirx.PrimFunc, target: tvm.target.Target, tunable: bool
    ) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
        if any(not sch.get(block).writes for block in blocks):
            return None  # a block of opaque writes (an IR-builder op: box NMS, MultiBox)
        reductions = [i for i, b in enumerate(blocks) if "R" in iter_kinds(sch, b)]
        if len(reductions) != 1:
            return None
        index = reductions[0]
        main, producers, consumers = blocks[index], blocks[:index], blocks[index + 1 :]
        names = [sch.get(block).name_hint for block in producers]
        simd = Simd.of(target)
        # A consumer that changes the shape (the next layer's explicit `pad`, fused after
        # this one by FuseOps) is no epilogue of the tile: it stays a nest of its own.
        shape = [int(d) for d in sch.get(main).writes[0].source.shape]
        tail = []
        while (
            consumers and [int(d) for d in sch.get(consumers[-1]).writes[0].source.shape] != shape
        ):
            tail.insert(0, consumers.pop())
        names += [sch.get(block).name_hint for block in tail]
        try:
            # One epilogue nest: every elementwise consumer inlined into the last one.
            for block in consumers[:-1]:
                sch.compute_inline(block)
            placed = self.schedule(sch, main, consumers[-1] if consumers else None, simd)
        except NotApplicable:
            return None
        for name in names:
            if name not in placed:
                schedule_spatial(sch, sch.get_sblock(name), simd)
        return sch

    def schedule(
        self, sch: s_tir.Schedule, main: SBlockRV, epilogue: SBlockRV | None, simd: Simd
    ) -> set[str]:
        """Schedule ``main`` with its ``epilogue``; return the producers it placed."""
        raise NotImplementedError("a OneReductionRule needs `schedule`")
