"""CPU schedules for convolution-shaped kernels: NCHW conv2d, sliding windows, dense.

Each function schedules one reduction block (with the producers and the fused
epilogue of its kernel) in a :class:`tvm.s_tir.Schedule`, or raises
:class:`NotApplicable` before changing anything it cannot finish, so the caller can try
another rule. The register tiles are sized from :class:`Simd`: the accumulators of a
tile stay in vector registers for the whole reduction, and each value loaded from
memory feeds several of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.schedule import LoopRV, SBlockRV
from tvm.target.codegen import target_has_features

# Below this many independent chunks a parallel loop balances badly over the cores
# (an odd chunk idles all but one core at the end), so split finer.
PARALLEL_CHUNKS = 8


class NotApplicable(Exception):
    """The schedule does not fit this kernel; the caller tries another one."""


@dataclass(frozen=True)
class Simd:
    """Vector registers of a CPU target: float32 lanes per register and their count."""

    lanes: int
    registers: int

    @classmethod
    def of(cls, target: tvm.target.Target) -> Simd:
        """The SIMD shape LLVM will generate code for (baseline x86-64 has SSE2 only)."""
        if target_has_features("avx512f", target):
            return cls(16, 32)
        if target_has_features("avx", target):
            return cls(8, 16)
        arm = target_has_features("neon", target) or target_has_features("asimd", target)
        return cls(4, 32 if arm else 16)


def extent(sch: s_tir.Schedule, loop: LoopRV) -> int:
    return int(sch.get(loop).extent)


def iter_kinds(sch: s_tir.Schedule, block: SBlockRV) -> str:
    """One letter per block iterator: S (spatial), R (reduction), O (other)."""
    kinds = {tirx.IterVar.DataPar: "S", tirx.IterVar.CommReduce: "R"}
    return "".join(kinds.get(iv.iter_type, "O") for iv in sch.get(block).iter_vars)


def largest_divisor(n: int, limit: int) -> int:
    """The largest divisor of ``n`` that is at most ``limit``."""
    return next(d for d in range(min(n, limit), 0, -1) if n % d == 0)


def vector_width(n: int, simd: Simd) -> int:
    """Lanes for a vectorized axis of extent ``n``: a full register if it divides ``n``,
    else a half one, else the largest divisor that fits one register."""
    for lanes in (simd.lanes, simd.lanes // 2):
        if lanes > 1 and n % lanes == 0:
            return lanes
    return largest_divisor(n, simd.lanes)


def _nest(sch: s_tir.Schedule, block: SBlockRV, kinds: str) -> list[LoopRV]:
    """The block's loops, one per iterator in order, or NotApplicable."""
    loops = sch.get_loops(block)
    if iter_kinds(sch, block) != kinds or len(loops) != len(kinds):
        raise NotApplicable(f"expected a {kinds} loop nest")
    return loops


def _read_index(sch: s_tir.Schedule, block: SBlockRV, pattern: Sequence[int]) -> int:
    """Which read of ``block`` is indexed exactly by its iterators ``pattern``."""
    stmt = sch.get(block)
    want = [stmt.iter_vars[i].var for i in pattern]
    for index, region in enumerate(stmt.reads):
        mins = [r.min for r in region.region]
        if len(mins) == len(want) and all(m.same_as(v) for m, v in zip(mins, want, strict=True)):
            return index
    raise NotApplicable("no operand indexed by the expected iterators")


def has_conditional(stmt: tirx.Stmt) -> bool:
    """Whether ``stmt`` contains an ``if_then_else`` (a guarded load, as in padding)."""
    found = []
    if_then_else = tvm.ir.Op.get("prim.if_then_else")

    def visit(call: tvm.ir.expr.Call) -> None:
        if call.op.same_as(if_then_else):
            found.append(call)

    tvm_ffi.structural_walk(stmt, (tvm.ir.expr.Call, visit), order="post")
    return bool(found)


def _uses(expr_list: Sequence[tirx.Expr], var: tirx.Var) -> bool:
    return any(var.same_as(v) for e in expr_list for v in tirx.analysis.undefined_vars(e))


