"""Default CPU schedules for the LLVM target (used when no tuned schedule exists).

One rule per kernel shape, applied to every fused PrimFunc:

- A kernel with a reduction block (convolution, dense, pooling): elementwise
  producers (padding) stay their own parallel loops; the elementwise consumers (bias,
  BatchNorm, activation) become one epilogue applied when a tile is written back.
  The reduction accumulates a register tile: the contiguous output axis (H*W fused, or
  dense outputs) split into a vector of 4-16 float32 lanes, the channel axis into up
  to 8 rows; the reduction loops run outside the tile, so each loaded input feeds up
  to 8 x 16 accumulators. Tiles are spread over the cores.
- Anything else: every block's loops fused, split for vectors, run in parallel.

A schedule that fails (an unusual block structure) leaves the kernel unscheduled:
schedules are an optimization, never a reason to fail a build.
"""

from __future__ import annotations

import logging

import tvm
from tvm import s_tir, tirx

log = logging.getLogger(__name__)

VECTOR = (16, 8, 4)  # float32 lanes: AVX-512, AVX2, SSE/NEON
ROWS = (8, 4, 2)


def _factor(extent: int, choices: tuple[int, ...]) -> int:
    for choice in choices:
        if extent % choice == 0 and extent >= choice:
            return choice
    return 1


def _extents(sch: s_tir.Schedule, loops) -> list[int]:
    return [int(sch.get(loop).extent) for loop in loops]


def _iter_kinds(sch: s_tir.Schedule, block) -> list[str]:
    kinds = []
    for iv in sch.get(block).iter_vars:
        kinds.append("R" if iv.iter_type == tirx.IterVar.CommReduce else "S")
    return kinds


def _schedule_elementwise(sch: s_tir.Schedule, block) -> None:
    loops = sch.get_loops(block)
    if not loops:
        return
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    extent = int(sch.get(fused).extent)
    lanes = _factor(extent, VECTOR)
    if lanes > 1:
        outer, inner = sch.split(fused, [None, lanes])
        sch.vectorize(inner)
        fused = outer
    if int(sch.get(fused).extent) > 1:
        sch.parallel(fused)


def _largest_divisor(extent: int, limit: int) -> int:
    """The largest divisor of ``extent`` that is at most ``limit`` (the vector width)."""
    for value in range(min(limit, extent), 0, -1):
        if extent % value == 0:
            return value
    return 1


def _schedule_reduction(sch: s_tir.Schedule, block, epilogue) -> None:
    kinds = _iter_kinds(sch, block)
    loops = sch.get_loops(block)
    if len(loops) != len(kinds) or "S" not in kinds:
        raise ValueError("loops do not match block iterators")
    spatial = [lp for lp, k in zip(loops, kinds, strict=True) if k == "S"]
    reduce_ = [lp for lp, k in zip(loops, kinds, strict=True) if k == "R"]
    # Accumulate a tile in registers (a local buffer), write it out once per tile.
    write_back = sch.cache_write(block, 0, "local")
    if epilogue is not None:
        sch.reverse_compute_inline(epilogue)  # bias/BN/activation applied on write-back
    lanes = 1
    if len(spatial) >= 4:
        # NCHW: vectorize along W. A tile must be a rectangle of the output: the
        # write-back (placed per tile) covers the bounding box of what the tile computed,
        # so a vector must never wrap from one row into the next. Hence lanes divides W,
        # or, for maps narrower than 4, a vector spans whole rows (H and W fused).
        height, width = _extents(sch, spatial[-2:])
        if width >= 4:
            lanes = _largest_divisor(width, 16)
        else:
            rows_per_vector = _largest_divisor(height, max(1, 16 // width))
            spatial = [*spatial[:-2], sch.fuse(*spatial[-2:])]
            lanes = rows_per_vector * width
    else:
        lanes = _largest_divisor(_extents(sch, spatial[-1:])[0], 16)
    extents = _extents(sch, spatial)
    vec_outer, vec_inner = sch.split(spatial[-1], [None, lanes])
    if len(spatial) >= 3:  # tile channels too: each input load feeds rows x lanes sums
        rows = _factor(extents[1], ROWS)
        ch_outer, ch_inner = sch.split(spatial[1], [None, rows])
        outer = [spatial[0], ch_outer, *spatial[2:-1], vec_outer]
        tile = [ch_inner, vec_inner]
    else:
        outer = [*spatial[:-1], vec_outer]
        tile = [vec_inner]
    sch.reorder(*outer, *reduce_, *tile)
    fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    sch.parallel(fused)
    if lanes > 1:
        sch.vectorize(tile[-1])
    if len(tile) == 2:
        sch.unroll(tile[0])
    if reduce_:
        init = sch.decompose_reduction(block, reduce_[0])
        if lanes > 1:
            sch.vectorize(sch.get_loops(init)[-1])
    sch.reverse_compute_at(write_back, fused)
    if lanes > 1:
        wb_loops = sch.get_loops(write_back)
        if int(sch.get(wb_loops[-1]).extent) % lanes == 0:
            _, wb_inner = sch.split(wb_loops[-1], [None, lanes])
            sch.vectorize(wb_inner)


def _schedule(func: tirx.PrimFunc) -> tirx.PrimFunc:
    sch = s_tir.Schedule(func)
    blocks = [b for b in sch.get_child_blocks(sch.get_sblock("root"))]
    reductions = [b for b in blocks if "R" in _iter_kinds(sch, b)]
    if len(reductions) != 1:
        for block in blocks:
            _schedule_elementwise(sch, block)
        return sch.mod["main"]
    main = reductions[0]
    after = blocks[blocks.index(main) + 1 :]
    before = blocks[: blocks.index(main)]
    # Inline the epilogue chain into its last block so one loop nest follows the tile.
    for block in after[:-1]:
        sch.compute_inline(block)
    for block in before:
        _schedule_elementwise(sch, block)
    _schedule_reduction(sch, main, after[-1] if after else None)
    return sch.mod["main"]


def schedule_cpu(func: tirx.PrimFunc, target: tvm.target.Target | None = None) -> tirx.PrimFunc:
    """``func`` scheduled for the CPU; unchanged (logged at debug) if no rule applies."""
    try:
        return _schedule(func)
    except Exception as err:  # an unusual kernel: keep it correct, unscheduled
        log.debug("no CPU schedule for %s: %s", func.attrs.get("global_symbol"), err)
        return func


def schedule_module_cpu(mod: tvm.IRModule, target: tvm.target.Target | None = None) -> tvm.IRModule:
    """Apply :func:`schedule_cpu` to every PrimFunc of ``mod``."""
    functions = {}
    for gv, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc) and not func.attrs.get("edgecv.no_schedule", False):
            name = func.attrs["global_symbol"]
            functions[gv] = schedule_cpu(func.without_attr("global_symbol"), target).with_attr(
                "global_symbol", name
            )
        else:
            functions[gv] = func
    return tvm.IRModule(functions)
