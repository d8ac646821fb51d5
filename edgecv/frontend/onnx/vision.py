"""ONNX ``TopK`` and ``NonMaxSuppression`` onto edgecv's own tagged kernels.

The kernels are the MXNet importer's (:mod:`edgecv.ops.row_argsort`,
:mod:`edgecv.ops.box_nms`), emitted with ``emit_te`` and tagged ``edgecv.op`` with the
same attributes, so a GPU build swaps in the same GPU versions and placement, the
fallback and the graph tuner see the same operators whichever frontend ran.

``NonMaxSuppression``'s output is data-dependent in size; a static plan's is not. Here
it is a fixed ``[B * C * M, 3]`` (``M`` = max_output_boxes_per_class, at most the
boxes): ONNX's rows first, in ONNX's order, the rest -1 (the selected count is the
number of rows whose first value is not -1). A downstream node could not tell the
padding from a box (ONNX's ``Gather`` reads -1 as the last box), so a graph whose
selected indices feed another node is refused (:func:`check_nms_readers`).
"""

from __future__ import annotations

import json
import math

import numpy as np
import tvm
from tvm import relax
from tvm.relax import op as R

from ...board.errors import ConversionError


def _tag(bb, out: relax.Expr, **spec) -> None:
    """Tag the kernel computing ``out`` with its operator and attributes (as the MXNet
    importer's ``_tag``): GPU builds swap in the GPU version (codegen.op_versions)."""
    gv = bb.lookup_binding(out).args[0]
    bb.update_func(gv, bb.get()[gv].with_attr("edgecv.op", json.dumps(spec)))


def _shape(expr) -> list[int]:
    return [int(d) for d in expr.ty.shape]


def _constant(expr, what: str) -> float | None:
    """A one-value constant input's value (None when omitted); refuses a computed one."""
    if expr is None:
        return None
    if not isinstance(expr, tvm.ir.expr.Constant) or expr.value.numpy().size != 1:
        raise ConversionError(
            f"{what} must be a constant of one value (an initializer); edgecv's plan is static"
        )
    return float(expr.value.numpy().reshape(()))


def sorted_rows(bb, rows: relax.Expr, descending: bool, k: int = 0) -> relax.Expr:
    """The int32 indices that sort each row of ``rows (R, n)`` (equal keys in input
    order), first ``k`` columns when ``0 < k < n``: edgecv's tagged row sort."""
    from ...ops import row_argsort as sort_op  # the TIR ops import topi: load on first use

    out = bb.emit_te(
        sort_op.row_argsort, rows, descending=descending, k=k, primfunc_name_hint="row_argsort"
    )
    _tag(bb, out, op="row_argsort", shape=_shape(rows), dtype=str(rows.ty.dtype),
         descending=descending, k=k)  # fmt: skip
    return out


def TopK(bb, inputs, attrs, opset):  # noqa: N802 (named after the ONNX op)
    """``TopK`` (opset 10+, float32, ``sorted=1``, ``k`` a constant) as one row sort of
    the axis moved last; values gathered by the indices. Other forms go to TVM's."""
    x = inputs[0]
    if opset < 10 or str(x.ty.dtype) != "float32" or int(attrs.get("sorted", 1)) != 1:
        return None
    shape = _shape(x)
    axis = int(attrs.get("axis", -1))
    axis = axis + len(shape) if axis < 0 else axis
    n = shape[axis]
    k = int(_constant(inputs[1], "TopK's k"))
    if not 0 < k <= n:
        raise ConversionError(f"TopK's k={k} must be in 1..{n} (the size of axis {axis})")
    perm = [a for a in range(len(shape)) if a != axis] + [axis]
    moved = bb.normalize(R.permute_dims(x, perm)) if axis != len(shape) - 1 else x
    lead = [shape[a] for a in perm[:-1]]
    rows = bb.normalize(R.reshape(moved, (int(np.prod(lead, dtype=np.int64)), n)))
    idx = sorted_rows(bb, rows, descending=int(attrs.get("largest", 1)) == 1, k=k)
    values = bb.normalize(R.gather_elements(rows, idx, axis=1))
    inverse = [int(a) for a in np.argsort(perm)]

    def restore(y):
        y = bb.normalize(R.reshape(y, (*lead, k)))
        return bb.normalize(R.permute_dims(y, inverse)) if axis != len(shape) - 1 else y

    return relax.Tuple([restore(values), restore(bb.normalize(R.astype(idx, "int64")))])


