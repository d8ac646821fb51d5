"""Direct NCHW conv2d (groups 1, 1x1 included) with its fused padding and epilogue.

The schedule follows one idea that suits both real GPUs and Intel's CPU OpenCL
runtime, whose compiler vectorizes across work-items along dimension 0: consecutive
work-items (``threadIdx.x``) compute consecutive output columns, so their input loads
are contiguous vectors (coalesced on a GPU) and their weight loads are uniform
(broadcast). Each work-item keeps a register tile of several output channels (and
rows) in ``local`` scope, so every input value it loads feeds several FMAs. Output
channels are split across work-groups; a stride-1 conv, whose input is read at the
output's positions plus a constant offset, has its rows and columns fused so even a 7x7
or 13x13 map fills a work-group; a strided one splits its map along the height. Tiles
divide the extents where they can; extents they do not get predicated splits.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import s_tir, tirx
from tvm.target import Target

from .base import (
    GPURule,
    accumulate_in_registers,
    blocks,
    divisor_at_most,
    extent,
    inline_around,
    iter_kinds,
    max_threads,
    work_items,
)


@dataclass(frozen=True)
class ConvTile:
    """How one conv kernel is split over work-groups, work-items and registers."""

    channels: int  # output channels per work-item (register tile)
    rows: int  # output rows per work-item (register tile); positions when ``flat``
    threads_x: int  # work-items along the output width (or along H*W when ``flat``)
    threads_y: int  # work-items along rows (or along channel tiles when ``flat``)
    flat: bool  # threads over the fused H*W positions instead of over W
    reduce_unroll: int  # input channels unrolled per reduction step


def _largest_divisor(value: int, choices: tuple[int, ...]) -> int:
    return next((c for c in choices if value % c == 0), 1)


def channel_tile(channels: int, preferred: int = 8) -> int:
    """Output channels per work-item: ``preferred`` when it divides ``channels``, else
    the divisor nearest to it between 5 and 16 (a detector head's 126 = 6 x 21 outputs:
    9 near 8, 14 near 16; YOLOv3's 255: 15), else the largest divisor up to 16. A tile
    that divides the channels needs no bounds test on its weights and outputs."""
    if channels % preferred == 0:
        return preferred
    near = [d for d in range(5, 17) if channels % d == 0]
    if near:
        return min(near, key=lambda d: (abs(d - preferred), -d))
    return divisor_at_most(channels, 16)


def conv_tile(shape: dict[str, int], target: Target, depthwise: bool = False) -> ConvTile:
    """The default tile of a conv with output ``f, h, w`` and reduction ``c, kh, kw``.

    Each choice won against the others on Intel's CPU OpenCL runtime (8-wide vectors,
    16 vector registers; the times: ``benchmarks/results/``,
    ``gpu_rules-2026-11-23-intel-cpu-opencl.md``):

    - A stride-1 conv has its work-items along the fused H*W positions, up to 256 per
      work-group: its input rows are read at ``position + offset``, contiguous across
      work-items, and small or odd maps still fill the group. Strided convs keep
      work-items along the output width with rows added to small groups (their loads
      are strided either way).
    - 8 output channels per work-item on convs with a window, each input load feeding 8
      FMAs (16 accumulators spill). 1x1 convs take 16: they stream their whole input
      once per channel tile, and on large maps the bandwidth decides.
    - Depthwise: 1 channel by 4 rows per work-item along the width, the rows sharing
      the kernel's overlapping input rows.
    """
    limit = max_threads(target)
    f, h, w = shape["f"], shape["h"], shape["w"]
    pointwise = shape["kh"] == shape["kw"] == 1 and shape["in_h"] == h and shape["in_w"] == w
    channels = 1 if depthwise else channel_tile(f, 16 if pointwise else 8)
    stride_one = shape["in_h"] == h + shape["kh"] - 1 and shape["in_w"] == w + shape["kw"] - 1
    flat = pointwise or (stride_one and not depthwise)
    if flat:
        threads_x, threads_y = work_items(h * w, min(limit, 256)), 1
    else:
        threads_x = work_items(w, min(limit, 128))
        threads_y = divisor_at_most(h, max(1, 64 // threads_x)) if threads_x < 32 else 1
    rows = _largest_divisor(h // threads_y, (4, 2)) if depthwise and not flat else 1
    reduce_unroll = _largest_divisor(shape["c"], (4, 2)) if pointwise else 1
    return ConvTile(channels, rows, threads_x, threads_y, flat, reduce_unroll)


def find_conv(sch: s_tir.Schedule, name: str):
    """The one reduction block of the kernel if it is named ``name`` and iterates
    ``n, f, y, x`` (spatial) by ``c, kh, kw`` (reduction); else None."""
    found = blocks(sch)
    reductions = [b for b in found if "R" in iter_kinds(sch, b)]
    if len(reductions) != 1 or sch.get(reductions[0]).name_hint != name:
        return None, found
    if iter_kinds(sch, reductions[0]) != "SSSSRRR":
        return None, found
    return reductions[0], found


def conv_shape(sch: s_tir.Schedule, conv) -> dict[str, int]:
    n, f, y, x, c, kh, kw = (extent(sch, loop) for loop in sch.get_loops(conv))
    data = sch.get(conv).reads[0].source  # the (padded) input
    in_h, in_w = (int(d) for d in data.shape[2:])
    return {"n": n, "f": f, "h": y, "w": x, "c": c, "kh": kh, "kw": kw, "in_h": in_h, "in_w": in_w}


def schedule_conv(sch: s_tir.Schedule, conv, found: list, tile: ConvTile) -> None:
    """Tile ``conv`` (a ``SSSSRRR`` reduction block) as ``tile`` says, with its padding
    inlined and its epilogue computed from the register tile."""
    pad, out = inline_around(sch, conv, found, keep_input=True)
    n, f, y, x, rc, ry, rx = sch.get_loops(conv)
    if tile.flat:
        p = sch.fuse(y, x)
        bp, vy, tx = sch.split(p, [None, tile.rows, tile.threads_x])
        bf, ty, vf = sch.split(f, [None, tile.threads_y, tile.channels])
        outer = [n, bf, bp]
    else:
        bf, vf = sch.split(f, [None, tile.channels])
        by, ty, vy = sch.split(y, [None, tile.threads_y, tile.rows])
        bx, tx = sch.split(x, [None, tile.threads_x])
        outer = [n, bf, by, bx]
    rco, rci = sch.split(rc, [None, tile.reduce_unroll])
    sch.reorder(*outer, ty, tx, rco, ry, rx, rci, vf, vy)
    sch.bind(sch.fuse(*outer), "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    out = accumulate_in_registers(sch, conv, out, tx)
    # each input value (its zero-padding test included) is loaded once into a register
    # and used for every output channel of the tile
    if pad is None:
        pad = sch.cache_read(conv, 0, "local")
    else:
        sch.set_scope(pad, 0, "local")
    sch.compute_at(pad, rci, preserve_unit_loops=True)
    init = sch.decompose_reduction(conv, rco)
    # the register tile and the kernel window are small and constant: unrolled, the
    # accumulators stay in registers and the compiler can reuse loaded inputs
    staged = sch.get_loops(pad)[7:]
    for loop in [ry, rx, rci, vf, vy, *staged, *sch.get_loops(init)[3:], *sch.get_loops(out)[3:]]:
        sch.unroll(loop)


class Conv2D(GPURule):
    """``conv2d_nchw`` with groups 1 (1x1 included) and its fused neighbours."""

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = self.new_schedule(func)
        conv, found = find_conv(sch, "conv2d_nchw")
        if conv is None:
            return None
        schedule_conv(sch, conv, found, conv_tile(conv_shape(sch, conv), target))
        return sch
