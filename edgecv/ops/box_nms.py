"""``_contrib_box_nms`` for the CPU, in TVM IR; semantics in :mod:`.box_nms_reference`.

Three stages, all in one kernel call:

1. a sort key per box: its score when the box is valid, else the lowest float (a
   ``te.compute``), so invalid boxes sort last;
2. a stable descending argsort of the keys per batch (TVM's CPU ``argsort``, a
   ``std::stable_sort``: equal scores keep their input order, as MXNet's do); with
   ``0 < topk < N``, TVM's CPU ``topk`` instead (a heap of ``topk``, ties in input
   order): only the first ``topk`` can be kept;
3. an IR loop per batch (batches in parallel): copy the first ``topk`` valid boxes in
   sorted order, suppress greedily with a keep-flag per box, then compact the kept
   rows to the top (in place: a row only ever moves up), converting their format,
   and fill the rest with -1. Outputs start as -1 rather than branching per field.

The GPU versions (segmented argsort, scan-based valid counts) replace stages 2-3.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import te, tirx, topi
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from .box_nms_reference import box_nms_reference, check_box_nms_attrs

__all__ = ["box_nms", "box_nms_reference"]


DEFAULTS = {
    "overlap_thresh": 0.5,
    "valid_thresh": 0.0,
    "topk": -1,
    "coord_start": 2,
    "score_index": 1,
    "id_index": -1,
    "background_id": -1,
    "force_suppress": False,
    "in_format": "corner",
    "out_format": "corner",
    "out_rows": -1,
}


def gpu_setup(shape, attrs: dict) -> tuple[dict, int, int, int]:
    """MXNet's defaults under ``attrs``, checked against ``shape`` ``(..., N, K)``;
    returns (attrs, batch, N, K) with the leading dimensions flattened to one batch."""
    attrs = {**DEFAULTS, **attrs}
    shape = tuple(int(d) for d in shape)
    if len(shape) < 2:
        raise ValueError(f"box_nms: data must be (..., N, K), found shape {shape}")
    n, k = shape[-2:]
    check_box_nms_attrs(
        k,
        attrs["coord_start"],
        attrs["score_index"],
        attrs["id_index"],
        attrs["in_format"],
        attrs["out_format"],
    )
    batch = int(np.prod(shape[:-2], dtype=np.int64)) if len(shape) > 2 else 1
    return attrs, batch, n, k


def sort_key(data, b, i, attrs: dict, dtype: str):
    """Box ``(b, i)``'s sort key (:func:`key_of`)."""
    class_id = data[b, i, attrs["id_index"]] if attrs["id_index"] >= 0 else None
    return key_of(data[b, i, attrs["score_index"]], class_id, attrs, dtype)


def key_of(score, class_id, attrs: dict, dtype: str):
    """The sort key of a box with ``score`` and ``class_id`` (None: boxes without
    ids): its score when valid (above ``valid_thresh``, not the background class), else
    the lowest float, so invalid boxes sort last."""
    valid = score > tirx.const(float(np.float32(attrs["valid_thresh"])), dtype)
    if class_id is not None:
        valid = tirx.all(valid, class_id != tirx.const(attrs["background_id"], dtype))
    return tirx.Select(valid, score, tirx.const(float(np.finfo(dtype).min), dtype))


def same_class(a, b):
    """Whether two class ids are one class: as integers, truncated toward zero, as
    MXNet compares them (ids 1.2 and 1.7 are one class)."""
    return tirx.Cast("int32", a) == tirx.Cast("int32", b)


def _corner(row, coord_start: int, fmt: str, dtype: str):
    """The corner coordinates (x1, y1, x2, y2) of a box row given as a 4-value accessor."""
    a, b, c, d = (row(coord_start + k) for k in range(4))
    if fmt == "corner":
        return a, b, c, d
    half = tirx.const(0.5, dtype)
    return a - c * half, b - d * half, a + c * half, b + d * half


def _iou(p, q, dtype: str):
    zero = tirx.const(0.0, dtype)
    iw = tirx.max(zero, tirx.min(p[2], q[2]) - tirx.max(p[0], q[0]))
    ih = tirx.max(zero, tirx.min(p[3], q[3]) - tirx.max(p[1], q[1]))
    inter = iw * ih
    area_p = tirx.max(zero, p[2] - p[0]) * tirx.max(zero, p[3] - p[1])
    area_q = tirx.max(zero, q[2] - q[0]) * tirx.max(zero, q[3] - q[1])
    union = area_p + area_q - inter
    return tirx.Select(union > zero, inter / union, zero)


