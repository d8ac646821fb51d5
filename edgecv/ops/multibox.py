"""``_contrib_MultiBoxPrior`` and ``_contrib_MultiBoxDetection`` (MXNet's SSD operators).

MXNet 1.9.1 semantics, checked against its operators in tests/ops/test_multibox.py.

**MultiBoxPrior** ``(B, C, H, W) -> (1, H * W * A, 4)`` corner anchors, ``A = sizes +
ratios - 1``: per pixel centre ``((x + offset_x) * step_x, (y + offset_y) * step_y)``
(a step <= 0 means ``1 / W`` or ``1 / H``), first every size at the first ratio, then
every further ratio at the first size; a box is ``size * H / W * sqrt(ratio)`` wide
and ``size / sqrt(ratio)`` high; ``clip`` clamps to [0, 1]. Elementwise: one
``te.compute`` serves every target.

**MultiBoxDetection** ``cls_prob (B, C, N), loc_pred (B, N * 4), anchors (1, N, 4) ->
(B, N, 6)`` rows ``[class, score, x1, y1, x2, y2]``, per batch:

1. candidates, in anchor order: the best non-background class (class 0 is the
   background; MXNet 1.9.1 ignores ``background_id``) whose probability reaches
   ``threshold``; the box decoded from the anchor with ``variances`` and clamped to
   [0, 1] when ``clip``. The candidates fill the first rows, every later row is -1;
2. when ``0 < nms_threshold <= 1``: the first ``nkeep`` rows (``nms_topk`` if positive,
   at most the candidates) become the candidates sorted by score, descending and
   stable; rows ``nkeep..candidates`` keep their anchor-order candidate with class -1;
   then greedy NMS over the first ``nkeep`` rows: a row overlapping an earlier kept
   row of the same class (any class with ``force_suppress``) by IoU >= the threshold
   gets class -1 (its score and box stay).

The CPU version is one IR loop per batch over TVM's stable argsort; the GPU version
is launches over anchors (candidates), the three-stage scan (candidate positions),
the segmented argsort, a scatter/gather, and a work-group per batch for the NMS.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import te, tirx, topi
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

__all__ = [
    "multibox_prior",
    "multibox_prior_reference",
    "multibox_detection",
    "multibox_detection_gpu",
    "multibox_detection_reference",
]


# -- MultiBoxPrior -------------------------------------------------------------------


def _prior_shapes(sizes, ratios) -> list[tuple[float, float]]:
    """(size, sqrt(ratio)) of each anchor of a pixel, in MXNet's order."""
    sizes, ratios = [float(s) for s in sizes], [float(r) for r in ratios]
    if not sizes or not ratios or min(sizes) <= 0 or min(ratios) <= 0:
        raise ValueError(
            f"MultiBoxPrior: sizes and ratios must be non-empty and positive, "
            f"found sizes={sizes} ratios={ratios}"
        )
    first = math.sqrt(ratios[0])
    return [(s, first) for s in sizes] + [(sizes[0], math.sqrt(r)) for r in ratios[1:]]


def _prior_geometry(height, width, steps, offsets):
    step_y = steps[0] if steps[0] > 0 else 1.0 / height
    step_x = steps[1] if steps[1] > 0 else 1.0 / width
    return step_y, step_x, float(offsets[0]), float(offsets[1])


def multibox_prior_reference(
    data_shape, sizes=(1.0,), ratios=(1.0,), clip=False, steps=(-1.0, -1.0), offsets=(0.5, 0.5)
) -> np.ndarray:
    """The anchors, in float64 then float32, from the definition."""
    _, _, height, width = data_shape
    shapes = _prior_shapes(sizes, ratios)
    step_y, step_x, off_y, off_x = _prior_geometry(height, width, steps, offsets)
    out = []
    for y in range(height):
        cy = (y + off_y) * step_y
        for x in range(width):
            cx = (x + off_x) * step_x
            for size, root in shapes:
                w = size * height / width * root / 2
                h = size / root / 2
                out.append([cx - w, cy - h, cx + w, cy + h])
    out = np.asarray(out, np.float64).reshape(1, -1, 4)
    return (np.clip(out, 0, 1) if clip else out).astype(np.float32)


