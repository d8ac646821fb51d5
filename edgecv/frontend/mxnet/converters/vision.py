"""Converters for MXNet's detection operators, lowered to edgecv's own TIR operators."""

from __future__ import annotations

import json

import numpy as np
from tvm import relax

from ....board.errors import EdgecvError
from ..attrs import Attrs
from ..context import Context
from .registry import converts


@converts("_contrib_box_nms", "_contrib_box_non_maximum_suppression")
def contrib_box_nms(ctx: Context, inputs: list, attrs: Attrs) -> list:
    from ....ops import box_nms as box_nms_op  # the TIR ops import topi: load on first use

    kwargs = dict(
        overlap_thresh=attrs.float("overlap_thresh", 0.5),
        valid_thresh=attrs.float("valid_thresh", 0.0),
        topk=attrs.int("topk", -1),
        coord_start=attrs.int("coord_start", 2),
        score_index=attrs.int("score_index", 1),
        id_index=attrs.int("id_index", -1),
        background_id=attrs.int("background_id", -1),
        force_suppress=attrs.bool("force_suppress", False),
        in_format=attrs.str("in_format", "corner", choices=("corner", "center")),
        out_format=attrs.str("out_format", "corner", choices=("corner", "center")),
    )
    shape = ctx.shape(inputs[0])
    kwargs["out_rows"] = _rows_kept(ctx, shape)
    data = _top_class_rows_first(ctx, inputs[0], kwargs)
    shape = ctx.shape(data)
    out = ctx.bb.emit_te(box_nms_op.box_nms, data, primfunc_name_hint="box_nms", **kwargs)
    _tag(ctx, out, op="box_nms", shape=list(shape), dtype=ctx.dtype(inputs[0]), **kwargs)
    return [out]


def _rows_kept(ctx: Context, shape: tuple[int, ...]) -> int:
    """How many of box_nms's output rows its graph keeps: ``K`` when its only reader is
    ``slice_axis`` of rows ``[0, K)`` (GluonCV's detectors keep their first 100 or
    ``post_nms`` rows), else -1 (all). The kernel then writes just those rows: YOLOv3's
    NMS output is 80 classes x 16,128 anchors x 6 values (31 MB) before the cut, 2.4 KB
    after it."""
    reader = ctx.only_reader(0)
    if reader is None or reader.op != "slice_axis" or len(shape) < 2:
        return -1
    attrs = Attrs(reader.op, reader.name, reader.attrs)
    n = shape[-2]
    try:  # a slice with bad attributes keeps every row here; its own converter says why
        axis, begin, end = attrs.int("axis"), attrs.int("begin"), attrs.int("end", None)
    except EdgecvError:
        return -1
    # a negative end counts from the end of the rows written: leave those uncut
    if axis not in (-2, len(shape) - 2) or begin not in (0, -n) or end is None:
        return -1
    return end if 0 < end < n else -1


def _top_class_rows_first(ctx: Context, data: relax.Expr, nms: dict) -> relax.Expr:
    """``data``, or where it is GluonCV's per-class rows (below), the same NMS input
    made of only the rows ``box_nms`` can keep (:mod:`edgecv.ops.class_rows`).

    GluonCV's YOLOv3 output layer makes, per scale, one row per anchor and class:
    ``reshape(permute_dims(concat((ids, scores, tile(boxes))), [1, 0, ...]), (B, -1, 6))``
    with ``scores`` its class scores ``(B, ..., C)`` moved class-first and ``ids`` the
    class numbers; the scales' rows are concatenated before the NMS. Where ``box_nms``
    keeps at most ``topk`` rows, reads ``(id, score, box)`` at positions 0, 1, 2 and a
    following slice keeps at most its first ``out_rows`` rows, each such piece of more
    than ``topk`` rows becomes its first ``topk`` rows by the NMS's own sort key, in
    their order: the NMS then gives the same rows (yolo3_mobilenet1.0_coco: 1.29M rows,
    31 MB, become 1,200). Anything else is left as it is."""
    from ....ops import class_rows

    topk, out_rows = nms["topk"], nms["out_rows"]
    layout = (nms["id_index"], nms["score_index"], nms["coord_start"]) == (0, 1, 2)
    if topk <= 0 or out_rows <= 0 or not layout or len(ctx.shape(data)) != 3:
        return data
    call = _bound(ctx, data, "relax.concat")
    pieces = list(_tuple_fields(ctx, call.args[0])) if call is not None else [data]
    if call is not None and int(call.attrs.axis) not in (1, -2):
        return data
    made, changed = [], False
    for piece in pieces:
        found = _class_rows_of(ctx, piece) if ctx.shape(piece)[1] > topk else None
        if found is None:
            made.append(piece)
            continue
        scores, boxes = found
        rows = ctx.bb.emit_te(
            class_rows.top_class_rows,
            scores,
            boxes,
            topk,
            nms["valid_thresh"],
            nms["background_id"],
            primfunc_name_hint="top_class_rows",
        )
        _tag(
            ctx,
            rows,
            op="top_class_rows",
            scores_shape=list(ctx.shape(scores)),
            boxes_shape=list(ctx.shape(boxes)),
            dtype=ctx.dtype(scores),
            k=topk,
            valid_thresh=nms["valid_thresh"],
            background_id=nms["background_id"],
        )
        made.append(rows)
        changed = True
    if not changed or sum(ctx.shape(p)[1] for p in made) < out_rows:
        return data
    return made[0] if len(made) == 1 else ctx.emit(relax.op.concat(made, axis=1))


