"""Winograd convolution in the packed layout on OpenCL and CUDA: the kernel
:mod:`edgecv.lowering.winograd` legalizes a stride-1 3x3 packed conv2d to.

Three launches, in each the channel lanes on the first work-item axis (Intel's CPU
runtime turns them into vector lanes; a GPU reads them as one coalesced row):

- the input transform: a work-item per tile and lane, the padding read in place, the
  tile's first half-transform in registers, then its ``a x a`` positions, unrolled
  (each position's ``Select`` folds to its sum);
- the products: ``a * a`` matrix products in the shape of a 1x1 packed conv, scheduled
  as one (:func:`.conv2d_packed.schedule_tile`);
- the output transform with the fused epilogue: a work-item per output tile and lane,
  the first half in registers, then its ``m x m`` pixels.

The transformed input and the products live in device workspaces the runtime
allocates once per launch step.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.target import Target

from ..common.winograd import GEMM, INPUT, INPUT_ROWS, NAMES, OUTPUT, OUTPUT_COLS, take_epilogue
from .base import GPURule, extent, max_threads, work_items
from .conv2d_packed import TILES, Tile, schedule_tile, tile_fitter

GROUP = 128  # work-items per group (at most) in the transforms


class Winograd(GPURule):
    """The kernels holding a ``winograd_gemm`` block. ``tunable``: the schedules of every
    tile of the products (:data:`.conv2d_packed.TILES`), the default's first."""

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool):
        if not tunable:
            return self._tiled(func, target, Tile())
        return self.variants(func, target, Tile(), TILES, self._tiled, self._fitter(func, target))

    def _fitter(self, func: tirx.PrimFunc, target: Target):
        """The products' tile fitter (:func:`.conv2d_packed.tile_fitter`): the tile is
        all that differs between the variants, the transforms' schedules are the same."""
        started = self.start(func, target)
        if started is None:
            return None
        sch, found, _ = started
        if GEMM not in [sch.get(b).name_hint for b in found]:
            return None
        try:
            return tile_fitter(sch, sch.get_sblock(GEMM), target, False)
        except ValueError:
            return None

    def _tiled(self, func: tirx.PrimFunc, target: Target, tile: Tile) -> s_tir.Schedule | None:
        started = self.start(func, target)
        if started is None:
            return None
        sch, found, _ = started
        names = [sch.get(b).name_hint for b in found]
        if any(name not in names for name in NAMES) or not take_epilogue(sch, found, names):
            return None
        for block in found[: names.index(INPUT_ROWS)]:  # the padding: read in place
            sch.compute_inline(block)
        gemm = sch.get_sblock(GEMM)
        side = _side(sch, gemm)
        if side is None:
            return None
        limit = min(max_threads(target), GROUP)
        schedule_tile(sch, gemm, None, target, False, tile)
        _transform(sch, sch.get_sblock(INPUT), sch.get_sblock(INPUT_ROWS), None, limit)
        _transform(sch, sch.get_sblock(OUTPUT), sch.get_sblock(OUTPUT_COLS), side, limit)
        return sch


def _side(sch: s_tir.Schedule, gemm) -> int | None:
    """``m``, the side of an output tile: ``a * a`` positions with ``a = m + 2``."""
    positions = int(sch.get(gemm).writes[0].source.shape[0])
    alpha = round(positions**0.5)
    return alpha - 2 if alpha * alpha == positions and alpha >= 3 else None


def _transform(sch: s_tir.Schedule, block, half, side: int | None, limit: int) -> None:
    """A transform nest: work-items over its tiles (times the channel lanes), each
    computing its tile's half-transform in registers, then its positions unrolled.

    The input transform (``side`` None) has loops ``position, channel block, tile row,
    tile column, lane``; the output transform ``n, channel block, y, x, lane``, split
    into tiles of ``side``."""
    if side is None:
        position, c, row, col, lane = sch.get_loops(block)
        sch.reorder(c, row, col, lane, position)
        tiles, inner = sch.fuse(c, row, col), [position]
    else:
        n, c, y, x, lane = sch.get_loops(block)
        y_o, y_i = sch.split(y, [None, side])
        x_o, x_i = sch.split(x, [None, side])
        sch.reorder(n, c, y_o, x_o, lane, y_i, x_i)
        tiles, inner = sch.fuse(n, c, y_o, x_o), [y_i, x_i]
    lanes = extent(sch, lane)
    group, items = sch.split(tiles, [None, work_items(extent(sch, tiles), max(1, limit // lanes))])
    sch.bind(group, "blockIdx.x")
    sch.bind(items, "threadIdx.y")
    sch.bind(lane, "threadIdx.x")
    sch.compute_at(half, lane)
    sch.set_scope(half, 0, "local")
    for loop in sch.get_loops(half)[len(sch.get_loops(block)) - len(inner) :]:
        sch.unroll(loop)
    for loop in inner:
        sch.unroll(loop)


__all__ = ["Winograd"]
