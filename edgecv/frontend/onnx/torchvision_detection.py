"""torchvision's detection post-processing, as its ONNX export writes it, onto edgecv's
tagged kernels with fixed-size outputs.

torchvision's SSD and SSDlite export (``torch.onnx.export``) ends in a part whose shapes
depend on the data: for each class, the scores above ``score_thresh`` (``Greater`` ->
``NonZero`` -> ``GatherND``), their best ``min(topk_candidates, n)`` (``TopK``), the
boxes gathered by them and a label column (``ConstantOfShape``); the three concatenated;
``batched_nms`` by coordinate offsets (an ``If`` on an empty input, whose other branch
offsets each box by ``label * (max coordinate + 1)`` into one ``NonMaxSuppression``);
the first ``detections_per_img`` kept (``Slice``) gathered from the three. A static plan
holds none of it, so :func:`rewrite` recognizes it by how the nodes connect (op types,
constants read from the graph, never node names) and replaces it with one node,
``edgecv.torchvision::Detections``, converted by :func:`Detections` into fixed shapes:

- the classes' columns of the ``[N, C]`` scores, each row's best ``k`` by edgecv's row
  sort (``row_argsort``), the boxes gathered by them;
- one ``box_nms`` over the ``C' * k`` candidates offset by class as torchvision offsets
  them (the maximum over the candidates above the threshold), keeping
  ``detections_per_img`` rows, best score first;
- outputs ``boxes [K, 4]``, ``scores [K]``, ``labels [K]`` (int64): the kept detections
  first, in ONNX Runtime's order, then padding: boxes 0, score -1, label -1.

What follows in the graph (boxes scaled back to the image's size) converts as before on
the padded rows. A graph with an ``If`` around ``NonMaxSuppression`` in another form is
refused in one line.
"""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax import op as R

from ...board.errors import ConversionError
from . import torchvision_levels as levels
from . import torchvision_masks as masks
from .detection_graph import (
    DOMAIN,
    BatchedNMSNodes,
    Graph,
    Mismatch,
    attribute,
    candidate_count,
    nms_branch,
    splice,
    thresholded,
)
from .fold import fold
from .torchvision_levels import batched_detections
from .vision import _shape, sorted_rows

OP_TYPE = "Detections"


def rewrite(model, source: str):
    """``model`` with torchvision's detection post-processing replaced by edgecv's nodes
    (SSD's here, RetinaNet's and FCOS's :mod:`.torchvision_levels`) and the shape
    arithmetic around them folded (:func:`.fold.fold`); unchanged when it has none."""
    replaced = replace_postprocessing(model, source)
    return model if replaced is model else fold(replaced)


def replace_postprocessing(model, source: str):
    """:func:`rewrite` without the folding: one :class:`ConversionError` for an ``If``
    around ``NonMaxSuppression`` in none of the forms, saying why for each."""
    ifs = [n for n in model.graph.node if n.op_type == "If" and nms_branch(n) is not None]
    if not ifs:
        return model
    forms = [("SSD", _replace_ssd), ("RetinaNet or FCOS", _replace_levels)]
    forms.append(("Faster R-CNN", masks.replace))  # and Mask R-CNN's heads after it
    reasons = []
    for form, replace in forms:
        try:
            return replace(model)
        except Mismatch as why:
            reasons.append(f"as {form}: {why}")
    raise ConversionError(
        f"{source}: the detection post-processing around NonMaxSuppression is not a "
        f"form edgecv maps to fixed-size outputs (torchvision's SSD, SSDlite, RetinaNet, "
        f"FCOS, Faster, Mask and Keypoint R-CNN are; {'; '.join(reasons)}); see docs/models.md, "
        f"torchvision's detectors"
    )


def _one_nms_if(model):
    """The one ``If`` around ``NonMaxSuppression`` of a one-stage detector."""
    ifs = [n for n in model.graph.node if n.op_type == "If" and nms_branch(n) is not None]
    if len(ifs) != 1:
        raise Mismatch(f"{len(ifs)} If nodes hold a NonMaxSuppression, expected one")
    return ifs[0]


def _replace_ssd(model):
    """``model`` with SSD's post-processing replaced by one Detections node."""
    if_node = _one_nms_if(model)
    graph = Graph.of(model.graph)
    node = _detections_node(graph, nms := BatchedNMSNodes.of(graph, if_node))
    return splice(model, [(node, if_node.output[0])], nms.removed)


def _replace_levels(model):
    _one_nms_if(model)
    return levels.replace(model)


