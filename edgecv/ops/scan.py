"""Prefix sums along the last axis, in three stages, written once in TIR.

One work-group scans one row of any length:

1. up-sweep: work-item ``t`` owns the contiguous chunk ``[t*C, (t+1)*C)`` of the row
   (``C = ceil(n / threads)``) and scans it sequentially in a register, writing the
   chunk-local prefix sums and keeping the chunk total;
2. the chunk totals, one per work-item, are scanned in local memory with Hillis-Steele
   (``log2(threads)`` passes, a barrier between passes: no global synchronization and
   no assumption that work-items run in lockstep, which TVM's own GPU cumsum makes and
   which is wrong on OpenCL devices without lockstep subgroups);
3. down-sweep: each work-item adds the total of the chunks before it to its chunk.

Inclusive and exclusive scans differ only in whether the up-sweep writes the running
sum after or before adding the element, so neither is derived by subtraction (which
would round differently from a sequential scan). The CPU version scans rows in
parallel, each sequentially. :func:`scan_reference` is the NumPy reference.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import te, tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

__all__ = ["scan", "scan_cpu", "scan_gpu", "scan_reference"]

SUPPORTED_DTYPES = ("float32", "int32")


def scan_reference(data: np.ndarray, exclusive: bool = False) -> np.ndarray:
    """Prefix sums along the last axis, sequentially (NumPy's cumsum)."""
    data = np.asarray(data)
    inclusive = np.cumsum(data, axis=-1, dtype=data.dtype)
    if not exclusive:
        return inclusive
    out = np.zeros_like(inclusive)
    out[..., 1:] = inclusive[..., :-1]
    return out


def _check(shape, dtype: str) -> tuple[int, int]:
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"scan: dtype {dtype} is not supported (use one of {SUPPORTED_DTYPES})")
    if len(shape) != 2:
        raise ValueError(f"scan: data must be (rows, n), found shape {tuple(shape)}")
    if min(shape) < 1:
        raise ValueError(f"scan: empty shape {tuple(shape)}: there is nothing to scan")
    return int(shape[0]), int(shape[1])


