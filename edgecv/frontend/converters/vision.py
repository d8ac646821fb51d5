"""Converters for MXNet's detection operators, lowered to edgecv's own TIR operators."""

from __future__ import annotations

import json

from tvm import relax

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
    out = ctx.bb.emit_te(box_nms_op.box_nms, inputs[0], primfunc_name_hint="box_nms", **kwargs)
    # Tag the kernel with its operator and attributes: GPU builds swap in the GPU
    # version of the same operator (edgecv.build.gpu.GPU_VERSIONS).
    call = ctx.bb.lookup_binding(out)
    gv = call.args[0]
    ty = inputs[0].ty
    shape = [int(d) for d in ty.shape]
    tag = {"op": "box_nms", "shape": shape, "dtype": str(ty.dtype), **kwargs}
    tagged = ctx.bb.get()[gv].with_attr("edgecv.op", json.dumps(tag))
    ctx.bb.update_func(gv, tagged)
    return [out]


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
