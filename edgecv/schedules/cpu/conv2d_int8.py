"""CPU rule: INT8 convolution (uint8 data x int8 weights -> int32) on the CPU's
dot-product instructions, through TVM tensor intrinsics.

The INT8 step of the CPU pipeline (:mod:`edgecv.pipelines.int8`) leaves NCHW
convolutions ``conv2d(uint8, int8, out_dtype=int32)`` with their requantization,
BatchNorm, activation and the next layer's quantization fused after them. Which
instruction a target has, and why it takes 7-bit weights or data, is
:mod:`.dot_product`; the intrinsics on it are :mod:`.tensor_intrin`.

The schedule is :mod:`.conv2d`'s register tile with the input channel split in fours:
the data is repacked ``[N, C/4, H, W, 4]`` (the padding written straight into that
layout when there is any), the weights ``[O/L, C/4, KH, KW, L, 4]`` (at build time by
the legalization, :func:`edgecv.lowering.legalize.conv2d_int8_packed`, for a deploy;
else as the kernel runs: packing at build time took MobileNet1.0 from 0.90x to 1.01x of
FP32's speed, ResNet-50 from 0.95x to 1.20x), and the
innermost ``L x 4`` multiply-accumulate of each (output channels, input channels) step
is replaced by the intrinsic. Depthwise convolutions, signed (int8) inputs and channel
counts that do not divide stay with the generic rules (the INT8 step gives the small
ones exact float32 arithmetic instead: :mod:`edgecv.pipelines.int8`).
"""

from __future__ import annotations

from tvm import s_tir
from tvm.s_tir.schedule import SBlockRV

from .base import OneReductionRule
from .conv2d import pixel_tile
from .conv2d_packed import _pad_rows, _rows_outer, _store_vectors
from .dot_product import DotProduct, dot_product_of
from .loop_nest import (
    PARALLEL_CHUNKS,
    NotApplicable,
    Simd,
    accumulate_locally,
    extent,
    has_conditional,
    inline_plain_producers,
    iter_kinds,
    largest_divisor,
    nest,
    read_index,
    refuse_grouped,
    unroll,
)
from .tensor_intrin import register_intrinsics