def _bound(ctx: Context, expr: relax.Expr, op: str) -> relax.Call | None:
    """The call of ``op`` bound to the variable ``expr``, else None."""
    if not isinstance(expr, relax.Var):
        return None
    value = ctx.bb.lookup_binding(expr)
    if isinstance(value, relax.Call) and getattr(value.op, "name", None) == op:
        return value
    return None


def _tuple_fields(ctx: Context, expr: relax.Expr) -> list:
    if isinstance(expr, relax.Var):
        expr = ctx.bb.lookup_binding(expr)
    return list(expr.fields) if isinstance(expr, relax.Tuple) else []


def _class_rows_of(ctx: Context, piece: relax.Expr) -> tuple[relax.Expr, relax.Expr] | None:
    """(scores ``(B, N, C)``, boxes ``(B, N, 4)``) when ``piece`` is one scale's rows as
    GluonCV's YOLOv3 makes them (see :func:`_top_class_rows_first`), else None."""
    reshape = _bound(ctx, piece, "relax.reshape")
    moved = None if reshape is None else _bound(ctx, reshape.args[0], "relax.permute_dims")
    rows = None if moved is None else _bound(ctx, moved.args[0], "relax.concat")
    if rows is None:
        return None
    shape = ctx.shape(rows)  # (C, B, ..., 6)
    rank = len(shape)
    if rank < 3 or shape[-1] != 6 or int(rows.attrs.axis) not in (-1, rank - 1):
        return None
    if [int(a) for a in moved.attrs.axes] != [1, 0, *range(2, rank)]:
        return None
    fields = _tuple_fields(ctx, rows.args[0])
    if len(fields) != 3 or [ctx.shape(f)[-1] for f in fields] != [1, 1, 4]:
        return None
    ids, scores5, tiled = fields
    classes, batch, middle = shape[0], shape[1], shape[2:-1]
    n = int(np.prod(middle, dtype=np.int64))
    # scores: expand_dims(permute_dims(S, [k, 0, 1, ..., k-1]), -1), S (B, ..., C)
    expanded = _bound(ctx, scores5, "relax.expand_dims")
    back = None if expanded is None else _bound(ctx, expanded.args[0], "relax.permute_dims")
    if back is None or [int(a) for a in expanded.attrs.axis] not in ([rank - 1], [-1]):
        return None
    source = back.args[0]
    k = len(ctx.shape(source)) - 1
    if [int(a) for a in back.attrs.axes] != [k, *range(k)]:
        return None
    # boxes: tile(X, [C, 1, ...]), X (B, ..., 4)
    tile = _bound(ctx, tiled, "relax.tile")
    if tile is None or [int(r) for r in tile.attrs.repeats] != [classes] + [1] * (rank - 1):
        return None
    if ctx.shape(tile.args[0]) != (batch, *middle, 4) or not _are_class_ids(ctx, ids, scores5):
        return None
    scores = ctx.emit(relax.op.reshape(source, (batch, n, classes)))
    boxes = ctx.emit(relax.op.reshape(tile.args[0], (batch, n, 4)))
    return scores, boxes


