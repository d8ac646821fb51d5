"""Convolutions in a packed layout (``NCHW[x]c``, the graph tuner's packed convs) with
their fused padding and epilogue, for OpenCL and CUDA.

Work-items run along the channel block: the work-items of one group hold the block's
channels of the same output pixels, so each step of the reduction loads one input
value they all share (uniform: broadcast, or one load per subgroup) and one weight
each from a contiguous row of the packed weights, and the outputs they write are
contiguous. This is the shape of Intel's subgroup convolutions (a subgroup of 16 is a
block of 16 channels) and what Intel's CPU runtime, which vectorizes work-items along
dimension 0, turns into vector FMAs. Each work-item keeps a register tile of a few
output pixels along the row (and, for plain convolutions, a few channel blocks), so
each value it loads feeds several FMAs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import product

from tvm import s_tir, tirx
from tvm.target import Target

from .base import (
    GPURule,
    accumulate_in_registers,
    divisor_at_most,
    extent,
    inline_around,
    iter_kinds,
    max_threads,
)

CONV2D = "conv2d_NCHWc"  # the computes of edgecv.lowering.legalize
DEPTHWISE = "depthwise_conv2d_NCHWc"

# Register tile per work-item. On Intel's CPU runtime (MobileNet/ResNet layers, 16c),
# 8 pixels x 2 blocks beat 4 x 2 (1.5-2x) and 8 x 4 and 4 x 4 (spills).
PIXELS = 8  # output pixels per work-item (at most; see pixel_tile)
CHANNEL_BLOCKS = 2  # channel blocks per work-item in a plain (not depthwise) conv
GROUP = 128  # work-items per group (at most)


@dataclass(frozen=True)
class Tile:
    """The knobs of a packed convolution's work-item tile (each an upper bound: the
    rule fits them to the loop extents)."""

    pixels: int = PIXELS
    channel_blocks: int = CHANNEL_BLOCKS
    group: int = GROUP


# The tiles a tuner tries (``apply(..., tunable=True)``): up to 48, fewer distinct
# schedules once fitted to a kernel's extents (12-39 on SqueezeNet's convolutions).
TILES = [Tile(*knobs) for knobs in product((2, 4, 8, 16), (1, 2, 4), (32, 64, 128, 256))]


def packings(subgroup: int | None) -> list[int]:
    """The channel blocks this rule is used with on a device: its Intel subgroup width
    (a subgroup per block), else 4 (Mali's float4)."""
    return [subgroup] if subgroup else [4]


def pixel_tile(width: int, cap: int = PIXELS) -> int:
    """Output pixels per work-item along a row of ``width``: the largest divisor up to
    ``cap``, or ``cap`` with the row's last tile predicated when no divisor reaches
    half of it (a prime width such as SqueezeNet's 109 would get one pixel per
    work-item and a work-group of one channel block)."""
    best = divisor_at_most(width, cap)
    return best if 2 * best >= cap or width <= cap else cap


def _schedule(
    sch: s_tir.Schedule, conv, found: list, target: Target, depthwise: bool, tile: Tile
) -> None:
    _, out = inline_around(sch, conv, found)
    schedule_tile(sch, conv, out, target, depthwise, tile)


def schedule_tile(
    sch: s_tir.Schedule, conv, out, target: Target, depthwise: bool, tile: Tile = Tile()
) -> None:
    """The work-items and register tile of a packed convolution block ``conv`` (loops
    ``n, co, y, x, lane`` then its reductions), its accumulators written out by ``out``
    (its fused epilogue) or, when None, by a block made here. Also the tile of
    Winograd's products (:mod:`.winograd`), which have the loops of a 1x1 conv."""
    n, co, y, x, lane, *reduction = sch.get_loops(conv)
    pixels, chunks, threads = tile_fitter(sch, conv, target, depthwise)(tile)
    bc, vc = sch.split(co, [None, chunks])
    bx, vx = sch.split(x, [None, pixels])
    bx, tx = sch.split(bx, [None, threads])
    sch.reorder(n, bc, y, bx, tx, lane, *reduction, vc, vx)
    sch.bind(sch.fuse(n, bc, y, bx), "blockIdx.x")
    sch.bind(tx, "threadIdx.y")
    sch.bind(lane, "threadIdx.x")
    out = accumulate_in_registers(sch, conv, out, lane)
    init = sch.decompose_reduction(conv, reduction[0])
    small = [loop for loop in reduction[1:] if extent(sch, loop) <= 16]
    for loop in [*small, vc, vx, *sch.get_loops(init)[5:], *sch.get_loops(out)[5:]]:
        sch.unroll(loop)


def tile_fitter(sch: s_tir.Schedule, conv, target: Target, depthwise: bool) -> Callable:
    """``fit(tile)``: the (pixels, channel blocks, work-items along a row) that
    :func:`schedule_tile` gives the unscheduled block ``conv`` for ``tile``, all its
    schedule depends on (two tiles that fit alike give the same schedule)."""
    _, co, _, x, lane, *_ = sch.get_loops(conv)
    block, width, channels = extent(sch, lane), extent(sch, x), extent(sch, co)

    def fit(tile: Tile) -> tuple[int, int, int]:
        pixels = pixel_tile(width, tile.pixels)
        chunks = 1 if depthwise else divisor_at_most(channels, tile.channel_blocks)
        limit = max(1, min(max_threads(target), tile.group) // block)
        return pixels, chunks, divisor_at_most(-(-width // pixels), limit)

    return fit


class PackedConv2D(GPURule):
    """``conv2d_NCHWc`` and ``depthwise_conv2d_NCHWc`` with their fused neighbours.

    ``tunable``: the schedules of every tile of :data:`TILES` (the default's first)."""

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool):
        if not tunable:
            return self._tiled(func, target, Tile())
        fit = self._fitter(func, target)
        return self.variants(func, target, Tile(), TILES, self._tiled, fit)

    def _tiled(self, func: tirx.PrimFunc, target: Target, tile: Tile) -> s_tir.Schedule | None:
        started = self.start(func, target)
        if started is None:
            return None
        sch, found, reductions = started
        depthwise = _depthwise(sch, reductions)
        if depthwise is None:
            return None
        _schedule(sch, reductions[0], found, target, depthwise, tile)
        return sch

    def _fitter(self, func: tirx.PrimFunc, target: Target) -> Callable | None:
        started = self.start(func, target)
        if started is None:
            return None
        sch, _, reductions = started
        depthwise = _depthwise(sch, reductions)
        try:
            return None if depthwise is None else tile_fitter(sch, reductions[0], target, depthwise)
        except ValueError:  # an extent that is not a constant: the rule refuses it anyway
            return None


def _depthwise(sch: s_tir.Schedule, reductions: list) -> bool | None:
    """Whether the kernel's one reduction block is a depthwise (True) or plain (False)
    packed convolution; None when it is neither."""
    if len(reductions) != 1:
        return None
    conv = reductions[0]
    name, kinds = sch.get(conv).name_hint, iter_kinds(sch, conv)
    if name.startswith(DEPTHWISE) and kinds == "SSSSSRR":
        return True
    if name.startswith(CONV2D) and kinds in ("SSSSSRRRR", "SSSSSRRR"):
        return False
    return None