def emit_scan(
    data,
    out,
    rows: int,
    n: int,
    dtype: str,
    exclusive: bool,
    threads: int,
    subgroup: int | None = None,
) -> None:
    """Emit the scan's launch into the PrimFunc being built: ``(rows, n)`` buffers
    ``data`` -> ``out`` (they may be workspaces of a larger operator). With
    ``subgroup`` (OpenCL, Intel subgroups of that size) the subgroup variant."""
    if subgroup is not None:
        _emit_subgroup_scan(data, out, rows, n, dtype, exclusive, threads, subgroup)
        return
    chunk = max(1, -(-n // threads))
    zero = tirx.const(0, dtype)
    row, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.x")
    with T.launch_thread(row, rows), T.launch_thread(tx, threads):
        totals = T.buffer_proxy(T.alloc_buffer((threads,), dtype, scope="shared"))
        acc = T.buffer_proxy(T.alloc_buffer((2,), dtype, scope="local"))
        start = tx * chunk
        acc[0] = zero
        with T.serial(0, chunk) as i:  # 1. up-sweep: scan the own chunk
            with T.If(start + i < n):
                with T.Then():
                    if exclusive:
                        out[row, start + i] = acc[0]
                        acc[0] = acc[0] + data[row, start + i]
                    else:
                        acc[0] = acc[0] + data[row, start + i]
                        out[row, start + i] = acc[0]
        totals[tx] = acc[0]
        T.evaluate(T.tvm_storage_sync("shared"))
        offset = 1
        while offset < threads:  # 2. Hillis-Steele over the chunk totals
            acc[1] = tirx.Select(tx >= offset, totals[tirx.max(tx - offset, 0)], zero)
            T.evaluate(T.tvm_storage_sync("shared"))
            totals[tx] = totals[tx] + acc[1]
            T.evaluate(T.tvm_storage_sync("shared"))
            offset *= 2
        acc[1] = tirx.Select(tx > 0, totals[tirx.max(tx - 1, 0)], zero)
        with T.serial(0, chunk) as i:  # 3. down-sweep: add the preceding chunks
            with T.If(start + i < n):
                with T.Then():
                    out[row, start + i] = out[row, start + i] + acc[1]


def _emit_subgroup_scan(data, out, rows, n, dtype, exclusive, threads, size) -> None:
    """The three stages with subgroup scans, one work-group per row.

    Subgroup ``w`` owns the span ``[w*span, (w+1)*span)`` of the row (``span`` a
    multiple of ``size``) and walks it in tiles of ``size`` consecutive elements, one
    per lane: loads are contiguous across the subgroup, each tile is one
    ``sub_group_scan`` plus the running total of the tiles before it (1., in registers,
    no barrier); the subgroup totals meet in local memory after one barrier and each
    subgroup adds those before it (2.); 3. adds that offset back to the span.
    """
    from . import subgroup as sg

    groups = threads // size
    per_group = -(-n // groups)  # elements per subgroup, then tiles per subgroup
    tiles = max(1, -(-per_group // size))
    span = tiles * size
    zero = tirx.const(0, dtype)
    row, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.x")
    with T.launch_thread(row, rows), T.launch_thread(tx, threads):
        totals = T.buffer_proxy(T.alloc_buffer((groups,), dtype, scope="shared"))
        acc = T.buffer_proxy(T.alloc_buffer((4,), dtype, scope="local"))
        w, lane = tx // size, tx % size
        acc[0] = zero  # the total of this subgroup's tiles so far
        with T.serial(0, tiles) as t:  # 1. up-sweep, a tile per step
            i = w * span + t * size + lane
            acc[1] = tirx.Select(i < n, data[row, tirx.min(i, n - 1)], zero)
            acc[2] = sg.scan_inclusive_add(acc[1])
            if exclusive:
                acc[3] = sg.scan_exclusive_add(acc[1])
            with T.If(i < n):
                with T.Then():
                    out[row, i] = acc[0] + (acc[3] if exclusive else acc[2])
            acc[0] = acc[0] + sg.broadcast(acc[2], size - 1)
        with T.If(lane == 0):
            with T.Then():
                totals[w] = acc[0]
        T.evaluate(T.tvm_storage_sync("shared"))
        acc[1] = zero  # 2. the totals of the subgroups before this one
        with T.serial(0, groups) as v:
            acc[1] = acc[1] + tirx.Select(v < w, totals[v], zero)
        with T.serial(0, tiles) as t:  # 3. down-sweep
            i = w * span + t * size + lane
            with T.If(i < n):
                with T.Then():
                    out[row, i] = out[row, i] + acc[1]


def _gpu_func(
    rows: int, n: int, dtype: str, exclusive: bool, threads: int, subgroup: int | None = None
) -> tirx.PrimFunc:
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("scan")
            T.func_attr({"tirx.is_scheduled": True, "global_symbol": "scan"})
            data = T.buffer_proxy(T.match_buffer(T.arg("data", T.handle()), (rows, n), dtype))
            out = T.buffer_proxy(T.match_buffer(T.arg("out", T.handle()), (rows, n), dtype))
            emit_scan(data, out, rows, n, dtype, exclusive, threads, subgroup)
    return ib.get()


def emit_row_scan(data, out, row, n: int, exclusive: bool) -> None:
    """Statements scanning ``data[row, :n]`` into ``out[row]`` sequentially."""
    acc = T.buffer_proxy(T.alloc_buffer((1,), data.dtype, scope="local"))
    acc[0] = tirx.const(0, data.dtype)
    with T.serial(0, n) as i:
        if exclusive:
            out[row, i] = acc[0]
            acc[0] = acc[0] + data[row, i]
        else:
            acc[0] = acc[0] + data[row, i]
            out[row, i] = acc[0]


def _cpu_ir(data, out, exclusive: bool):
    rows, n = (int(s) for s in data.shape)
    with IRBuilder() as ib:
        data, out = T.buffer_proxy(data), T.buffer_proxy(out)
        with T.parallel(0, rows) as row:
            emit_row_scan(data, out, row, n, exclusive)
    return ib.get()


def _extern(data: te.Tensor, body, name: str) -> te.Tensor:
    return te.extern(
        [data.shape],
        [data],
        lambda ins, outs: body(ins[0], outs[0]),
        dtype=[data.dtype],
        in_buffers=[tvm.tirx.decl_buffer(data.shape, data.dtype, "data")],
        out_buffers=[tvm.tirx.decl_buffer(data.shape, data.dtype, "out")],
        name=name,
        tag=name,
    )


def scan_gpu(
    rows: int,
    n: int,
    dtype: str = "float32",
    exclusive: bool = False,
    threads: int = 256,
    subgroup: int | None = None,
) -> tirx.PrimFunc:
    """The three-stage scan of ``(rows, n)`` as a scheduled GPU PrimFunc (one
    work-group of ``threads`` work-items per row); ``subgroup``: the Intel-subgroup
    variant for that subgroup size (OpenCL only)."""
    from .subgroup import check_subgroup

    _check((rows, n), dtype)
    if threads & (threads - 1):
        raise ValueError(f"scan: threads must be a power of two, not {threads}")
    check_subgroup(subgroup, threads, "scan")
    return _gpu_func(rows, n, dtype, exclusive, threads, subgroup)


def scan(data: te.Tensor, exclusive: bool = False) -> te.Tensor:
    """The scan of ``data (rows, n)`` as a TE extern for the CPU build (what a frontend
    emits and tags ``scan``; a GPU build swaps in :func:`scan_gpu`)."""
    _check([int(s) for s in data.shape], str(data.dtype))
    return _extern(data, lambda d, o: _cpu_ir(d, o, exclusive), "scan")


def scan_cpu(rows: int, n: int, dtype: str = "float32", exclusive: bool = False) -> tirx.PrimFunc:
    """The scan of ``(rows, n)`` for the CPU: rows in parallel, each sequential."""
    _check((rows, n), dtype)
    data = te.placeholder((rows, n), dtype, name="data")
    out = _extern(data, lambda d, o: _cpu_ir(d, o, exclusive), "scan")
    return te.create_prim_func([data, out])