def _tile(out_channels: int, lanes: int, height: int, width: int, simd: Simd):
    """(output-channel vectors, pixels, whether the pixels span whole rows) of the
    register tile: the most accumulators within half the registers, then the fewest
    loads per step (vectors of weights + broadcast pixels). Late layers have narrow
    rows: at 7x7, 2 vectors x 1 pixel reads every weight once per pixel, where 1 vector
    x 7 pixels reuses each 7 times (benchmarks/results/int8_cpu-2026-11-26-zen3.md)."""
    budget = simd.registers // 2
    best = None
    for rows in (4, 2, 1):
        if out_channels % (rows * lanes) or rows > budget:
            continue
        pixels, across_rows = pixel_tile(height, width, budget // rows)
        key = (rows * pixels, -(rows + pixels))
        if best is None or key > best[0]:
            best = (key, rows, pixels, across_rows)
    return best[1:]


def schedule_conv2d_int8(
    sch: s_tir.Schedule, conv: SBlockRV, epilogue: SBlockRV | None, simd: Simd, dot: DotProduct
) -> set[str]:
    """A uint8 x int8 NCHW conv2d (groups 1) on the dot-product intrinsic ``dot``.

    Returns the names of the producers it placed (the padding, written in the packed
    layout inside this kernel)."""
    n, co, h, w, rc, ry, rx = nest(sch, conv, "SSSSRRR")
    stmt = sch.get(conv)
    # weights packed [O/L, I/4, KH, KW, L, 4] at build time (edgecv.lowering.legalize,
    # conv2d_int8) or plain OIHW, repacked here as the kernel runs
    prepacked = [i for i, r in enumerate(stmt.reads) if len(r.region) == 6]
    if prepacked:
        weight = prepacked[0]
        if int(stmt.reads[weight].source.shape[4]) != dot.lanes:
            raise NotApplicable("weights packed for another vector width")
    else:
        weight = read_index(sch, conv, (1, 4, 5, 6))
    data_index = next(i for i in range(len(stmt.reads)) if i != weight)
    data = stmt.reads[data_index]
    dtypes = (
        str(data.source.dtype),
        str(stmt.reads[weight].source.dtype),
        str(stmt.writes[0].source.dtype),
    )
    if dtypes != ("uint8", "int8", "int32"):
        raise NotApplicable(f"operands {dtypes}, not uint8 x int8 -> int32")
    refuse_grouped(sch, conv, data)
    out_channels, in_channels = extent(sch, co), extent(sch, rc)
    lanes = dot.lanes
    if out_channels % lanes or in_channels % 4:
        raise NotApplicable(f"{out_channels} -> {in_channels} channels: not in {lanes}s and 4s")
    rows, pixels, across_rows = _tile(out_channels, lanes, extent(sch, h), extent(sch, w), simd)
    block_channels = rows * lanes
    if across_rows:
        w = sch.fuse(h, w)
        h = None

    placed = inline_plain_producers(sch, conv)
    pad = [p for p in sch.get_producers(conv) if has_conditional(sch.get(p))]
    to_quads = lambda b, c, y, x: (b, c // 4, y, x, c % 4)  # noqa: E731
    data_index = next(
        i for i, r in enumerate(sch.get(conv).reads) if str(r.source.dtype) == "uint8"
    )
    if pad:  # the padding writes the packed layout directly: one pass over the input
        packed_data = pad[0]
        sch.transform_layout(packed_data, ("write", 0), to_quads)
    else:
        packed_data = sch.cache_read(conv, data_index, "global")
        sch.transform_layout(packed_data, ("write", 0), to_quads)
    packed_weight = None
    if not prepacked:
        weight = next(i for i, r in enumerate(sch.get(conv).reads) if str(r.source.dtype) == "int8")
        packed_weight = sch.cache_read(conv, weight, "global")
        sch.transform_layout(
            packed_weight,
            ("write", 0),
            lambda o, i, kh, kw: (o // lanes, i // 4, kh, kw, o % lanes, i % 4),
        )
    write_back = accumulate_locally(sch, conv, epilogue)
    sch.transform_layout(
        conv,
        ("write", 0),
        lambda b, c, y, x: (b, c // block_channels, y, x, c % block_channels),
    )
    co_o, co_r, co_v = sch.split(co, [None, rows, lanes])
    rc_o, rc_i = sch.split(rc, [None, 4])
    w_o, w_i = sch.split(w, [None, pixels])
    spatial_outer = [n, co_o] + ([h] if h is not None else []) + [w_o]
    sch.reorder(*spatial_outer, rc_o, ry, rx, co_r, w_i, co_v, rc_i)
    chunks = extent(sch, n) * extent(sch, co_o)
    if chunks >= PARALLEL_CHUNKS:
        parallel = sch.fuse(n, co_o)
        tile = sch.fuse(*spatial_outer[2:]) if len(spatial_outer) > 3 else spatial_outer[2]
    else:
        parallel = tile = sch.fuse(*spatial_outer)
    sch.parallel(parallel)
    unroll(sch, co_r)
    unroll(sch, w_i)
    init = sch.decompose_reduction(conv, rc_o)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.reverse_compute_at(write_back, tile)
    *_, tile_channel, tile_pixel = sch.get_loops(write_back)
    unroll(sch, tile_channel)
    sch.vectorize(tile_pixel)

    # the repacked operands: the weights per block of output channels, in the thread
    # that uses them; the data once, every thread a share of its rows
    if packed_weight is not None:
        _schedule_weight_repack(sch, packed_weight, parallel, chunks, lanes)
    loops = sch.get_loops(packed_data)
    sch.parallel(sch.fuse(*loops[:2]))
    placed.add(sch.get(packed_data).name_hint)
    register_intrinsics()
    sch.tensorize(co_v, dot.intrinsic)  # last: the loops it replaces are gone after it
    return placed


def _schedule_weight_repack(sch, packed_weight, parallel, chunks: int, lanes: int) -> None:
    """OIHW weights repacked as the kernel runs (when they were not at build time)."""
    if chunks >= PARALLEL_CHUNKS:
        sch.compute_at(packed_weight, parallel)
        inner = sch.get_loops(packed_weight)[1:]
    else:
        first, *inner = sch.get_loops(packed_weight)
        sch.parallel(first)
    # L x 4 weights are contiguous in the packed layout: one vector per step (the
    # loops compute_at leaves may be fused longer: vectorized whole, LLVM took 110 s
    # over a 8192-lane vector)
    _, vector = sch.split(sch.fuse(*inner) if len(inner) > 1 else inner[0], [None, 4 * lanes])
    sch.vectorize(vector)


# the compute name of edgecv.lowering.legalize.conv2d_int8_nchwc
PACKED = "conv2d_int8_NCHWc"


def _packed_tile(simd: Simd, chunks: int, height: int, width: int) -> tuple[int, int, int]:
    """(channel blocks, rows, columns) of a packed INT8 tile: the most int32
    accumulators beside the tile's weight vectors, the broadcast input and the two
    registers the product steps need (``vpmaddubsw``'s int16 pairs, the ones of
    ``vpmaddwd``); more channel blocks on a tie."""
    best = (0, 0, 0, 0)
    for blocks in (1, 2) if chunks % 2 == 0 else (1,):
        cap = (simd.registers - 3 - blocks) // blocks
        for columns in range(1, min(width, cap) + 1):
            # whole tiles only: a predicated tile leaves the intrinsic's loads and
            # stores guarded element by element, several times slower
            # (benchmarks/results/int8_cpu-2026-11-26-zen3.md, register tiles)
            if width % columns == 0:
                rows = largest_divisor(height, cap // columns)
                best = max(best, (rows * columns * blocks, blocks, rows, columns))
    return best[1:]


def schedule_conv2d_int8_nchwc(
    sch: s_tir.Schedule, conv: SBlockRV, epilogue: SBlockRV | None, simd: Simd, dot: DotProduct
) -> set[str]:
    """``conv2d_int8_NCHWc`` (:func:`edgecv.lowering.legalize.conv2d_int8_nchwc`): the
    register tile of :func:`.conv2d_packed.schedule_conv2d_nchwc` (output pixels times
    one or two channel blocks, threads over blocks and rows) with each step's
    ``L x 4`` multiply-accumulate on the dot-product intrinsic. Data, weights and
    output are already in the layouts the instruction reads: nothing is repacked."""
    kinds = iter_kinds(sch, conv)
    if kinds not in ("SSSSSRRRRR", "SSSSSRRRRRR"):
        raise NotApplicable("not a conv2d_int8_NCHWc nest")

    stmt = sch.get(conv)
    dtypes = tuple(str(r.source.dtype) for r in stmt.reads[-2:]) + (
        str(stmt.writes[0].source.dtype),
    )
    if dtypes != ("uint8", "int8", "int32"):
        raise NotApplicable(f"operands {dtypes}, not uint8 x int8 -> int32")
    # weights packed in pairs of steps (int8_pairs) add the step of the pair
    n, co, h, w, lane, rco, ry, rx, rcq, *step, rc4 = sch.get_loops(conv)
    if step and dot.pairs is None:
        raise NotApplicable("weights packed in pairs: this CPU's dot product has no int16 step")
    if extent(sch, lane) != dot.lanes or extent(sch, rc4) != 4:
        raise NotApplicable(f"a block of {extent(sch, lane)} channels, not {dot.lanes}")
    write_back = accumulate_locally(sch, conv, epilogue)
    blocks, rows, columns = _packed_tile(simd, extent(sch, co), extent(sch, h), extent(sch, w))
    rows_outer = _rows_outer(sch, conv, blocks)
    co_o, co_i = sch.split(co, [None, blocks])
    h_o, h_i = sch.split(h, [None, rows])
    w_o, w_i = sch.split(w, [None, columns])
    outer = [n, h_o, co_o] if rows_outer else [n, co_o, h_o]
    inner = [*step, lane, rc4]
    sch.reorder(*outer, w_o, rco, ry, rx, rcq, h_i, w_i, co_i, *inner)
    parallel = sch.fuse(*outer)
    sch.parallel(parallel)
    for loop in (h_i, w_i, co_i):
        unroll(sch, loop)
    init = sch.decompose_reduction(conv, rco)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.reverse_compute_at(write_back, w_o)
    _store_vectors(sch, write_back, simd)
    placed = _pad_rows(sch, conv)
    # last: the loops it replaces are gone after it
    register_intrinsics()
    sch.tensorize(inner[0], dot.pairs if step else dot.intrinsic)
    return placed


class Conv2DInt8(OneReductionRule):
    """uint8 x int8 NCHW conv2d on the target's dot-product instructions."""

    def apply(self, func, target, tunable):
        dot = dot_product_of(target)
        if dot is None:
            return None
        # the intrinsics are registered by the schedule of a kernel that is this rule's,
        # just before it tensorizes: each kernel of a deploy is scheduled in a forked
        # child, which registered them anew (seconds of TVMScript parsing) for every
        # float kernel that came this far down the rules
        self._dot = dot
        return super().apply(func, target, tunable)

    def schedule(self, sch, main, epilogue, simd):
        if sch.get(main).name_hint.startswith(PACKED):
            return schedule_conv2d_int8_nchwc(sch, main, epilogue, simd, self._dot)
        return schedule_conv2d_int8(sch, main, epilogue, simd, self._dot)
