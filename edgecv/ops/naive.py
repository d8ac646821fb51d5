"""The obvious GPU versions of the vision operators: the "before" of the benchmarks.

Each gives one work-item a whole row (a scan row, a sort segment, an NMS batch) and
runs the sequential algorithm in it: a running sum, a bottom-up merge sort, the serial
NMS loop. They are correct (tested against the same references) and exist to measure
what the work-balanced versions in :mod:`.scan`, :mod:`.argsort` and :mod:`.box_nms`
gain; no build uses them unless asked (:func:`edgecv.codegen.op_versions.OpVersions`).
"""

from __future__ import annotations

import numpy as np
from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from .box_nms import emit_nms_row, gpu_setup, output_rows, sort_key
from .scan import emit_row_scan

__all__ = ["naive_scan_gpu", "naive_segmented_argsort_gpu", "naive_box_nms_gpu"]


def _one_item_per(count: int):
    """Launch frames giving each of ``count`` rows one work-item (64 per group)."""
    per_group = 64
    bx, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.x")
    return (
        bx,
        tx,
        T.launch_thread(bx, max(1, -(-count // per_group))),
        T.launch_thread(tx, per_group),
        per_group,
    )


def _serial_merge_sort(key, src, dst, start, length: int, lo_hi, descending: bool):
    """Stable bottom-up merge sort of the ``length`` indices ``src[start:]`` by
    ``key(index)``, ping-ponging with ``dst``; returns the buffer holding the result.
    ``lo_hi`` is a 4-int local scratch. ``length`` is static, so the passes unroll."""
    width, a, b = 1, src, dst
    while width < length:
        with T.serial(0, -(-length // (2 * width))) as run:
            left = start + run * 2 * width
            mid = tirx.min(left + width, start + length)
            end = tirx.min(left + 2 * width, start + length)
            lo_hi[0] = left  # next of the left run
            lo_hi[1] = mid  # next of the right run
            with T.serial(0, end - left) as step:
                # take the right run's head only if it sorts strictly first (stable)
                lo_hi[2] = 0
                with T.If(lo_hi[0] >= mid):
                    with T.Then():
                        lo_hi[2] = 1
                    with T.Else():
                        with T.If(lo_hi[1] < end):
                            with T.Then():
                                kr, kl = key(a[lo_hi[1]]), key(a[lo_hi[0]])
                                first = kr > kl if descending else kr < kl
                                lo_hi[2] = tirx.Select(first, 1, 0)
                with T.If(lo_hi[2] == 1):
                    with T.Then():
                        b[left + step] = a[lo_hi[1]]
                        lo_hi[1] = lo_hi[1] + 1
                    with T.Else():
                        b[left + step] = a[lo_hi[0]]
                        lo_hi[0] = lo_hi[0] + 1
        width, a, b = width * 2, b, a
    return a


def naive_scan_gpu(rows: int, n: int, dtype: str = "int32", exclusive: bool = False):
    """Prefix sum with one work-item per row running the sum sequentially."""
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("naive_scan")
            T.func_attr({"tirx.is_scheduled": True, "global_symbol": "naive_scan"})
            data = T.buffer_proxy(T.match_buffer(T.arg("data", T.handle()), (rows, n), dtype))
            out = T.buffer_proxy(T.match_buffer(T.arg("out", T.handle()), (rows, n), dtype))
            bx, tx, g_frame, t_frame, per = _one_item_per(rows)
            with g_frame, t_frame:
                row = bx * per + tx
                with T.If(row < rows):
                    with T.Then():
                        emit_row_scan(data, out, row, n, exclusive)
    return ib.get()


def naive_segmented_argsort_gpu(
    lengths: list[int], dtype: str = "float32", descending: bool = False
):
    """Stable argsort with one work-item per segment (a sequential merge sort each).

    Segment lengths are static (the passes unroll per distinct length), which suits
    detectors' fixed class segments. Arguments: ``keys (total,)``, the result
    ``indices (total,) int32`` (within each segment), a workspace ``(total,) int32``.
    """
    lengths = [int(v) for v in lengths]
    total = sum(lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(int).tolist()
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("naive_argsort")
            T.func_attr({"tirx.is_scheduled": True, "global_symbol": "naive_argsort"})
            keys = T.buffer_proxy(T.match_buffer(T.arg("keys", T.handle()), (total,), dtype))
            result = T.buffer_proxy(T.match_buffer(T.arg("indices", T.handle()), (total,), "int32"))
            work = T.buffer_proxy(T.match_buffer(T.arg("work", T.handle()), (total,), "int32"))
            bx, tx, g_frame, t_frame, per = _one_item_per(len(lengths))
            with g_frame, t_frame:
                seg = bx * per + tx
                for s, (start, length) in enumerate(zip(starts, lengths, strict=True)):
                    if length == 0:
                        continue
                    with T.If(seg == s):
                        with T.Then():
                            scratch = T.buffer_proxy(T.alloc_buffer((4,), "int32", scope="local"))
                            with T.serial(0, length) as i:
                                result[start + i] = start + i
                            done = _serial_merge_sort(
                                lambda i: keys[i], result, work, start, length, scratch, descending
                            )
                            with T.serial(0, length) as i:
                                result[start + i] = done[start + i] - start
    return ib.get()


def naive_box_nms_gpu(shape, dtype: str = "float32", **attrs):
    """MXNet ``box_nms`` with one work-item per batch row doing all of it serially:
    keys, a merge sort, then the CPU version's gather / suppress / compact loop."""
    attrs, batch, n, k = gpu_setup(shape, attrs)
    rows = output_rows(n, attrs["out_rows"])
    lowest = tirx.const(float(np.finfo(dtype).min), dtype)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("naive_box_nms")
            T.func_attr({"tirx.is_scheduled": True, "global_symbol": "naive_box_nms"})
            data = T.buffer_proxy(T.match_buffer(T.arg("data", T.handle()), (batch, n, k), dtype))
            out = T.buffer_proxy(T.match_buffer(T.arg("out", T.handle()), (batch, rows, k), dtype))
            keys = T.buffer_proxy(T.alloc_buffer((batch, n), dtype, scope="global"))
            order = T.buffer_proxy(T.alloc_buffer((batch * n,), "int32", scope="global"))
            spare = T.buffer_proxy(T.alloc_buffer((batch * n,), "int32", scope="global"))
            flags = T.buffer_proxy(T.alloc_buffer((batch, n), "int32", scope="global"))
            bx, tx, g_frame, t_frame, per = _one_item_per(batch)
            with g_frame, t_frame:
                b = bx * per + tx
                with T.If(b < batch):
                    with T.Then():
                        with T.serial(0, n) as i:
                            keys[b, i] = sort_key(data, b, i, attrs, dtype)
                            order[b * n + i] = i
                        scratch = T.buffer_proxy(T.alloc_buffer((4,), "int32", scope="local"))
                        done = _serial_merge_sort(
                            lambda i: keys[b, i], order, spare, b * n, n, scratch, True
                        )

                        class Row:  # order[b, j] for emit_nms_row, over the flat result
                            def __getitem__(self, index):
                                return done[index[0] * n + index[1]]

                        emit_nms_row(data, keys, Row(), out, flags, b, attrs, lowest)
    return ib.get()