def NonMaxSuppression(bb, inputs, attrs, opset):  # noqa: N802 (named after the ONNX op)
    """``NonMaxSuppression`` as one ``box_nms`` over the ``B * C`` (batch, class) rows
    of ``[box index, score, 4 coordinates]``, keeping each row's first ``M`` boxes, then
    the selected rows compacted to the top with a stable row sort (module docstring)."""

    boxes, scores = inputs[0], inputs[1]
    extra = [inputs[i] if len(inputs) > i else None for i in (2, 3, 4)]
    most = _constant(extra[0], "NonMaxSuppression's max_output_boxes_per_class")
    iou = _constant(extra[1], "NonMaxSuppression's iou_threshold")
    least = _constant(extra[2], "NonMaxSuppression's score_threshold")
    (batch, n, four), (batch_s, classes, n_s) = _shape(boxes), _shape(scores)
    if four != 4 or (batch, n) != (batch_s, n_s) or str(boxes.ty.dtype) != "float32":
        raise ConversionError(
            f"NonMaxSuppression takes float32 boxes [B, N, 4] and scores [B, C, N], "
            f"found {[batch, n, four]} ({boxes.ty.dtype}) and {[batch_s, classes, n_s]}"
        )
    if most is None or most < 1:
        raise ConversionError(
            "NonMaxSuppression's max_output_boxes_per_class must be at least 1 "
            "(0 or omitted selects nothing, an empty output a static plan cannot hold)"
        )
    keep = min(int(most), n)
    center = int(attrs.get("center_point_box", 0)) == 1
    coords = boxes if center else _ordered_corners(bb, boxes)
    per_class = (batch, classes, n)
    columns = [
        R.broadcast_to(relax.const(np.arange(n, dtype=np.float32)[:, None]), (*per_class, 1)),
        R.expand_dims(scores, -1),
        R.broadcast_to(R.expand_dims(coords, 1), (*per_class, 4)),
    ]
    data = bb.normalize(R.reshape(R.concat(columns, axis=-1), (batch * classes, n, 6)))
    lowest = float(np.finfo(np.float32).min)  # no threshold: every box is a candidate
    kept = suppressed(
        bb,
        data,
        iou=0.0 if iou is None or math.isnan(iou) else iou,
        valid=lowest if least is None or math.isnan(least) else least,
        fmt="center" if center else "corner",
        keep=keep,
    )
    return _selected_indices(bb, kept, batch, classes, keep)


def suppressed(bb, data: relax.Expr, iou: float, valid: float, fmt: str, keep: int):
    """edgecv's tagged class-agnostic ``box_nms`` over rows ``[id, score, 4 coords]`` of
    ``data (R, n, 6)``: boxes below ``valid`` dropped, overlaps above ``iou`` suppressed,
    the first ``keep`` kept rows of each of the ``R`` sets (all when ``keep >= n``)."""
    from ...ops import box_nms as box_nms_op  # the TIR ops import topi: load on first use

    n = _shape(data)[1]
    kwargs = dict(
        overlap_thresh=iou,
        valid_thresh=valid,
        topk=-1,
        coord_start=2,
        score_index=1,
        id_index=-1,
        background_id=-1,
        force_suppress=False,
        in_format=fmt,
        out_format=fmt,
        out_rows=keep if keep < n else -1,
    )
    kept = bb.emit_te(box_nms_op.box_nms, data, primfunc_name_hint="box_nms", **kwargs)
    _tag(bb, kept, op="box_nms", shape=_shape(data), dtype="float32", **kwargs)
    return kept


def _ordered_corners(bb, boxes: relax.Expr) -> relax.Expr:
    """``[y1, x1, y2, x2]`` with each pair ordered (ONNX allows either diagonal)."""
    b, n, _ = _shape(boxes)
    first = R.strided_slice(boxes, axes=[2], begin=[0], end=[2])
    second = R.strided_slice(boxes, axes=[2], begin=[2], end=[4])
    ordered = R.concat([R.minimum(first, second), R.maximum(first, second)], axis=-1)
    return bb.normalize(ordered)


def _selected_indices(bb, kept, batch: int, classes: int, keep: int) -> relax.Expr:
    """``[B * C * keep, 3]`` int64 (batch, class, box) rows from ``box_nms``'s output
    ``(B * C, keep, 6)``: the kept boxes first in (batch, class, score) order, -1 after."""
    total = batch * classes * keep
    index = bb.normalize(R.reshape(R.strided_slice(kept, axes=[2], begin=[0], end=[1]), (total,)))
    found = bb.normalize(R.greater_equal(index, relax.const(0.0, "float32")))
    # stable ascending sort of 0 (selected) / 1 (padding): ONNX's rows first, in order
    padding = bb.normalize(R.astype(R.logical_not(found), "float32"))
    order = sorted_rows(bb, bb.normalize(R.reshape(padding, (1, total))), descending=False)
    order = bb.normalize(R.reshape(order, (total,)))
    pairs = np.stack(np.meshgrid(np.arange(batch), np.arange(classes), indexing="ij"), -1)
    pairs = np.repeat(pairs.reshape(batch * classes, 1, 2), keep, axis=1).reshape(total, 2)
    rows = R.concat([relax.const(pairs, "int64"), R.astype(R.expand_dims(index, -1), "int64")], -1)
    rows = R.where(R.expand_dims(found, -1), rows, relax.const(-1, "int64"))
    return bb.normalize(R.take(bb.normalize(rows), order, axis=0))


def check_nms_readers(model, source: str) -> None:
    """Refuse a graph where ``NonMaxSuppression``'s selected indices feed another node:
    edgecv's fixed-size output pads with -1 rows, which a reader (torchvision's batched
    NMS gathers boxes by them) would take for boxes."""
    outputs = {n.output[0] for n in model.graph.node if n.op_type == "NonMaxSuppression"}
    readers = sorted({n.op_type for n in model.graph.node if outputs & set(n.input)})
    if readers:
        raise ConversionError(
            f"{source}: NonMaxSuppression's selected indices feed {', '.join(readers)}; "
            "edgecv pads them to a fixed number of rows with -1 and deploys them only as "
            "a graph output (see docs/models.md, ONNX)"
        )