def _nms_ir(data, keys, order, out, flags, attrs: dict, lowest):
    batch, ranked = (int(s) for s in order.shape)
    with IRBuilder() as ib:
        data, keys, order = T.buffer_proxy(data), T.buffer_proxy(keys), T.buffer_proxy(order)
        out, flags = T.buffer_proxy(out), T.buffer_proxy(flags)
        with T.parallel(0, batch) as b:
            emit_nms_row(data, keys, order, out, flags, b, attrs, lowest, ranked)
    return ib.get()


def emit_nms_row(
    data, keys, order, out, flags, b, attrs: dict, lowest, ranked: int | None = None
) -> None:
    """Statements for row ``b``: count the valid boxes among the first ``ranked`` of
    ``order`` (all ``N`` by default; ``topk`` when only those were selected), cut to
    ``topk``; then walk them in score order, each box still flagged being kept: written
    to the next row of ``out`` (in ``out_format``), and clearing the flags of the later
    boxes it suppresses. The walk stops keeping once ``out``'s rows are full (a box's
    fate depends only on the boxes before it, so the first rows are MXNet's whatever
    follows); the rows left are -1. Boxes are read from ``data`` through ``order``:
    ``out`` may hold fewer rows than ``data`` (the rows a following slice keeps)."""
    _, n, k = (int(s) for s in data.shape)
    rows = int(out.shape[1])
    ranked = n if ranked is None else ranked
    dtype = data.dtype
    cs, ii = attrs["coord_start"], attrs["id_index"]
    topk, in_fmt, out_fmt = attrs["topk"], attrs["in_format"], attrs["out_format"]
    thresh = tirx.const(attrs["overlap_thresh"], dtype)
    minus_one = tirx.const(-1.0, dtype)
    count = T.buffer_proxy(T.alloc_buffer((2,), "int32", scope="local"))
    count[0] = 0
    with T.serial(0, ranked) as j:  # valid boxes sort first: count them
        with T.If(keys[b, order[b, j]] > lowest):
            with T.Then():
                count[0] = count[0] + 1
    if topk >= 0:
        with T.If(count[0] > topk):
            with T.Then():
                count[0] = topk
    with T.serial(0, count[0]) as j:
        flags[b, j] = 1

    def field(j, f):
        return data[b, order[b, j], f]

    def corner(j):
        return _corner(lambda f: field(j, f), cs, in_fmt, dtype)

    count[1] = 0  # rows written (boxes kept)
    with T.serial(0, count[0]) as i:
        with T.If(tirx.all(flags[b, i] == 1, count[1] < rows)):
            with T.Then():
                with T.serial(0, k) as f:
                    out[b, count[1], f] = field(i, f)
                if in_fmt != out_fmt:
                    x1, y1, x2, y2 = corner(i)
                    half = tirx.const(0.5, dtype)
                    if out_fmt == "center":
                        values = ((x1 + x2) * half, (y1 + y2) * half, x2 - x1, y2 - y1)
                    else:
                        values = (x1, y1, x2, y2)
                    for c in range(4):
                        out[b, count[1], cs + c] = values[c]
                count[1] = count[1] + 1
                with T.serial(i + 1, count[0]) as j:
                    same = flags[b, j] == 1
                    if ii >= 0 and not attrs["force_suppress"]:
                        same = tirx.all(same, same_class(field(i, ii), field(j, ii)))
                    with T.If(same):
                        with T.Then():
                            with T.If(_iou(corner(i), corner(j), dtype) > thresh):
                                with T.Then():
                                    flags[b, j] = 0
    with T.serial(0, rows) as j:
        with T.If(j >= count[1]):
            with T.Then():
                with T.serial(0, k) as f:
                    out[b, j, f] = minus_one