def _accumulate_locally(sch: s_tir.Schedule, block: SBlockRV, epilogue: SBlockRV | None):
    """Accumulate in a local buffer (registers once unrolled); the elementwise epilogue
    (bias, BatchNorm, activation, residual add) runs on each tile as it is written back."""
    write_back = sch.cache_write(block, 0, "local")
    if epilogue is not None:
        sch.reverse_compute_inline(epilogue)
    return write_back


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
    n, co, h, w, rc, ry, rx = _nest(sch, conv, "SSSSRRR")
    stmt = sch.get(conv)
    weight = _read_index(sch, conv, (1, 4, 5, 6))
    data = next(r for i, r in enumerate(stmt.reads) if i != weight)
    if _uses([r.min for r in data.region], stmt.iter_vars[1].var):
        raise NotApplicable("grouped convolution: input channels depend on the output channel")
    out_channels, height, width = extent(sch, co), extent(sch, h), extent(sch, w)
    lanes = simd.lanes
    if out_channels % lanes:
        raise NotApplicable(f"{out_channels} output channels are no multiple of {lanes}")
    rows = 2 if out_channels % (2 * lanes) == 0 else 1
    block_channels = rows * lanes
    # Half the registers accumulate: the rest hold weights, the broadcast input, addresses.
    max_pixels = simd.registers // 2 // rows
    pixels = largest_divisor(width, max_pixels)
    if pixels < max_pixels // 2:  # narrow or prime width: let tiles run across rows
        w = sch.fuse(h, w)
        pixels = largest_divisor(height * width, max_pixels)
        h = None

    # A copy of the input (padding by 0) is read in place; real padding is materialized
    # by the caller once, as conditional loads in the inner loop would cost more.
    inlined = set()
    for producer in sch.get_producers(conv):
        if not has_conditional(sch.get(producer)):
            inlined.add(sch.get(producer).name_hint)
            sch.compute_inline(producer)
    packed = sch.cache_read(conv, weight, "global")
    sch.transform_layout(
        packed,
        ("write", 0),
        lambda o, i, kh, kw: (o // block_channels, i, kh, kw, o % block_channels),
    )
    write_back = _accumulate_locally(sch, conv, epilogue)
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
    sch.unroll(co_r)
    sch.unroll(w_i)
    sch.vectorize(co_v)
    init = sch.decompose_reduction(conv, rc)
    init_loops = sch.get_loops(init)
    sch.vectorize(init_loops[-1])
    sch.reverse_compute_at(write_back, tile)
    # Stores along output rows: vectors gathered from the (unrolled) register tile.
    *_, tile_channel, tile_pixel = sch.get_loops(write_back)
    sch.unroll(tile_channel)
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
        sch.unroll(channel)
        sch.vectorize(inner)
    else:
        sch.reorder(*reduction, channel)
        sch.vectorize(channel)


def schedule_window(
    sch: s_tir.Schedule, block: SBlockRV, epilogue: SBlockRV | None, simd: Simd
) -> set[str]:
    """A reduction over a window of each output pixel, vectorized along output rows.

    Depthwise and grouped convolutions and pooling: the reduction (kernel taps, the
    input channels of a group) runs outside a tile of ``rows`` output rows times one
    vector of output columns. Threads split the outer axes (batch and channels); each
    pads only the input channels it reads, while they are in cache.

    Returns the names of the producer blocks it placed (the others are the caller's).
    """
    kinds = iter_kinds(sch, block)
    spatial = len(kinds.rstrip("R"))
    if spatial < 3 or spatial == len(kinds) or "R" in kinds[:spatial]:
        raise NotApplicable(f"no window reduction over an image: {kinds}")
    loops = _nest(sch, block, kinds)
    outer, (h, w), reduce_ = loops[: spatial - 2], loops[spatial - 2 : spatial], loops[spatial:]
    lanes = vector_width(extent(sch, w), simd)
    if lanes < 4:
        raise NotApplicable(f"output width {extent(sch, w)} leaves no vector")
    producers = list(sch.get_producers(block))
    write_back = _accumulate_locally(sch, block, epilogue)
    w_o, w_i = sch.split(w, [None, lanes])
    # Two rows per tile reuse each loaded input row for two output rows (3x3, stride 1).
    rows = 2 if extent(sch, h) % 2 == 0 else 1
    h_o, h_i = sch.split(h, [None, rows])
    sch.reorder(*outer, h_o, w_o, *reduce_, h_i, w_i)
    parallel = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    sch.parallel(parallel)
    for loop in (*reduce_, h_i):
        if extent(sch, loop) <= 16:
            sch.unroll(loop)
    sch.vectorize(w_i)
    init = sch.decompose_reduction(block, reduce_[0])
    sch.vectorize(sch.get_loops(init)[-1])
    sch.reverse_compute_at(write_back, w_o)
    sch.vectorize(sch.get_loops(write_back)[-1])
    placed = set()
    for producer in reversed(producers):
        try:
            sch.compute_at(producer, parallel)
        except Exception:  # not a per-channel producer: the caller schedules it apart
            continue
        placed.add(sch.get(producer).name_hint)
    return placed


def schedule_dense(
    sch: s_tir.Schedule, block: SBlockRV, epilogue: SBlockRV | None, simd: Simd
) -> set[str]:
    """``out[i, j] = sum_k x[i, k] * w[k, j]``, vectorized over ``j``.

    At batch 1 this is a matrix-vector product bound by reading ``w`` once: each thread
    takes a few vectors of outputs and streams their columns of ``w`` row by row.
    """
    i, j, k = _nest(sch, block, "SSR")
    _read_index(sch, block, (2, 1))  # w[k, j]: contiguous along the vectorized j
    outputs = extent(sch, j)
    lanes = vector_width(outputs, simd)
    if lanes < 4:
        raise NotApplicable(f"{outputs} outputs leave no vector")
    vectors = largest_divisor(outputs // lanes, simd.registers // 4)
    write_back = _accumulate_locally(sch, block, epilogue)
    j_o, j_r, j_v = sch.split(j, [None, vectors, lanes])
    sch.reorder(i, j_o, k, j_r, j_v)
    parallel = sch.fuse(i, j_o)
    sch.parallel(parallel)
    sch.unroll(j_r)
    sch.vectorize(j_v)
    init = sch.decompose_reduction(block, k)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.reverse_compute_at(write_back, parallel)
    sch.vectorize(sch.get_loops(write_back)[-1])
    return set()
