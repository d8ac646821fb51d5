"""Kernels of short reductions over many rows: softmax, sums and means over an axis,
normalizations; one work-item per reduced value, its reduction serial in a register.

dlight's cross-thread rules give every row a work-group that reduces through local
memory and a barrier per step: right for a few long rows, costly for many short ones
(SSD's softmax over 21 classes for 6,132 anchors took 204 ms of a 1.7 s inference on
Intel's CPU runtime, 256 work-items and 9 barriers per row of 21). Here each block of
the kernel is its own launch: a reduction gets one work-item per output in work-groups
that divide the outputs, a spatial block the injective rule's 1-D schedule, and
intermediate results go through global memory. Kernels with few rows or long ones are
left to dlight's rules (None).
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.target import Target

from .base import GPURule, bind_spatial, blocks, extent, iter_kinds, loop_kinds, max_threads
from .injective import schedule_flat

THREADS = 256
# a row longer than this, or fewer rows than one work-group: dlight's cross-thread rules
LONGEST_ROW = 4096


def _inline_spatial(sch: s_tir.Schedule) -> None:
    """Inline the spatial blocks that are not outputs (the exp between softmax's two
    reductions is recomputed by its two consumers instead of stored)."""
    for block in blocks(sch)[:-1]:
        if set(iter_kinds(sch, block)) <= {"S"}:
            try:
                sch.compute_inline(block)
            except Exception:  # a block that will not inline stays a launch of its own
                continue


def _sizes(sch: s_tir.Schedule, block) -> tuple[int, int]:
    """(outputs, reduction length) of a reduction block."""
    outputs = length = 1
    for loop, kind in zip(sch.get_loops(block), loop_kinds(sch, block), strict=True):
        if kind == "S":
            outputs *= extent(sch, loop)
        else:
            length *= extent(sch, loop)
    return outputs, length


class RowReduction(GPURule):
    """Kernels whose reductions are short and many (see the module docstring)."""

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        started = self.start(func, target)
        if started is None:
            return None
        sch, found, reductions = started
        if not reductions:
            return None
        limit = min(THREADS, max_threads(target))
        for block in reductions:
            outputs, length = _sizes(sch, block)
            if length > LONGEST_ROW or outputs < limit:
                return None
        _inline_spatial(sch)
        for block in blocks(sch):
            if "R" not in iter_kinds(sch, block):
                if not schedule_flat(sch, block, limit):
                    bind_spatial(sch, block, limit)
                continue
            _, item, reduce = bind_spatial(sch, block, limit)
            out = sch.cache_write(block, 0, "local")
            sch.reverse_compute_at(out, item, preserve_unit_loops=True)
            sch.decompose_reduction(block, reduce[0])
        return sch