def box_nms(
    data: te.Tensor,
    overlap_thresh: float = 0.5,
    valid_thresh: float = 0.0,
    topk: int = -1,
    coord_start: int = 2,
    score_index: int = 1,
    id_index: int = -1,
    background_id: int = -1,
    force_suppress: bool = False,
    in_format: str = "corner",
    out_format: str = "corner",
    out_rows: int = -1,
) -> te.Tensor:
    """MXNet ``box_nms`` (first output) as a TVM tensor expression for the CPU.

    Parameters follow MXNet's operator; ``data`` is ``(..., N, K)``. ``out_rows``, when
    in ``1..N-1``, gives only the first ``out_rows`` rows of MXNet's output, ``(...,
    out_rows, K)`` (what a following slice keeps; see :func:`output_rows`). Raises
    ValueError naming the attribute when one does not fit the data.
    """
    shape = [int(s) for s in data.shape]
    if len(shape) < 2:
        raise ValueError(f"box_nms: data must be (..., N, K), found shape {tuple(shape)}")
    check_box_nms_attrs(shape[-1], coord_start, score_index, id_index, in_format, out_format)
    n, k = shape[-2:]
    rows = output_rows(n, out_rows)
    batch = int(np.prod(shape[:-2], dtype=np.int64)) if len(shape) > 2 else 1
    flat = topi.reshape(data, (batch, n, k)) if len(shape) != 3 else data
    dtype = data.dtype
    lowest = tirx.const(float(np.finfo(dtype).min), dtype)
    key_attrs = dict(
        valid_thresh=valid_thresh,
        score_index=score_index,
        id_index=id_index,
        background_id=background_id,
    )

    def key(b, i):
        return sort_key(flat, b, i, key_attrs, dtype)

    keys = te.compute((batch, n), key, name="box_nms_keys")
    if 0 < topk < n:
        # only the first topk boxes can be kept: select them (TVM's CPU topk keeps a
        # heap of k, O(N log k), ties in input order as a stable sort gives them)
        # instead of sorting all N (YOLOv3's N is 10647 anchors x 80 classes)
        order = topi.topk(keys, k=topk, axis=1, ret_type="indices", is_ascend=False, dtype="int32")
    else:
        order = topi.argsort(keys, axis=1, is_ascend=False, dtype="int32")
    ranked = int(order.shape[1])
    attrs = dict(
        overlap_thresh=overlap_thresh,
        topk=topk,
        coord_start=coord_start,
        score_index=score_index,
        id_index=id_index,
        force_suppress=force_suppress,
        in_format=in_format,
        out_format=out_format,
    )
    out, _flags = te.extern(
        [(batch, rows, k), (batch, ranked)],
        [flat, keys, order],
        lambda ins, outs: _nms_ir(ins[0], ins[1], ins[2], outs[0], outs[1], attrs, lowest),
        dtype=[dtype, "int32"],
        in_buffers=[
            tvm.tirx.decl_buffer(b.shape, b.dtype, name, layout=None)
            for b, name in ((flat, "data"), (keys, "keys"), (order, "order"))
        ],
        name="box_nms",
        tag="box_nms",
    )
    return topi.reshape(out, (*shape[:-2], rows, k)) if len(shape) != 3 else out


def output_rows(n: int, out_rows: int) -> int:
    """The rows ``box_nms`` writes: ``out_rows`` when it cuts MXNet's ``N``-row output
    (``1..N-1``), else all ``N``."""
    if out_rows == 0 or out_rows < -1:
        raise ValueError(f"box_nms: out_rows={out_rows} must be -1 (all rows) or positive")
    return out_rows if 0 < out_rows < n else n


# -- GPU ------------------------------------------------------------------------------


