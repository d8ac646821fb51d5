"""CPU rule: NCHW conv2d with groups 1, vectorized over output channels."""

from __future__ import annotations

import math

from tvm import s_tir
from tvm.s_tir.schedule import LoopRV, SBlockRV

from .base import OneReductionRule
from .loop_nest import (
    PARALLEL_CHUNKS,
    NotApplicable,
    Simd,
    accumulate_locally,
    extent,
    inline_plain_producers,
    largest_divisor,
    nest,
    read_index,
    refuse_grouped,
    unroll,
    vector_width,
)


def schedule_conv2d(
    sch: s_tir.Schedule, conv: SBlockRV, epilogue: SBlockRV | None, simd: Simd
) -> set[str]:
    """NCHW conv2d (groups = 1) vectorized over output channels.

    The tile is ``R`` vectors of output channels times ``T`` output pixels: per step of
    the reduction (input channel, kernel row, kernel column) it loads ``R`` weight
    vectors and ``T`` input scalars (broadcast) for ``R * T`` fused multiply-adds, at
    any stride. Weight vectors need the output channel innermost, so the kernel
    repacks the weights to ``[C_out / (R*V), C_in, KH, KW, R*V]`` as it runs (a copy
    of the weights, small beside the convolution's arithmetic).

    Returns the names of the producer blocks it placed: none, padding is left to the
    caller (the padded input is read by every block of output channels).
    """
    n, co, h, w, rc, ry, rx = nest(sch, conv, "SSSSRRR")
    stmt = sch.get(conv)
    weight = read_index(sch, conv, (1, 4, 5, 6))
    data = next(r for i, r in enumerate(stmt.reads) if i != weight)
    refuse_grouped(sch, conv, data)
    out_channels, height, width = extent(sch, co), extent(sch, h), extent(sch, w)
    # Detection heads have channel counts no power of two divides (SSD 84 and 126, YOLOv3
    # 255): their vectors take the largest divisor that fits a register (14, 15 lanes).
    lanes = vector_width(out_channels, simd)
    if lanes < 4:
        raise NotApplicable(f"{out_channels} output channels leave vectors of {lanes} lanes")
    rows = 2 if out_channels % (2 * lanes) == 0 else 1
    block_channels = rows * lanes
    # Half the registers accumulate: the rest hold weights, the broadcast input, addresses.
    max_pixels = simd.registers // 2 // rows
    pixels, across_rows = pixel_tile(height, width, max_pixels)
    if across_rows:
        w = sch.fuse(h, w)
        h = None

    # A copy of the input (padding by 0) is read in place; real padding is materialized
    # by the caller once.
    inlined = inline_plain_producers(sch, conv)
    packed = sch.cache_read(conv, weight, "global")
    sch.transform_layout(
        packed,
        ("write", 0),
        lambda o, i, kh, kw: (o // block_channels, i, kh, kw, o % block_channels),
    )
    write_back = accumulate_locally(sch, conv, epilogue)
    # The accumulator tile with the output channel innermost, as the vectors hold it.
    sch.transform_layout(
        conv,
        ("write", 0),
        lambda b, c, y, x: (b, c // block_channels, y, x, c % block_channels),
    )
    co_o, co_r, co_v = sch.split(co, [None, rows, lanes])
    w_o, w_i = sch.split(w, [None, pixels])
    spatial_outer = [n, co_o] + ([h] if h is not None else []) + [w_o]
    sch.reorder(*spatial_outer, rc, ry, rx, co_r, w_i, co_v)
    chunks = extent(sch, n) * extent(sch, co_o)
    if chunks >= PARALLEL_CHUNKS:
        # One thread per block of output channels: it repacks just its weights, just
        # before use, and sweeps the whole image with them.
        parallel = sch.fuse(n, co_o)
        tile = sch.fuse(*spatial_outer[2:]) if len(spatial_outer) > 3 else spatial_outer[2]
    else:
        parallel = tile = sch.fuse(*spatial_outer)
    sch.parallel(parallel)
    unroll(sch, co_r)
    unroll(sch, w_i)
    sch.vectorize(co_v)
    init = sch.decompose_reduction(conv, rc)
    init_loops = sch.get_loops(init)
    sch.vectorize(init_loops[-1])
    sch.reverse_compute_at(write_back, tile)
    # Stores along output rows: vectors gathered from the (unrolled) register tile.
    *_, tile_channel, tile_pixel = sch.get_loops(write_back)
    unroll(sch, tile_channel)
    sch.vectorize(tile_pixel)

    if chunks >= PARALLEL_CHUNKS:
        sch.compute_at(packed, parallel)
        o, *rest = sch.get_loops(packed)[1:]
    else:
        o, *rest = sch.get_loops(packed)
        o_outer, o = sch.split(o, [None, block_channels])
        sch.parallel(o_outer)
    _schedule_repack(sch, o, rest, simd)
    return inlined


def pixel_tile(height: int, width: int, max_pixels: int) -> tuple[int, bool]:
    """Output pixels per register tile, and whether the tile spans whole rows (the
    row and column loops fused): the most pixels of one row up to ``max_pixels``, or
    whole rows when rows are narrower than half a tile.

    A tile never holds part of a row and part of the next: TVM's region analysis then
    takes the tile to write whole rows, and the write-back redoes them per tile (VGG's
    38-wide 3x3 convs ran at 4 GFLOP/s in 4-pixel tiles across rows, 260 GFLOP/s in
    2-pixel tiles of one row).
    """
    pixels = largest_divisor(width, max_pixels)
    rows = largest_divisor(height, max_pixels // width) if 2 * width <= max_pixels else 1
    if pixels < max_pixels // 2 and rows > 1:
        return rows * width, True
    return pixels, False


def _schedule_repack(
    sch: s_tir.Schedule, channel: LoopRV, reduction: list[LoopRV], simd: Simd
) -> None:
    """Transpose weights ``[channel, reduction] -> [reduction, channel]``.

    1x1 kernels: a square of vectors at a time, contiguous loads along the input
    channels and every output channel of the tile unrolled (LLVM turns the strided
    stores into shuffles); gathering along the channel instead would hit one cache set
    per gather when a row of weights is a power of two bytes long. Larger kernels
    gather along the channel: their rows are 9 or 49 floats long, so the gathers
    spread over the cache, and the reduction axes cannot be fused into one
    contiguous axis without division in every index.
    """
    taps = math.prod(extent(sch, loop) for loop in reduction[1:])
    lanes = largest_divisor(extent(sch, reduction[0]), simd.lanes)
    if taps == 1 and lanes >= 4:
        outer, inner = sch.split(sch.fuse(*reduction), [None, lanes])
        sch.reorder(outer, channel, inner)
        unroll(sch, channel)
        sch.vectorize(inner)
    else:
        sch.reorder(*reduction, channel)
        sch.vectorize(channel)


class Conv2D(OneReductionRule):
    """Direct NCHW conv2d, groups 1: register tiles of output-channel vectors."""

    def schedule(self, sch, main, epilogue, simd):
        return schedule_conv2d(sch, main, epilogue, simd)
