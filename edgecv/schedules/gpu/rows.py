"""Kernels of short reductions over many rows: softmax, sums and means over an axis,
normalizations; one work-item per reduced value, its reduction serial in a register.

dlight's cross-thread rules give every row a work-group that reduces through local
memory and a barrier per step: right for a few long rows, costly for many short ones
(SSD's softmax over 21 classes for 6,132 anchors: 256 work-items and 9 barriers per row
of 21, a large share of the inference on Intel's CPU runtime; the times:
benchmarks/results/gpu_rules-2026-11-23-intel-cpu-opencl.md). Here each block of
the kernel is its own launch: a reduction gets one work-item per output in work-groups
that divide the outputs, a spatial block the injective rule's 1-D schedule, and
intermediate results go through global memory. Kernels with few rows or long ones are
left to dlight's rules (None).

A reduction with several spatial axes, some of which the operands read along its
innermost axis do not depend on (a user's capsule convolution: output capsules and
pose columns; a batched matmul's rows), gives each work-item a register tile along
those axes, so every value it loads feeds several accumulators (:func:`register_tile`).
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.target import Target

from .base import (
    GPURule,
    bind_spatial,
    blocks,
    divisor_at_most,
    extent,
    iter_kinds,
    loop_kinds,
    max_threads,
    work_items,
)
from .injective import schedule_flat

THREADS = 256
# accumulators per work-item of a register tile: a conv's 8 output channels (16
# spilled on Intel's CPU runtime, :mod:`.conv2d`)
TILE = 8
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
            tiled = register_tile(sch, block, TILE)
            if tiled is None:
                tile = []
                _, item, reduce = bind_spatial(sch, block, limit)
            else:
                spatial, reduce, tile = tiled
                sch.reorder(*spatial, *reduce, *tile)
                fused = sch.fuse(*spatial)
                group, item = sch.split(fused, [None, work_items(extent(sch, fused), limit)])
                sch.bind(group, "blockIdx.x")
                sch.bind(item, "threadIdx.x")
            out = sch.cache_write(block, 0, "local")
            sch.reverse_compute_at(out, item, preserve_unit_loops=True)
            init = sch.decompose_reduction(block, reduce[0])
            if tile:
                for loop in [*tile, *_tail(sch, init, item), *_tail(sch, out, item)]:
                    sch.unroll(loop)
        return sch


def _tail(sch: s_tir.Schedule, block, item) -> list:
    """The loops of ``block`` under loop ``item``."""
    loops = list(sch.get_loops(block))
    index = [sch.get(loop).same_as(sch.get(item)) for loop in loops].index(True)
    return loops[index + 1 :]


def register_tile(sch: s_tir.Schedule, block, size: int):
    """Split from the spatial loops of ``block`` a register tile of at most ``size``
    outputs along the axes that no operand read along the innermost spatial axis (the
    one consecutive work-items take) depends on: each such load then feeds every
    accumulator of the tile. Returns ``(spatial, reductions, tile)`` loops, the
    spatial ones what is left for work-items, or None when no axis qualifies.
    """
    stmt = sch.get(block)
    loops, kinds = list(sch.get_loops(block)), loop_kinds(sch, block)
    spatial = [i for i, kind in enumerate(kinds) if kind == "S"]
    # the innermost spatial axis that is not a unit one (a mean's (N, C, 1, 1) output)
    inner = next((i for i in reversed(spatial) if extent(sch, loops[i]) > 1), None)
    if inner is None or len(spatial) == len(kinds):
        return None
    iters = [v.var for v in stmt.iter_vars]
    out = stmt.writes[0].source  # a reduction reads its accumulator too
    streamed = [r for r in stmt.reads if not r.source.same_as(out) and _uses(r, iters[inner])]
    if not streamed:
        return None
    tile = []
    for i in reversed([i for i in spatial if i < inner]):
        if any(_uses(r, iters[i]) for r in streamed):
            continue
        factor = divisor_at_most(extent(sch, loops[i]), size)
        if factor > 1:
            loops[i], inner = sch.split(loops[i], [None, factor])
            tile.insert(0, inner)
            size //= factor
    if not tile:
        return None
    reduce = [loops[i] for i, kind in enumerate(kinds) if kind != "S"]
    return [loops[i] for i in spatial], reduce, tile


def _uses(region, var) -> bool:
    """Whether buffer region ``region`` is indexed by ``var``."""
    return any(var.same_as(v) for r in region.region for v in tirx.analysis.undefined_vars(r.min))
