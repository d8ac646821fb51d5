"""CPU rule: convolutions in a packed layout (``NCHW[x]c``), the kernels the graph
tuner's packed conv2d legalizes to (:mod:`edgecv.lowering.legalize`).

In ``NCHW[x]c`` the output channel block is the innermost axis of the output and of
the (pre-packed) weights, so the vectors of a register tile are plain loads and stores:
unlike :mod:`.conv2d`, nothing is repacked as the kernel runs.
"""

from __future__ import annotations

import math

from tvm import s_tir
from tvm.s_tir.schedule import LoopRV, SBlockRV

from .base import OneReductionRule
from .loop_nest import (
    NotApplicable,
    Simd,
    accumulate_locally,
    extent,
    iter_kinds,
    largest_divisor,
    unroll,
)

# The compute names of edgecv.lowering.legalize (not imported: the rules depend on TVM
# alone).
CONV2D = "conv2d_NCHWc"
DEPTHWISE = "depthwise_conv2d_NCHWc"


PREDICATED_COLUMNS = 8


def _pixels(height: int, width: int, cap: int) -> tuple[int, int]:
    """(rows, columns) of output pixels per tile, at most ``cap`` pixels: the most
    pixels, then the widest (row-contiguous input). Two-dimensional tiles serve narrow
    widths (7, 14) that leave few columns; a tile never spans part of a row and part
    of the next (TVM's region analysis then overestimates what a tile writes)."""
    cap = max(1, cap)
    best = (1, 1)
    for columns in range(1, min(width, cap) + 1):
        if width % columns:
            continue
        rows = largest_divisor(height, cap // columns)
        best = max(best, (rows * columns, columns), key=lambda t: (t[0], t[1]))
    pixels, columns = best
    if 2 * pixels < cap <= width:
        # a prime width (squeezenet's 109) leaves one pixel a tile: a tile of columns
        # instead, the last one of each row predicated. Predicated tiles run best at
        # PREDICATED_COLUMNS (benchmarks/results/cpu_packed_tiles-2026-11-25-zen5.md)
        return 1, min(cap, PREDICATED_COLUMNS)
    return pixels // columns, columns


def _tile_shape(simd: Simd, vectors: int, chunks: int, height: int, width: int):
    """(channel blocks, rows, columns) of a conv2d tile: the most accumulators that fit
    beside the tile's weight vectors, one broadcast input and a spare (more spill:
    benchmarks/results/cpu_packed_tiles-2026-11-23-avx2.md), more channel blocks on a
    tie (each broadcast then feeds more multiply-adds)."""
    best = (0, 0, 0, 0)
    for blocks in (1, 2) if vectors == 1 and chunks % 2 == 0 else (1,):
        per_pixel = vectors * blocks
        rows, columns = _pixels(height, width, (simd.registers - 2 - per_pixel) // per_pixel)
        best = max(best, (rows * columns * per_pixel, blocks, rows, columns))
    return best[1:]


def _vector(sch: s_tir.Schedule, lane_loop: LoopRV, simd: Simd) -> tuple[LoopRV, LoopRV, int]:
    """Split the channel-block axis into (registers, lanes): a block wider than one
    register takes several."""
    block = extent(sch, lane_loop)
    lanes = block if block <= simd.lanes else largest_divisor(block, simd.lanes)
    rows, vec = sch.split(lane_loop, [None, lanes])
    return rows, vec, block // lanes


# Bytes that stay in a core's cache between uses (half of a 1 MB L2, the smallest seen
# on the x86 hosts edgecv targets; ARM cores have less but also fewer channels).
CACHE_BYTES = 512 * 1024


def _rows_outer(sch: s_tir.Schedule, conv: SBlockRV, blocks: int) -> bool:
    """Whether threads should walk output rows outside output-channel blocks.

    Channel blocks outside re-read the whole input once per block of channels; rows
    outside re-read the whole weights once per row. Each costs nothing while the
    re-read tensor stays in cache; otherwise the smaller traffic wins.
    """
    stmt = sch.get(conv)
    data, weight = (r.source for r in stmt.reads[-2:]) if len(stmt.reads) >= 2 else (None, None)
    if data is None:
        return False
    nbytes = [math.prod(int(d) for d in b.shape) * b.dtype.bits // 8 for b in (data, weight)]
    out = stmt.writes[0].source
    chunks, rows = int(out.shape[1]) // blocks, int(out.shape[2])
    channels_outer = chunks * nbytes[0] if nbytes[0] > CACHE_BYTES else nbytes[0]
    rows_outer = rows * nbytes[1] if nbytes[1] > CACHE_BYTES else nbytes[1]
    return rows_outer < channels_outer


def schedule_conv2d_nchwc(
    sch: s_tir.Schedule,
    conv: SBlockRV,
    epilogue: SBlockRV | None,
    simd: Simd,
    pad_rows: bool = True,
) -> set[str]:
    """``conv2d_NCHWc``: a tile of ``P`` output pixels times one or two channel blocks.

    Per step of the reduction (input channel block, kernel row, kernel column, input
    channel lane) it loads the tile's weight vectors (contiguous in the packed weights)
    and broadcasts one input scalar per pixel, each feeding every weight vector. Threads
    split the batch, the output channel blocks and the output rows, in the order that
    re-reads less memory (:func:`_rows_outer`).

    The same nest without kernel axes (``SSSSSRR``: Winograd's products, whose batch axis
    is the tile position) takes the same tile; ``pad_rows`` False leaves its producers
    to the caller.
    """
    kinds = iter_kinds(sch, conv)
    if kinds not in ("SSSSSRRRR", "SSSSSRRR", "SSSSSRR"):
        raise NotApplicable(f"not a conv2d_NCHWc nest: {kinds}")
    n, co, h, w, lane, *reduction = sch.get_loops(conv)
    write_back = accumulate_locally(sch, conv, epilogue)
    lane_rows, lane_vec, vectors = _vector(sch, lane, simd)
    blocks, rows, columns = _tile_shape(
        simd, vectors, extent(sch, co), extent(sch, h), extent(sch, w)
    )
    rows_outer = _rows_outer(sch, conv, blocks)
    co_o, co_i = sch.split(co, [None, blocks])
    h_o, h_i = sch.split(h, [None, rows])
    w_o, w_i = sch.split(w, [None, columns])
    outer = [n, h_o, co_o] if rows_outer else [n, co_o, h_o]
    sch.reorder(*outer, w_o, *reduction, h_i, w_i, co_i, lane_rows, lane_vec)
    parallel = sch.fuse(*outer)
    sch.parallel(parallel)
    for loop in (h_i, w_i, co_i, lane_rows):
        unroll(sch, loop)
    sch.vectorize(lane_vec)
    init = sch.decompose_reduction(conv, reduction[0])
    sch.vectorize(sch.get_loops(init)[-1])
    sch.reverse_compute_at(write_back, w_o)
    _store_vectors(sch, write_back, simd)
    return _pad_rows(sch, conv) if pad_rows else set()


def schedule_depthwise_nchwc(
    sch: s_tir.Schedule, conv: SBlockRV, epilogue: SBlockRV | None, simd: Simd
) -> set[str]:
    """``depthwise_conv2d_NCHWc``: a tile of ``P`` output pixels times the channel
    block; per kernel tap, ``P`` input vectors and one weight vector."""
    if iter_kinds(sch, conv) != "SSSSSRR":
        raise NotApplicable("not a depthwise_conv2d_NCHWc nest")
    n, c, h, w, lane, ry, rx = sch.get_loops(conv)
    producers = list(sch.get_producers(conv))
    write_back = accumulate_locally(sch, conv, epilogue)
    lane_rows, lane_vec, vectors = _vector(sch, lane, simd)
    # Half the registers hold accumulators, half the input vectors a tap row shares
    # with the next taps. Accumulators in all but two (the weight, one input) spilled
    # or were reloaded (benchmarks/results/cpu_packed_tiles-2026-11-25-zen5.md).
    rows, columns = _pixels(extent(sch, h), extent(sch, w), simd.registers // (2 * vectors))
    h_o, h_i = sch.split(h, [None, rows])
    w_o, w_i = sch.split(w, [None, columns])
    # Threads take whole channel blocks: each pads just its block, while in cache.
    sch.reorder(n, c, h_o, w_o, ry, rx, h_i, w_i, lane_rows, lane_vec)
    parallel = sch.fuse(n, c)
    sch.parallel(parallel)
    for loop in (ry, rx, h_i, w_i, lane_rows):
        unroll(sch, loop)
    sch.vectorize(lane_vec)
    init = sch.decompose_reduction(conv, ry)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.reverse_compute_at(write_back, w_o)
    _store_vectors(sch, write_back, simd, depth=3)
    placed = set()
    for producer in producers:
        sch.compute_at(producer, parallel)
        _vector_lanes(sch, producer)
        placed.add(sch.get(producer).name_hint)
    return placed


def _vector_lanes(sch: s_tir.Schedule, producer: SBlockRV) -> None:
    """A padding nest copied a channel-block vector at a time: its condition is the
    same for every lane (the pad is spatial), so the copy is one vector load or a zero
    vector; element by element, the pad cost more than the stride-2 depthwise conv
    it fed (benchmarks/results/cpu_packed_padding-2026-11-24-zen5.md)."""
    sch.vectorize(sch.get_loops(producer)[-1])


def _pad_rows(sch: s_tir.Schedule, conv: SBlockRV) -> set[str]:
    """The padded input of a conv2d_NCHWc, materialized once with threads over its
    rows: a nest fused whole would divide the flat index on every element."""
    placed = set()
    for producer in sch.get_producers(conv):
        loops = sch.get_loops(producer)
        if len(loops) != 5:
            continue
        sch.parallel(sch.fuse(*loops[:3]))
        _vector_lanes(sch, producer)
        placed.add(sch.get(producer).name_hint)
    return placed


def _store_vectors(sch: s_tir.Schedule, write_back: SBlockRV, simd: Simd, depth: int = 2) -> None:
    """The tile written back (with the epilogue applied) in channel-block vectors; its
    loops are those under the ``depth`` loops that hold it (parallel, tile)."""
    *tile, lane = sch.get_loops(write_back)[depth:]
    rows, vec, _ = _vector(sch, lane, simd)
    for loop in (*tile, rows):
        unroll(sch, loop)
    sch.vectorize(vec)


class PackedConv2D(OneReductionRule):
    """conv2d and depthwise conv2d in ``NCHW[x]c`` (the graph tuner's packed convs)."""

    def schedule(self, sch, main, epilogue, simd):
        name = sch.get(main).name_hint
        if name.startswith(DEPTHWISE):
            return schedule_depthwise_nchwc(sch, main, epilogue, simd)
        if name.startswith(CONV2D):
            return schedule_conv2d_nchwc(sch, main, epilogue, simd)
        raise NotApplicable(f"{name} is no packed convolution")
