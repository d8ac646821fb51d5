"""Converters for MXNet's detection operators, lowered to edgecv's own TIR operators."""

from __future__ import annotations

import json

from tvm import relax

from ...errors import EdgecvError
from ..attrs import Attrs
from ..context import Context
from .registry import converts


@converts("_contrib_box_nms", "_contrib_box_non_maximum_suppression")
def contrib_box_nms(ctx: Context, inputs: list, attrs: Attrs) -> list:
    from ...ops import box_nms as box_nms_op  # the TIR ops import topi: load on first use

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
    out = ctx.bb.emit_te(box_nms_op.box_nms, inputs[0], primfunc_name_hint="box_nms", **kwargs)
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


def _tag(ctx: Context, out: relax.Expr, **spec) -> None:
    """Tag the kernel computing ``out`` with its operator and attributes: GPU builds
    swap in the GPU version of the same operator (edgecv.codegen.op_versions)."""
    call = ctx.bb.lookup_binding(out)
    gv = call.args[0]
    tagged = ctx.bb.get()[gv].with_attr("edgecv.op", json.dumps(spec))
    ctx.bb.update_func(gv, tagged)


@converts("_contrib_box_decode")
def contrib_box_decode(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    from ...ops import box_decode as box_decode_op

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
    from ...ops import roi_align as roi_align_op

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
    from ...ops import multibox

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
    from ...ops import multibox

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
