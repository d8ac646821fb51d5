"""Pooling windows (max, average, global average) and mean over H, W.

One work-item per output element, consecutive work-items on consecutive output
columns; the window is reduced in a register (``local``), unrolled when small, with
the padding (zero or edge) and the epilogue (the average's division) inlined.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.target import Target

from .base import (
    GPURule,
    bind_spatial,
    divisor_at_most,
    extent,
    flatten_block,
    inline_around,
    iter_kinds,
    max_threads,
    work_items,
)

THREADS = 256
# windows up to this many elements are unrolled (a 7x7 global pool: 49)
UNROLL = 64
# Over this many elements per output and with fewer outputs than one work-group, one
# work-item per output leaves the device idle: dlight's cross-thread reductions suit.
SERIAL_LIMIT = 4096


def _is_window(name: str) -> bool:
    return name.startswith(("pool_", "adaptive_pool_", "tensor")) or name.endswith("_red")


def _lanes_first(sch: s_tir.Schedule, pool, lanes: int, limit: int):
    """A packed pool (``NCHW[x]c``): the channel lanes on the first work-item axis,
    output columns on the second, the rest on work-groups. Each load of a window tap is
    then the lane id plus terms uniform across the lanes: one vector load on Intel's
    CPU runtime, one coalesced row on a GPU. Flattened, consecutive work-items met a
    new column every ``lanes`` items, and a stride-2 window made every tap a gather
    (benchmarks/results/gpu_pool-2026-11-25-intel-cpu-opencl.md). Returns the lane
    loop."""
    n, c, h, w, lane, *_ = sch.get_loops(pool)
    w_o, w_i = sch.split(w, [None, divisor_at_most(extent(sch, w), limit // lanes)])
    sch.reorder(n, c, h, w_o, w_i, lane)
    sch.bind(sch.fuse(n, c, h, w_o), "blockIdx.x")
    sch.bind(w_i, "threadIdx.y")
    sch.bind(lane, "threadIdx.x")
    return lane


class Pool(GPURule):
    """One ``SSSSRR`` reduction block (a pooling window or a sum over H, W), or
    ``SSSSSRR`` for the same in a packed layout (``NCHW16c``: the graph tuner's
    pools follow their convolutions' packing)."""

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        started = self.start(func, target)
        if started is None:
            return None
        sch, found, reductions = started
        if len(reductions) != 1 or iter_kinds(sch, reductions[0]) not in ("SSSSRR", "SSSSSRR"):
            return None
        pool = reductions[0]
        if not _is_window(sch.get(pool).name_hint):
            return None
        loops = sch.get_loops(pool)
        window = extent(sch, loops[-2]) * extent(sch, loops[-1])
        outputs = 1
        for loop in loops[:-2]:
            outputs *= extent(sch, loop)
        if window > SERIAL_LIMIT and outputs < THREADS:
            return None
        _, out = inline_around(sch, pool, found)
        limit = min(THREADS, max_threads(target))
        lanes = extent(sch, loops[4]) if len(loops) == 7 else 0
        if 4 <= lanes <= limit // 2:
            item = _lanes_first(sch, pool, lanes, limit)
            reduce = sch.get_loops(pool)[-2:]
        elif out is None and flatten_block(sch, pool) is not None:
            # one loop over the outputs: their stores contiguous across work-items
            flat, *reduce = sch.get_loops(pool)
            _, item = sch.split(flat, [None, work_items(extent(sch, flat), limit)])
            sch.bind(sch.get_loops(pool)[0], "blockIdx.x")
            sch.bind(item, "threadIdx.x")
        else:
            _, item, reduce = bind_spatial(sch, pool, limit)
        if out is None:
            out = sch.cache_write(pool, 0, "local")
        else:
            sch.set_scope(pool, 0, "local")
        sch.reverse_compute_at(out, item, preserve_unit_loops=True)
        sch.decompose_reduction(pool, reduce[0])
        if window <= UNROLL:
            for loop in reduce:
                sch.unroll(loop)
        return sch