def box_nms_gpu(
    shape: tuple[int, ...],
    dtype: str = "float32",
    target_kind: str = "opencl",
    threads: int = 256,
    subgroup: int | None = None,
    **attrs,
) -> tirx.PrimFunc:
    """MXNet ``box_nms`` (first output) as a scheduled GPU PrimFunc ``(data, out)``.

    The stages, each a launch (batch rows are the sort's segments):

    1. keys: the score of a valid box, else the lowest float (invalid sorts last);
    2. segmented stable argsort of the keys, descending (:mod:`.segmented_argsort`); with
       ``topk`` at most half the row, the top-k sort instead (rows padded to whole
       blocks, merge passes that keep only the first ``topk`` of each merged run);
    3. per row: the number of valid boxes (binary search in the sorted keys), cut to
       ``topk``;
    4. gather the valid boxes in score order (the rest of the row is -1), flag them;
    5. greedy suppression (:mod:`.greedy_nms`): one work-group per row walks the boxes
       in order and, for each box still flagged, clears the flags of the later boxes it
       overlaps -- or, with ``subgroup``, one subgroup per row settles tiles of boxes
       with subgroup collectives;
    6. write positions of the kept boxes: an exclusive scan of the flags (:mod:`.scan`);
    7. compaction: each kept box moves to its position (in ``out_format``) when that is
       one of ``out``'s rows (``out_rows``: the first rows only), every row past the
       kept ones becomes -1.

    Initialized outputs, not branches, mark invalid rows; work-items cover boxes, the
    work-groups rows. ``attrs`` are MXNet's (see :func:`box_nms`). ``subgroup``: the
    Intel subgroup size (OpenCL) for the subgroup variants of the sort, the scan and
    the suppression.
    """
    from .greedy_nms import emit_greedy_suppression
    from .launch import launch
    from .scan import emit_scan
    from .segmented_argsort import (
        emit_row_topk_sort,
        emit_segmented_sort,
        topk_pad_key,
        topk_row_stride,
    )
    from .subgroup import check_subgroup

    if subgroup is not None and target_kind != "opencl":
        raise ValueError(f"box_nms: Intel subgroups are an OpenCL feature, not {target_kind}'s")
    check_subgroup(subgroup, min(threads, 256), "box_nms")
    attrs, batch, n, k = gpu_setup(shape, attrs)
    written = output_rows(n, attrs["out_rows"])
    total = batch * n
    cs, ii = attrs["coord_start"], attrs["id_index"]
    topk, in_fmt, out_fmt = attrs["topk"], attrs["in_format"], attrs["out_format"]
    lowest = tirx.const(float(np.finfo(dtype).min), dtype)
    thresh = tirx.const(attrs["overlap_thresh"], dtype)
    minus_one = tirx.const(-1.0, dtype)
    flat = threads  # work-items per group of the one-item-per-element launches
    block = max(2, min(threads, 256))  # the sort's block (a power of two >= 2)
    # with topk well below N only the first topk of each sorted row are needed
    top_only = 0 < topk and topk * 2 <= n

    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("box_nms")
            T.func_attr({"tirx.is_scheduled": True, "global_symbol": "box_nms"})
            data = T.buffer_proxy(T.match_buffer(T.arg("data", T.handle()), (batch, n, k), dtype))
            out = T.buffer_proxy(
                T.match_buffer(T.arg("out", T.handle()), (batch, written, k), dtype)
            )

            def workspace(shape_, dt):
                return T.buffer_proxy(T.alloc_buffer(shape_, dt, scope="global"))

            # the top-k path sorts rows padded to whole blocks, keeping k per row
            span = batch * topk_row_stride(n, block) if top_only else total
            keys = workspace((span,), dtype)
            order = None if top_only else workspace((total,), "int32")
            work = [
                (
                    workspace((span,), dtype),
                    workspace((span,), "int32"),
                    workspace((span,), "int32"),
                )
                for _ in range(2)
            ]
            count = workspace((batch,), "int32")
            rows = workspace((batch, n, k), dtype)
            flags = workspace((batch, n), "int32")
            position = workspace((batch, n), "int32")
            kept = workspace((batch, n), "int32") if subgroup else None

            # 1. keys (top-k path: row b at b * stride, padding keys past n)
            if top_only:
                stride = topk_row_stride(n, block)
                g_frame, t_frame, bx, tx = launch(span // block, block)
                with g_frame, t_frame:
                    g = bx * block + tx
                    b, i = g // stride, g % stride
                    key = sort_key(data, b, tirx.min(i, n - 1), attrs, dtype)
                    keys[g] = tirx.Select(i < n, key, topk_pad_key(dtype, True))
            else:
                g_frame, t_frame, bx, tx = launch(-(-total // flat), flat)
                with g_frame, t_frame:
                    g = bx * flat + tx
                    with T.If(g < total):
                        with T.Then():
                            keys[g] = sort_key(data, g // n, g % n, attrs, dtype)

            # 2. sort each row by key, descending, stable (only its first topk if set)
            if top_only:
                sorted_keys, sorted_flat, _ = emit_row_topk_sort(
                    keys, work, batch, n, topk, dtype, True, block, subgroup
                )
                searched = topk

                def sorted_key(b, j):
                    return sorted_keys[b * stride + j]

                def sorted_index(b, j):
                    return sorted_flat[b * stride + j] - b * stride
            else:
                sorted_keys, _, _ = emit_segmented_sort(
                    keys,
                    order,
                    work,
                    total,
                    lambda g, scratch: g // n,
                    lambda s: s * n,
                    dtype,
                    True,
                    block,
                    subgroup,
                )
                searched = n

                def sorted_key(b, j):
                    return sorted_keys[b * n + j]

                def sorted_index(b, j):
                    return order[b * n + j]

            # 3. valid boxes per row: the first invalid key in the sorted row
            g_frame, t_frame, bx, tx = launch(-(-batch // flat), flat)
            with g_frame, t_frame:
                b = bx * flat + tx
                with T.If(b < batch):
                    with T.Then():
                        found = T.buffer_proxy(T.alloc_buffer((3,), "int32", scope="local"))
                        found[0] = 0
                        found[1] = searched
                        with T.While(found[0] < found[1]):
                            found[2] = (found[0] + found[1]) // 2
                            with T.If(sorted_key(b, found[2]) > lowest):
                                with T.Then():
                                    found[0] = found[2] + 1
                                with T.Else():
                                    found[1] = found[2]
                        count[b] = found[0] if topk < 0 else tirx.min(found[0], topk)

            # 4. gather in score order; the rest of the row is -1
            g_frame, t_frame, bx, tx = launch(-(-total // flat), flat)
            with g_frame, t_frame:
                g = bx * flat + tx
                with T.If(g < total):
                    with T.Then():
                        b, j = g // n, g % n
                        keep = j < count[b]
                        source = sorted_index(b, tirx.min(j, searched - 1))
                        for f in range(k):
                            rows[b, j, f] = tirx.Select(keep, data[b, source, f], minus_one)
                        flags[b, j] = tirx.Select(keep, 1, 0)

            # 5. suppression
            def corner(b, j):
                return _corner(lambda f: rows[b, j, f], cs, in_fmt, dtype)

            def suppresses(b, i, j):
                overlaps = _iou(corner(b, i), corner(b, j), dtype) > thresh
                if ii >= 0 and not attrs["force_suppress"]:
                    return tirx.all(same_class(rows[b, i, ii], rows[b, j, ii]), overlaps)
                return overlaps

            def kill(b, j):
                flags[b, j] = 0

            emit_greedy_suppression(
                batch,
                lambda b: count[b],
                lambda b, j: flags[b, j] == 1,
                kill,
                suppresses,
                threads,
                target_kind,
                subgroup,
                kept,
            )

            # 6. where each kept box goes
            emit_scan(flags, position, batch, n, "int32", True, min(threads, 256), subgroup)

            # 7. compaction (and the output format)
            g_frame, t_frame, bx, tx = launch(-(-total // flat), flat)
            with g_frame, t_frame:
                g = bx * flat + tx
                with T.If(g < total):
                    with T.Then():
                        b, j = g // n, g % n
                        kept = position[b, n - 1] + flags[b, n - 1]
                        with T.If(tirx.all(flags[b, j] == 1, position[b, j] < written)):
                            with T.Then():
                                dst = position[b, j]
                                for f in range(k):
                                    out[b, dst, f] = rows[b, j, f]
                                if in_fmt != out_fmt:
                                    x1, y1, x2, y2 = _corner(
                                        lambda f: rows[b, j, f], cs, in_fmt, dtype
                                    )
                                    half = tirx.const(0.5, dtype)
                                    if out_fmt == "center":
                                        values = (
                                            (x1 + x2) * half,
                                            (y1 + y2) * half,
                                            x2 - x1,
                                            y2 - y1,
                                        )
                                    else:
                                        values = (x1, y1, x2, y2)
                                    for c in range(4):
                                        out[b, dst, cs + c] = values[c]
                        with T.If(tirx.all(j >= kept, j < written)):
                            with T.Then():
                                for f in range(k):
                                    out[b, j, f] = minus_one
    return ib.get()