def _are_class_ids(ctx: Context, ids: relax.Expr, scores5: relax.Expr) -> bool:
    """Whether ``ids`` is ``scores5 * 0 + c`` for class ``c`` along the first axis:
    GluonCV's ``broadcast_add(scores * 0, arange(C).reshape(C, 1, ...))``."""
    add = _bound(ctx, ids, "relax.add")
    if add is None:
        return False
    for zeros, numbers in (add.args, add.args[::-1]):
        times = _bound(ctx, zeros, "relax.multiply")
        if times is None or not times.args[0].same_as(scores5):
            continue
        zero = ctx.const_value(times.args[1])
        shaped = _bound(ctx, numbers, "relax.reshape")
        value = ctx.const_value(shaped.args[0]) if shaped is not None else None
        if zero is None or zero.size != 1 or float(zero.reshape(-1)[0]) != 0.0 or value is None:
            continue
        classes = ctx.shape(ids)[0]
        if value.size == classes and np.array_equal(value.reshape(-1), np.arange(classes)):
            return True
    return False


def _tag(ctx: Context, out: relax.Expr, **spec) -> None:
    """Tag the kernel computing ``out`` with its operator and attributes: GPU builds
    swap in the GPU version of the same operator (edgecv.codegen.op_versions)."""
    call = ctx.bb.lookup_binding(out)
    gv = call.args[0]
    tagged = ctx.bb.get()[gv].with_attr("edgecv.op", json.dumps(spec))
    ctx.bb.update_func(gv, tagged)


@converts("_contrib_box_decode")
def contrib_box_decode(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    from ....ops import box_decode as box_decode_op

    kwargs = dict(
        std0=attrs.float("std0", 1.0),
        std1=attrs.float("std1", 1.0),
        std2=attrs.float("std2", 1.0),
        std3=attrs.float("std3", 1.0),
        clip=attrs.float("clip", -1.0),
        format=attrs.str("format", "center", choices=("corner", "center")),
    )
    return ctx.bb.emit_te(
        box_decode_op.box_decode, inputs[0], inputs[1], primfunc_name_hint="box_decode", **kwargs
    )


@converts("_contrib_ROIAlign")
def contrib_roi_align(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    from ....ops import roi_align as roi_align_op

    kwargs = roi_align_op.roi_align_attrs(
        pooled_size=attrs.ints("pooled_size"),
        spatial_scale=attrs.float("spatial_scale"),
        sample_ratio=attrs.int("sample_ratio", -1),
        position_sensitive=attrs.bool("position_sensitive", False),
        aligned=attrs.bool("aligned", False),
    )
    data, rois = inputs
    out = ctx.bb.emit_te(
        roi_align_op.roi_align, data, rois, primfunc_name_hint="roi_align", **kwargs
    )
    shapes = {
        "data_shape": [int(d) for d in data.ty.shape],
        "rois_shape": [int(d) for d in rois.ty.shape],
    }
    _tag(ctx, out, op="roi_align", dtype=str(data.ty.dtype), **shapes, **kwargs)
    return out


@converts("_contrib_MultiBoxPrior")
def contrib_multibox_prior(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    from ....ops import multibox

    kwargs = dict(
        sizes=attrs.floats("sizes", (1.0,)),
        ratios=attrs.floats("ratios", (1.0,)),
        clip=attrs.bool("clip", False),
        steps=attrs.floats("steps", (-1.0, -1.0)),
        offsets=attrs.floats("offsets", (0.5, 0.5)),
    )
    return ctx.bb.emit_te(
        multibox.multibox_prior, inputs[0], primfunc_name_hint="multibox_prior", **kwargs
    )


@converts("_contrib_MultiBoxDetection")
def contrib_multibox_detection(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    from ....ops import multibox

    kwargs = dict(
        clip=attrs.bool("clip", True),
        threshold=attrs.float("threshold", 0.01),
        background_id=attrs.int("background_id", 0),
        nms_threshold=attrs.float("nms_threshold", 0.5),
        force_suppress=attrs.bool("force_suppress", False),
        variances=attrs.floats("variances", (0.1, 0.1, 0.2, 0.2)),
        nms_topk=attrs.int("nms_topk", -1),
    )
    out = ctx.bb.emit_te(
        multibox.multibox_detection, *inputs, primfunc_name_hint="multibox_detection", **kwargs
    )
    shapes = [[int(d) for d in x.ty.shape] for x in inputs]
    _tag(ctx, out, op="multibox_detection", shapes=shapes, dtype=str(inputs[0].ty.dtype), **kwargs)
    return out