def _detections_node(graph: Graph, nms: BatchedNMSNodes):
    """The node replacing SSD's post-processing, from its batched NMS."""
    import onnx

    found = _candidates(graph, graph.node(nms.scores, "Concat"))
    labels = _labels(graph, graph.node(nms.labels, "Concat"), found["topks"])
    boxes = _box_source(graph, graph.node(nms.boxes, "Concat"), found["topks"])
    n = int(len(found["columns"]))
    return onnx.helper.make_node(
        OP_TYPE,
        [found["scores"], boxes],
        [nms.outputs[p] for p in ("boxes", "scores", "labels")],
        domain=DOMAIN,
        columns=found["columns"],
        labels=labels,
        score_threshold=found["threshold"],
        candidates=found["candidates"],
        iou_threshold=nms.iou,
        detections=min(nms.detections, n * found["candidates"]),
    )


def _candidates(graph: Graph, scores_concat) -> dict:
    """Per class: the column of the ``[N, C]`` scores, the threshold and ``k`` each
    class's candidates come through (one each for all classes)."""
    columns, topks, thresholds, ks, sources = [], [], set(), set(), set()
    for name in scores_concat.input:
        topk = graph.node(name, "TopK")
        if name != topk.output[0] or int(attribute(topk, "largest", 1)) != 1:
            raise Mismatch("the concatenated scores are not TopK's largest values")
        gathered = graph.node(topk.input[0], "GatherND")
        column, greater = thresholded(graph, gathered)
        ks.add(candidate_count(graph, topk.input[1]))
        thresholds.add(float(graph.value(greater.input[1]).reshape(-1)[0]))
        take = graph.node(column, "Gather")
        if int(attribute(take, "axis", 0)) != 1:
            raise Mismatch("a class's scores are not a column of the scores")
        sources.add(take.input[0])
        columns.append(int(graph.value(take.input[1]).reshape(-1)[0]))
        topks.append(topk)
    if len(sources) != 1 or len(thresholds) != 1 or len(ks) != 1:
        raise Mismatch("the classes' scores, thresholds or top-k counts differ")
    return {
        "scores": sources.pop(),
        "columns": columns,
        "threshold": thresholds.pop(),
        "candidates": ks.pop(),
        "topks": topks,
    }


def _labels(graph: Graph, labels_concat, topks) -> list[int]:
    """Each class's label: ``ConstantOfShape(Shape(TopK values))``'s value."""
    labels = []
    for name, topk in zip(labels_concat.input, topks, strict=True):
        fill = graph.node(name, "ConstantOfShape")
        shape = graph.node(fill.input[0], "Shape")
        if shape.input[0] != topk.output[0]:
            raise Mismatch("a label column is not the length of its class's scores")
        from onnx import numpy_helper

        labels.append(int(numpy_helper.to_array(attribute(fill, "value")).reshape(-1)[0]))
    return labels


def _box_source(graph: Graph, boxes_concat, topks) -> str:
    """The ``[N, 4]`` boxes each class's candidates are gathered from (one for all)."""
    sources = set()
    for name, topk in zip(boxes_concat.input, topks, strict=True):
        take = graph.node(name, "Gather")
        if take.input[1] != topk.output[1]:
            raise Mismatch("a class's boxes are not gathered by its TopK indices")
        gathered = graph.node(take.input[0], "GatherND")
        thresholded(graph, gathered)
        sources.add(gathered.input[0])
    if len(sources) != 1:
        raise Mismatch("the classes' boxes come from different tensors")
    return sources.pop()


def Detections(bb, inputs, attrs, opset):  # noqa: N802 (named after the node)
    """``edgecv.torchvision::Detections(scores [N, C], boxes [N, 4])`` -> boxes ``[K, 4]``,
    scores ``[K]``, labels ``[K]`` (module docstring)."""

    scores, boxes = inputs
    columns, labels = list(attrs["columns"]), list(attrs["labels"])
    n = _shape(scores)[-2]
    if _shape(boxes) != [n, 4] or len(_shape(scores)) != 2:
        raise ConversionError(
            f"torchvision's detection post-processing reads scores [N, C] and boxes [N, 4], "
            f"found {_shape(scores)} and {_shape(boxes)}"
        )
    k, classes = min(int(attrs["candidates"]), n), len(columns)
    rows = bb.normalize(R.permute_dims(R.take(scores, relax.const(columns, "int64"), axis=1)))
    index = sorted_rows(bb, rows, descending=True, k=k)  # [classes, k], best first
    best = bb.normalize(R.reshape(R.gather_elements(rows, index, axis=1), (classes * k,)))
    flat = bb.normalize(R.reshape(index, (classes * k,)))
    corners = bb.normalize(R.take(boxes, flat, axis=0))
    label = relax.const(np.repeat(np.asarray(labels, np.int64), k), "int64")  # else int32
    keep = min(int(attrs["detections"]), classes * k)
    return batched_detections(
        bb, corners, best, label, attrs["score_threshold"], attrs["iou_threshold"], keep
    )