def multibox_prior(
    data: te.Tensor, sizes=(1.0,), ratios=(1.0,), clip=False, steps=(-1.0, -1.0), offsets=(0.5, 0.5)
) -> te.Tensor:
    """The anchors as a tensor expression (they depend only on the input's shape)."""
    shape = [int(s) for s in data.shape]
    if len(shape) != 4:
        raise ValueError(f"MultiBoxPrior: data must be (B, C, H, W), found shape {tuple(shape)}")
    _, _, height, width = shape
    shapes = _prior_shapes(sizes, ratios)
    step_y, step_x, off_y, off_x = _prior_geometry(height, width, steps, offsets)
    per_pixel = len(shapes)
    half_w = [s * height / width * r / 2 for s, r in shapes]
    half_h = [s / r / 2 for s, r in shapes]

    def table(values, a):
        expr = tirx.const(values[-1], "float32")
        for k in range(per_pixel - 2, -1, -1):
            expr = tirx.Select(a == k, tirx.const(values[k], "float32"), expr)
        return expr

    def anchor(_, i, c):
        a = i % per_pixel
        x = (i // per_pixel) % width
        y = i // (per_pixel * width)
        cx = (x.astype("float32") + off_x) * tirx.const(step_x, "float32")
        cy = (y.astype("float32") + off_y) * tirx.const(step_y, "float32")
        w, h = table(half_w, a), table(half_h, a)
        value = tirx.Select(
            c == 0, cx - w, tirx.Select(c == 1, cy - h, tirx.Select(c == 2, cx + w, cy + h))
        )
        if clip:
            value = tirx.max(
                tirx.const(0.0, "float32"), tirx.min(tirx.const(1.0, "float32"), value)
            )
        return value

    return te.compute((1, height * width * per_pixel, 4), anchor, name="multibox_prior")


# -- MultiBoxDetection: reference ----------------------------------------------------


DETECTION_DEFAULTS = dict(
    clip=True,
    threshold=0.01,
    background_id=0,
    nms_threshold=0.5,
    force_suppress=False,
    variances=(0.1, 0.1, 0.2, 0.2),
    nms_topk=-1,
)


def _detection_attrs(cls_shape, loc_shape, anchor_shape, attrs: dict) -> dict:
    attrs = {**DETECTION_DEFAULTS, **attrs}
    unknown = set(attrs) - set(DETECTION_DEFAULTS)
    if unknown:
        raise ValueError(f"MultiBoxDetection: unknown attributes {sorted(unknown)}")
    cls_shape, loc_shape = tuple(cls_shape), tuple(loc_shape)
    anchor_shape = tuple(anchor_shape)
    if len(cls_shape) != 3 or cls_shape[1] < 2:
        raise ValueError(
            f"MultiBoxDetection: cls_prob must be (B, classes >= 2, N), found shape {cls_shape}"
        )
    batch, _, n = cls_shape
    if loc_shape != (batch, n * 4):
        raise ValueError(
            f"MultiBoxDetection: loc_pred must be (B, N * 4) = {(batch, n * 4)} for cls_prob "
            f"{cls_shape}, found shape {loc_shape}"
        )
    if anchor_shape != (1, n, 4):
        raise ValueError(
            f"MultiBoxDetection: anchors must be (1, N, 4) = {(1, n, 4)}, found shape "
            f"{anchor_shape}"
        )
    variances = tuple(float(v) for v in attrs["variances"])
    if len(variances) != 4:
        raise ValueError(f"MultiBoxDetection: variances needs 4 values, found {variances}")
    attrs["variances"] = variances
    return attrs


def _nms_on(attrs: dict) -> bool:
    return 0 < attrs["nms_threshold"] <= 1


def _decode(anchor, loc, variances, clip: bool, minimum, maximum, exp):
    al, at, ar, ab = anchor
    aw, ah = ar - al, ab - at
    ax, ay = (al + ar) * 0.5, (at + ab) * 0.5
    ox = loc[0] * variances[0] * aw + ax
    oy = loc[1] * variances[1] * ah + ay
    ow = exp(loc[2] * variances[2]) * aw * 0.5
    oh = exp(loc[3] * variances[3]) * ah * 0.5
    box = [ox - ow, oy - oh, ox + ow, oy + oh]
    if clip:
        box = [maximum(0.0, minimum(1.0, v)) for v in box]
    return box


def _overlap(p, q) -> float:
    w = max(0.0, min(p[2], q[2]) - max(p[0], q[0]))
    h = max(0.0, min(p[3], q[3]) - max(p[1], q[1]))
    inter = w * h
    union = (p[2] - p[0]) * (p[3] - p[1]) + (q[2] - q[0]) * (q[3] - q[1]) - inter
    return 0.0 if union <= 0 else inter / union


def multibox_detection_reference(
    cls_prob: np.ndarray, loc_pred: np.ndarray, anchors: np.ndarray, **attrs
) -> np.ndarray:
    """The operator, from the definition (float32 arithmetic, as MXNet's)."""
    attrs = _detection_attrs(cls_prob.shape, loc_pred.shape, anchors.shape, attrs)
    batch, classes, n = cls_prob.shape
    f32 = np.float32
    var = [f32(v) for v in attrs["variances"]]
    out = np.full((batch, n, 6), -1.0, np.float32)
    for b in range(batch):
        cands = []
        for i in range(n):
            probs = cls_prob[b, 1:, i]
            best = int(np.argmax(probs))  # the first of equal maxima, as MXNet's `>`
            score = probs[best]
            if score < f32(attrs["threshold"]):
                continue
            box = _decode(
                anchors[0, i],
                loc_pred[b, 4 * i : 4 * i + 4],
                var,
                attrs["clip"],
                np.minimum,
                np.maximum,
                np.exp,
            )
            cands.append([f32(best), score, *(f32(v) for v in box)])
        count = len(cands)
        if count:
            out[b, :count] = cands
        if not count or not _nms_on(attrs):
            continue
        order = sorted(range(count), key=lambda j: -cands[j][1])  # stable
        keep = count if attrs["nms_topk"] <= 0 else min(count, attrs["nms_topk"])
        out[b, :keep] = [cands[j] for j in order[:keep]]
        out[b, keep:count, 0] = -1
        for i in range(keep):
            if out[b, i, 0] < 0:
                continue
            for j in range(i + 1, keep):
                if out[b, j, 0] < 0:
                    continue
                if attrs["force_suppress"] or out[b, i, 0] == out[b, j, 0]:
                    if _overlap(out[b, i, 2:], out[b, j, 2:]) >= f32(attrs["nms_threshold"]):
                        out[b, j, 0] = -1
    return out


# -- MultiBoxDetection: TIR ----------------------------------------------------------


def _candidate(cls_prob, loc_pred, anchors, b, i, classes: int, attrs: dict, dtype: str):
    """(class or -1, score, x1, y1, x2, y2) of anchor ``i`` as expressions, with the
    best-class search as a local loop. Emitted inside an IRBuilder frame."""
    best = T.buffer_proxy(T.alloc_buffer((2,), dtype, scope="local"))  # score, class
    best[0] = cls_prob[b, 1, i]
    best[1] = tirx.const(0.0, dtype)
    with T.serial(2, classes) as j:
        with T.If(cls_prob[b, j, i] > best[0]):
            with T.Then():
                best[0] = cls_prob[b, j, i]
                best[1] = tirx.Cast(dtype, j - 1)
    valid = best[0] >= tirx.const(attrs["threshold"], dtype)
    f = lambda v: tirx.const(v, dtype)  # noqa: E731
    box = _decode(
        [anchors[0, i, c] for c in range(4)],
        [loc_pred[b, i * 4 + c] for c in range(4)],
        [f(v) for v in attrs["variances"]],
        attrs["clip"],
        lambda bound, v: tirx.min(f(bound), v),
        lambda bound, v: tirx.max(f(bound), v),
        tirx.exp,
    )
    return valid, [tirx.Select(valid, best[1], f(-1.0)), best[0], *box]


def _iou_at_least(out, b, i, j, thresh, dtype: str):
    """IoU(out[b, i], out[b, j]) >= thresh, with MXNet's division-free empty union."""
    zero = tirx.const(0.0, dtype)
    w = tirx.max(zero, tirx.min(out[b, i, 4], out[b, j, 4]) - tirx.max(out[b, i, 2], out[b, j, 2]))
    h = tirx.max(zero, tirx.min(out[b, i, 5], out[b, j, 5]) - tirx.max(out[b, i, 3], out[b, j, 3]))
    inter = w * h
    area_i = (out[b, i, 4] - out[b, i, 2]) * (out[b, i, 5] - out[b, i, 3])
    area_j = (out[b, j, 4] - out[b, j, 2]) * (out[b, j, 5] - out[b, j, 3])
    union = area_i + area_j - inter
    return tirx.Select(union > zero, inter / union, zero) >= thresh


def _cpu_ir(cls_prob, loc_pred, anchors, order, out, attrs: dict):
    batch, classes, n = (int(s) for s in cls_prob.shape)
    dtype = cls_prob.dtype
    minus_one = tirx.const(-1.0, dtype)
    thresh = tirx.const(attrs["nms_threshold"], dtype)
    topk = attrs["nms_topk"]
    with IRBuilder() as ib:
        cls_prob, loc_pred, anchors = (T.buffer_proxy(x) for x in (cls_prob, loc_pred, anchors))
        order, out = T.buffer_proxy(order), T.buffer_proxy(out)
        with T.parallel(0, batch) as b:
            count = T.buffer_proxy(T.alloc_buffer((2,), "int32", scope="local"))
            count[0] = 0
            with T.serial(0, n) as i:  # candidates in anchor order
                valid, row = _candidate(cls_prob, loc_pred, anchors, b, i, classes, attrs, dtype)
                with T.If(valid):
                    with T.Then():
                        for c in range(6):
                            out[b, count[0], c] = row[c]
                        count[0] = count[0] + 1
            with T.serial(0, n) as j:
                with T.If(j >= count[0]):
                    with T.Then():
                        for c in range(6):
                            out[b, j, c] = minus_one
            if _nms_on(attrs):
                count[1] = count[0] if topk <= 0 else tirx.min(count[0], topk)
                with T.serial(0, n) as j:  # rows past nkeep keep their candidate, class -1
                    with T.If(tirx.all(j >= count[1], j < count[0])):
                        with T.Then():
                            out[b, j, 0] = minus_one
                with T.serial(0, n) as j:  # the first nkeep: sorted candidates
                    with T.If(j < count[1]):
                        with T.Then():
                            valid, row = _candidate(
                                cls_prob, loc_pred, anchors, b, order[b, j], classes, attrs, dtype
                            )
                            for c in range(6):
                                out[b, j, c] = row[c]
                with T.serial(0, count[1]) as i:
                    with T.If(out[b, i, 0] >= tirx.const(0.0, dtype)):
                        with T.Then():
                            with T.serial(i + 1, count[1]) as j:
                                alive = out[b, j, 0] >= tirx.const(0.0, dtype)
                                if not attrs["force_suppress"]:
                                    alive = tirx.all(alive, out[b, i, 0] == out[b, j, 0])
                                with T.If(alive):
                                    with T.Then():
                                        with T.If(_iou_at_least(out, b, i, j, thresh, dtype)):
                                            with T.Then():
                                                out[b, j, 0] = minus_one
    return ib.get()


def _score_keys(cls_prob: te.Tensor, threshold: float) -> te.Tensor:
    """Per anchor: its best non-background probability when it is a candidate, else
    the lowest float (so candidates sort first, by score)."""
    batch, classes, n = (int(s) for s in cls_prob.shape)
    dtype = cls_prob.dtype
    lowest = tirx.const(float(np.finfo(dtype).min), dtype)
    j = te.reduce_axis((1, classes), name="j")
    best = te.compute((batch, n), lambda b, i: te.max(cls_prob[b, j, i], axis=j), name="best")
    return te.compute(
        (batch, n),
        lambda b, i: tirx.Select(best[b, i] >= tirx.const(threshold, dtype), best[b, i], lowest),
        name="multibox_keys",
    )


def multibox_detection(
    cls_prob: te.Tensor, loc_pred: te.Tensor, anchors: te.Tensor, **attrs
) -> te.Tensor:
    """The operator as tensor expressions for the CPU build."""
    shapes = [[int(s) for s in t.shape] for t in (cls_prob, loc_pred, anchors)]
    attrs = _detection_attrs(*shapes, attrs)
    batch, _, n = shapes[0]
    keys = _score_keys(cls_prob, attrs["threshold"])
    order = topi.argsort(keys, axis=1, is_ascend=False, dtype="int32")  # stable
    return te.extern(
        [(batch, n, 6)],
        [cls_prob, loc_pred, anchors, order],
        lambda ins, outs: _cpu_ir(*ins, outs[0], attrs),
        dtype=[cls_prob.dtype],
        in_buffers=[
            tvm.tirx.decl_buffer(t.shape, t.dtype, name)
            for t, name in (
                (cls_prob, "cls_prob"),
                (loc_pred, "loc_pred"),
                (anchors, "anchors"),
                (order, "order"),
            )
        ],
        out_buffers=[tvm.tirx.decl_buffer((batch, n, 6), cls_prob.dtype, "out")],
        name="multibox_detection",
        tag="multibox_detection",
    )


def multibox_detection_gpu(
    cls_shape,
    loc_shape,
    anchor_shape,
    dtype: str = "float32",
    target_kind: str = "opencl",
    threads: int = 256,
    subgroup: int | None = None,
    **attrs,
) -> tirx.PrimFunc:
    """The operator as a scheduled GPU PrimFunc ``(cls_prob, loc_pred, anchors, out)``.

    Launches: (1) per anchor, its candidate row, sort key and flag; (2) an exclusive
    scan of the flags gives each candidate its anchor-order row; (3) the segmented
    argsort of the keys (batches are the segments); (4) per row, scatter the
    candidate it receives and gather the sorted one (with ``nms_topk`` at most half the
    anchors, (3) is the top-k sort: it keeps only the first ``nms_topk`` of each
    batch); (5) one work-group per batch runs
    the greedy NMS, its work-items clearing the later rows an earlier kept row
    overlaps (:mod:`.greedy_nms`). Without NMS (threshold outside (0, 1]) only (1), (2)
    and (4) run. ``subgroup``: the Intel subgroup size (OpenCL) for the subgroup
    variants of the scan, the sort and the suppression.
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
        raise ValueError(
            f"MultiBoxDetection: Intel subgroups are an OpenCL feature, not {target_kind}'s"
        )
    check_subgroup(subgroup, min(threads, 256), "MultiBoxDetection")
    cls_shape, loc_shape = tuple(int(s) for s in cls_shape), tuple(int(s) for s in loc_shape)
    anchor_shape = tuple(int(s) for s in anchor_shape)
    attrs = _detection_attrs(cls_shape, loc_shape, anchor_shape, attrs)
    batch, classes, n = cls_shape
    total = batch * n
    nms = _nms_on(attrs)
    topk = attrs["nms_topk"]
    lowest = tirx.const(float(np.finfo(dtype).min), dtype)
    minus_one = tirx.const(-1.0, dtype)
    zero = tirx.const(0.0, dtype)
    thresh = tirx.const(attrs["nms_threshold"], dtype)
    block = max(2, min(threads, 256))  # the sort's block (a power of two >= 2)
    top_only = nms and 0 < topk and topk * 2 <= n

    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("multibox_detection")
            T.func_attr({"tirx.is_scheduled": True, "global_symbol": "multibox_detection"})

            def param(name, shape):
                return T.buffer_proxy(T.match_buffer(T.arg(name, T.handle()), shape, dtype))

            cls_prob = param("cls_prob", cls_shape)
            loc_pred = param("loc_pred", loc_shape)
            anchors = param("anchors", anchor_shape)
            out = param("out", (batch, n, 6))

            def workspace(shape_, dt):
                return T.buffer_proxy(T.alloc_buffer(shape_, dt, scope="global"))

            rows = workspace((batch, n, 6), dtype)
            # the top-k path sorts rows padded to whole blocks (row b at b * stride)
            stride = topk_row_stride(n, block) if top_only else n
            keys = workspace((batch * stride,), dtype)
            flags = workspace((batch, n), "int32")
            position = workspace((batch, n), "int32")
            kept = workspace((batch, n), "int32") if nms and subgroup else None
            if nms:
                order = None if top_only else workspace((total,), "int32")
                span = batch * stride
                work = [
                    (
                        workspace((span,), dtype),
                        workspace((span,), "int32"),
                        workspace((span,), "int32"),
                    )
                    for _ in range(2)
                ]
            if top_only:  # padding keys sort after every candidate
                g_frame, t_frame, bx, tx = launch(batch * stride // block, block)
                with g_frame, t_frame:
                    g = bx * block + tx
                    with T.If(g % stride >= n):
                        with T.Then():
                            keys[g] = topk_pad_key(dtype, True)

            # 1. candidates
            g_frame, t_frame, bx, tx = launch(-(-total // threads), threads)
            with g_frame, t_frame:
                g = bx * threads + tx
                with T.If(g < total):
                    with T.Then():
                        b, i = g // n, g % n
                        valid, row = _candidate(
                            cls_prob, loc_pred, anchors, b, i, classes, attrs, dtype
                        )
                        for c in range(6):
                            rows[b, i, c] = row[c]
                        keys[b * stride + i] = tirx.Select(valid, row[1], lowest)
                        flags[b, i] = tirx.Select(valid, 1, 0)

            # 2. each candidate's row in anchor order
            emit_scan(flags, position, batch, n, "int32", True, min(threads, 256), subgroup)

            # 3. sort (only the first nms_topk of each batch when that is at most half)
            if nms and top_only:
                sorted_keys, sorted_flat, _ = emit_row_topk_sort(
                    keys, work, batch, n, topk, dtype, True, block, subgroup
                )

                def sorted_index(b, i):
                    return sorted_flat[b * stride + i] - b * stride
            elif nms:
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

                def sorted_index(b, i):
                    return order[b * n + i]

            # 4. scatter (anchor order) and gather (score order)
            g_frame, t_frame, bx, tx = launch(-(-total // threads), threads)
            with g_frame, t_frame:
                g = bx * threads + tx
                with T.If(g < total):
                    with T.Then():
                        b, i = g // n, g % n
                        count = position[b, n - 1] + flags[b, n - 1]
                        keep = (count if topk <= 0 else tirx.min(count, topk)) if nms else 0
                        dst = position[b, i]
                        with T.If(tirx.all(flags[b, i] == 1, dst >= keep)):
                            with T.Then():
                                for c in range(6):
                                    value = rows[b, i, c]
                                    out[b, dst, c] = minus_one if (nms and c == 0) else value
                        with T.If(i >= count):
                            with T.Then():
                                for c in range(6):
                                    out[b, i, c] = minus_one
                        if nms:
                            with T.If(i < keep):
                                with T.Then():
                                    src = sorted_index(b, i)
                                    for c in (0, 2, 3, 4, 5):
                                        out[b, i, c] = rows[b, src, c]
                                    # the score is the sorted key (reading the sort's
                                    # keys also keeps TVM from compacting their buffer
                                    # away when the last merge pass only writes it)
                                    out[b, i, 1] = sorted_keys[b * stride + i]

            # 5. greedy NMS
            if nms:

                def count_of(b):
                    count = position[b, n - 1] + flags[b, n - 1]
                    return count if topk <= 0 else tirx.min(count, topk)

                def suppresses(b, i, j):
                    overlaps = _iou_at_least(out, b, i, j, thresh, dtype)
                    if attrs["force_suppress"]:
                        return overlaps
                    return tirx.all(out[b, i, 0] == out[b, j, 0], overlaps)

                def kill(b, j):
                    out[b, j, 0] = minus_one

                emit_greedy_suppression(
                    batch,
                    count_of,
                    lambda b, j: out[b, j, 0] >= zero,
                    kill,
                    suppresses,
                    threads,
                    target_kind,
                    subgroup,
                    kept,
                )
    return ib.get()
