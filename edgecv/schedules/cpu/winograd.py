"""CPU rule: Winograd convolution in the packed layout, the kernel
:mod:`edgecv.lowering.winograd` legalizes a stride-1 3x3 packed conv2d to.

Four nests, each in parallel over its own outer axes:

- the padded input, rows in parallel, channel blocks in vectors;
- the input transform: per tile and channel block, its two halves one after the
  other, every position unrolled (each position's ``Select`` folds to its sum), the
  channel block in vectors;
- the products: the register tile of a 1x1 ``conv2d_NCHWc``
  (:func:`.conv2d_packed.schedule_conv2d_nchwc`), one product per position;
- the output transform with the fused epilogue: per tile, the first half, then its
  ``m x m`` pixels, unrolled, the channel block in vectors.
"""

from __future__ import annotations

from tvm import s_tir
from tvm.s_tir import dlight
from tvm.s_tir.schedule import SBlockRV

from ..common.winograd import GEMM, INPUT, INPUT_ROWS, NAMES, OUTPUT, OUTPUT_COLS, take_epilogue
from .conv2d_packed import _vector, _vector_lanes, schedule_conv2d_nchwc
from .loop_nest import NotApplicable, Simd, extent, unroll


class Winograd(dlight.ScheduleRule):
    """The kernels holding a ``winograd_gemm`` block."""

    def apply(self, func, target, tunable):
        sch = s_tir.Schedule(func)
        blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
        names = [sch.get(b).name_hint for b in blocks]
        if any(name not in names for name in NAMES):
            return None
        simd = Simd.of(target)
        try:
            if not take_epilogue(sch, blocks, names):
                return None
            gemm = sch.get_sblock(GEMM)
            side = _side(sch, gemm)
            schedule_conv2d_nchwc(sch, gemm, None, simd, pad_rows=False)
            _schedule_input(sch, sch.get_sblock(INPUT), sch.get_sblock(INPUT_ROWS), simd)
            _schedule_output(sch, sch.get_sblock(OUTPUT), sch.get_sblock(OUTPUT_COLS), side, simd)
            for name in names[: names.index(INPUT_ROWS)]:
                _schedule_pad(sch, sch.get_sblock(name))
        except NotApplicable:
            return None
        return sch


def _side(sch: s_tir.Schedule, gemm: SBlockRV) -> int:
    """``m``, the side of an output tile: ``a * a`` positions with ``a = m + 2``."""
    positions = int(sch.get(gemm).writes[0].source.shape[0])
    alpha = round(positions**0.5)
    if alpha * alpha != positions or alpha < 3:
        raise NotApplicable(f"{positions} positions is no square Winograd tile")
    return alpha - 2


def _schedule_input(sch: s_tir.Schedule, block: SBlockRV, half: SBlockRV, simd: Simd) -> None:
    """Per tile (and channel block), its first half-transform then the second, each
    position unrolled, the channel block in vectors."""
    t, c, row, col, lane = sch.get_loops(block)
    sch.reorder(c, row, col, t, lane)
    sch.parallel(sch.fuse(c, row))
    sch.compute_at(half, col)
    sch.set_scope(half, 0, "local")  # one tile's half: on the stack, not a workspace
    _unrolled_vectors(sch, half, 2, simd)
    _unrolled_vectors(sch, block, 1, simd)


def _unrolled_vectors(sch: s_tir.Schedule, block: SBlockRV, positions: int, simd: Simd) -> None:
    """The block's last ``positions`` loops before the channel lanes unrolled (their
    ``Select`` folds), the lanes in vectors."""
    *_, lane = loops = sch.get_loops(block)
    for loop in loops[-1 - positions : -1]:
        sch.unroll(loop)
    lane_rows, vec, _ = _vector(sch, lane, simd)
    unroll(sch, lane_rows)
    sch.vectorize(vec)


def _schedule_output(
    sch: s_tir.Schedule, block: SBlockRV, half: SBlockRV, side: int, simd: Simd
) -> None:
    """Per output tile (and channel block): its first half-transform, then its
    ``side x side`` pixels with the epilogue, each unrolled, the channel block in
    vectors."""
    n, o, y, x, lane = sch.get_loops(block)
    if extent(sch, y) < side or extent(sch, x) < side:
        raise NotApplicable("output smaller than one tile")
    y_o, y_i = sch.split(y, [None, side])
    x_o, x_i = sch.split(x, [None, side])
    sch.reorder(n, o, y_o, x_o, y_i, x_i, lane)
    sch.parallel(sch.fuse(n, o, y_o))
    sch.compute_at(half, x_o)
    sch.set_scope(half, 0, "local")
    _unrolled_vectors(sch, half, 2, simd)
    _unrolled_vectors(sch, block, 2, simd)


def _schedule_pad(sch: s_tir.Schedule, block: SBlockRV) -> None:
    loops = sch.get_loops(block)
    if len(loops) == 5:
        sch.parallel(sch.fuse(*loops[:3]))
        _vector_lanes(sch, block)


__all__ = ["Winograd"]
