"""CPU rule: depthwise and grouped convolutions, pooling and other reductions over a
window of each output pixel (a user's conv-like kernel), along output rows."""

from __future__ import annotations

from tvm import s_tir
from tvm.s_tir.schedule import SBlockRV

from .base import OneReductionRule
from .loop_nest import (
    NotApplicable,
    Simd,
    accumulate_locally,
    extent,
    iter_kinds,
    largest_divisor,
    nest,
    unroll,
    uses,
    vector_width,
)

# Reduction steps unrolled under a register tile of several vectors: beyond this, the
# unrolled body outgrows the instruction cache for no gain.
TILE_UNROLL = 64


def schedule_window(
    sch: s_tir.Schedule, block: SBlockRV, epilogue: SBlockRV | None, simd: Simd
) -> set[str]:
    """A reduction over a window of each output pixel, vectorized along output rows.

    Depthwise and grouped convolutions and pooling: the reduction (kernel taps, the
    input channels of a group) runs outside a tile of ``rows`` output rows times one
    vector of output columns. Threads split the outer axes (batch and channels); each
    pads only the input channels it reads, while they are in cache. Outer axes that the
    operands read along the width do not depend on (:func:`reuse_axes`) are tiled in
    registers too.

    Returns the names of the producer blocks it placed (the others are the caller's).
    """
    kinds = iter_kinds(sch, block)
    spatial = len(kinds.rstrip("R"))
    if spatial < 3 or spatial == len(kinds) or "R" in kinds[:spatial]:
        raise NotApplicable(f"no window reduction over an image: {kinds}")
    loops = nest(sch, block, kinds)
    outer, (h, w), reduce_ = loops[: spatial - 2], loops[spatial - 2 : spatial], loops[spatial:]
    lanes = vector_width(extent(sch, w), simd)
    if lanes < 4:
        raise NotApplicable(f"output width {extent(sch, w)} leaves no vector")
    reuse = reuse_axes(sch, block, spatial)
    producers = list(sch.get_producers(block))
    write_back = accumulate_locally(sch, block, epilogue)
    w_o, w_i = sch.split(w, [None, lanes])
    # Two rows per tile reuse each loaded input row for two output rows (3x3, stride 1).
    rows = 2 if extent(sch, h) % 2 == 0 else 1
    h_o, h_i = sch.split(h, [None, rows])
    # Outer axes the vector-loaded operands do not depend on (a capsule conv's output
    # capsules and pose columns) join the register tile: each loaded input vector
    # then feeds one FMA per tile entry, as a dense conv's output channels do. Half
    # the registers accumulate; depthwise convs and pooling have no such axis.
    budget = simd.registers // 2 // rows
    tile = []
    for index in reversed(reuse):
        size = largest_divisor(extent(sch, outer[index]), budget)
        if size > 1:
            outer[index], inner = sch.split(outer[index], [None, size])
            tile.insert(0, inner)
            budget //= size
    sch.reorder(*outer, h_o, w_o, *reduce_, *tile, h_i, w_i)
    parallel = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    sch.parallel(parallel)
    if tile:
        steps = 1  # the innermost reduction loops, up to TILE_UNROLL steps in all
        for loop in reversed(reduce_):
            steps *= extent(sch, loop)
            if steps > TILE_UNROLL:
                break
            unroll(sch, loop)
        for loop in (*tile, h_i):
            unroll(sch, loop)
    else:
        for loop in (*reduce_, h_i):
            if extent(sch, loop) <= 16:
                unroll(sch, loop)
    sch.vectorize(w_i)
    init = sch.decompose_reduction(block, reduce_[0])
    sch.vectorize(sch.get_loops(init)[-1])
    sch.reverse_compute_at(write_back, w_o)
    sch.vectorize(sch.get_loops(write_back)[-1])
    lane_extent = int(sch.get(block).writes[0].source.shape[-1])
    placed = set()
    for producer in reversed(producers):
        try:
            sch.compute_at(producer, parallel)
        except Exception:  # not a per-channel producer: the caller schedules it apart
            continue
        innermost = sch.get_loops(producer)[-1]
        if spatial == 5 and extent(sch, innermost) == lane_extent <= 4 * simd.lanes:
            # NCHW[x]c: the padding's condition is the same for every lane of the channel
            # block (the innermost axis, never padded), so it copies vectors (element by
            # element it took most of the pool's time:
            # benchmarks/results/packed_max_pool-2026-11-24.md)
            sch.vectorize(innermost)
        placed.add(sch.get(producer).name_hint)
    return placed


def reuse_axes(sch: s_tir.Schedule, block: SBlockRV, spatial: int) -> list[int]:
    """The outer spatial axes (all but the last two) that no operand read along the
    output width depends on: the axes along which a loaded input vector can be reused."""
    stmt = sch.get(block)
    width = stmt.iter_vars[spatial - 1].var
    out = stmt.writes[0].source  # a reduction reads its accumulator too
    streamed = [
        r
        for r in stmt.reads
        if not r.source.same_as(out) and uses([x.min for x in r.region], width)
    ]
    if not streamed:
        return []
    return [
        i
        for i in range(spatial - 2)
        if not any(uses([x.min for x in r.region], stmt.iter_vars[i].var) for r in streamed)
    ]


class Window(OneReductionRule):
    """A reduction over a window of each output pixel (depthwise/grouped conv, pooling)."""

    def schedule(self, sch, main, epilogue, simd):
        return schedule_window(sch, main, epilogue, simd)
