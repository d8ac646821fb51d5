"""torchvision's RetinaNet and FCOS post-processing, as its ONNX export writes it, onto
edgecv's tagged kernels with fixed-size outputs.

Both detectors choose candidates per feature level from the level's flattened scores
``[M]`` (``M`` = positions x anchors x classes; sigmoid of the class logits, FCOS: the
square root of that times the centerness): the scores above ``score_thresh``
(``Greater`` -> ``NonZero`` -> ``GatherND``), their best ``min(topk_candidates, n)``
(``TopK``), and the flat indices of those (``Gather`` of ``NonZero``'s indices by
``TopK``'s). What follows reads only those indices: the anchor ``index // classes``
and the label ``index % classes``, the box regression and the anchor gathered by the
anchor index and decoded, the box clipped to the image. The levels are concatenated and
go through torchvision's batched NMS (:class:`.detection_graph.BatchedNMSNodes`); the
first ``detections_per_img`` are kept.

Only the choice and the NMS have shapes that depend on the data, so only they are
replaced (by how the nodes connect, never by node names):

- each level's choice by one ``edgecv.torchvision::LevelCandidates`` node
  (:func:`LevelCandidates`): the best ``k = min(topk_candidates, M)`` of all ``M``
  scores by edgecv's row sort (``row_argsort``) and their flat indices, always ``k``
  rows; a candidate at or below the threshold keeps its score, and the NMS drops it.
  The best ``k`` of all scores holds the best ``min(k, n)`` of the ``n`` above the
  threshold, in the same order, so the anchors, labels, decoding and clipping after it
  convert unchanged, on ``k`` rows;
- the batched NMS and the gathers after it by one ``edgecv.torchvision::BatchedNMS``
  node (:func:`BatchedNMS`): one ``box_nms`` over all candidates offset by label as
  torchvision offsets them, those at or below the threshold dropped, outputs
  ``boxes [K, 4]``, ``scores [K]``, ``labels [K]`` (int64) padded as the SSD form pads
  (:mod:`.torchvision_detection`): boxes 0, score -1, label -1.
"""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax import op as R

from ...board.errors import ConversionError
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
from .fold import fold, static_shapes
from .vision import _shape, sorted_rows, suppressed

# how the flat indices are taken from NonZero's output: its rows, transposed, split
INDEX_STEPS = ("Transpose", "Split", "Squeeze", "Reshape", "Gather", "Unsqueeze", "Cast")


def replace(model):
    """``model`` with RetinaNet's or FCOS's choice of candidates and batched NMS replaced
    (module docstring), its shape arithmetic folded first (a level's size is read from
    the graph); :class:`Mismatch` saying why when the graph is another form."""
    import onnx

    model = fold(model)
    graph = Graph.of(model.graph)
    (if_node,) = [n for n in model.graph.node if n.op_type == "If" and nms_branch(n)]
    nms = BatchedNMSNodes.of(graph, if_node)
    concat = graph.node(nms.scores, "Concat")
    placed, removed, declared, thresholds = [], set(nms.removed), [], set()
    shapes = static_shapes(model)
    for name in concat.input:
        topk = graph.node(name, "TopK")
        if name != topk.output[0] or int(attribute(topk, "largest", 1)) != 1:
            raise Mismatch("the concatenated scores are not TopK's largest values")
        scores, greater = thresholded(graph, graph.node(topk.input[0], "GatherND"))
        index = _flat_index(graph, topk, greater)
        k = candidate_count(graph, topk.input[1])
        if len(shapes.get(scores, [])) != 1:
            raise Mismatch(f"a level's scores `{scores}` are not one static dimension")
        k = min(k, shapes[scores][0])
        node = onnx.helper.make_node(
            "LevelCandidates", [scores], [topk.output[0], index.output[0]], domain=DOMAIN,
            candidates=k,
        )  # fmt: skip
        placed.append((node, topk.output[0]))
        removed |= {*topk.output, index.output[0]}
        thresholds.add(float(graph.value(greater.input[1]).reshape(-1)[0]))
        declared += [
            onnx.helper.make_tensor_value_info(topk.output[0], onnx.TensorProto.FLOAT, [k]),
            onnx.helper.make_tensor_value_info(index.output[0], onnx.TensorProto.INT64, [k]),
        ]
    if len(thresholds) != 1:
        raise Mismatch("the levels' score thresholds differ")
    outputs = [nms.outputs[p] for p in ("boxes", "scores", "labels")]
    node = onnx.helper.make_node(
        "BatchedNMS", [nms.boxes, nms.scores, nms.labels], outputs, domain=DOMAIN,
        iou_threshold=nms.iou, score_threshold=thresholds.pop(), detections=nms.detections,
    )  # fmt: skip
    placed.append((node, if_node.output[0]))
    return splice(model, placed, removed, declared)


def _flat_index(graph: Graph, topk, greater):
    """The ``Gather`` taking the flat indices of the level's scores by ``topk``'s: its
    only reader of the indices, gathering from ``NonZero`` of the same ``Greater``."""
    readers = graph.readers.get(topk.output[1], [])
    if len(readers) != 1 or readers[0].op_type != "Gather":
        raise Mismatch("TopK's indices are not read by one Gather")
    (take,) = readers
    node = graph.producer.get(take.input[0])
    while node is not None and node.op_type in INDEX_STEPS:
        node = graph.producer.get(node.input[0])
    if node is None or node.op_type != "NonZero" or node.input[0] != greater.output[0]:
        raise Mismatch("TopK's indices gather from no NonZero of the level's threshold")
    return take


def LevelCandidates(bb, inputs, attrs, opset):  # noqa: N802 (named after the node)
    """``edgecv.torchvision::LevelCandidates(scores [M])`` -> the best ``k`` scores
    ``[k]`` and their indices ``[k]`` (int64), best first (module docstring)."""
    (scores,) = inputs
    shape = _shape(scores)
    if len(shape) != 1:
        raise ConversionError(f"a level's candidates come from flat scores [M], found {shape}")
    k = int(attrs["candidates"])
    rows = bb.normalize(R.reshape(scores, (1, shape[0])))
    index = sorted_rows(bb, rows, descending=True, k=k)
    values = bb.normalize(R.reshape(R.gather_elements(rows, index, axis=1), (k,)))
    return relax.Tuple([values, bb.normalize(R.reshape(R.astype(index, "int64"), (k,)))])


def BatchedNMS(bb, inputs, attrs, opset):  # noqa: N802 (named after the node)
    """``edgecv.torchvision::BatchedNMS(boxes [N, 4], scores [N], labels [N])`` -> boxes
    ``[K, 4]``, scores ``[K]``, labels ``[K]`` (module docstring)."""
    boxes, scores, labels = inputs
    n = _shape(scores)[0]
    if _shape(boxes) != [n, 4] or _shape(labels) != [n]:
        raise ConversionError(
            f"torchvision's batched NMS reads boxes [N, 4], scores [N] and labels [N], "
            f"found {_shape(boxes)}, {_shape(scores)} and {_shape(labels)}"
        )
    keep = min(int(attrs["detections"]), n)
    labels = bb.normalize(R.astype(labels, "int64"))
    return batched_detections(
        bb, boxes, scores, labels, attrs["score_threshold"], attrs["iou_threshold"], keep
    )


def batched_detections(bb, corners, scores, labels, threshold, iou, keep: int):
    """torchvision's batched NMS on fixed rows: ``corners [n, 4]`` offset by ``labels
    [n]`` (int64) times the largest coordinate of the candidates above ``threshold``
    plus one, so boxes of two labels never overlap; one ``box_nms`` dropping the
    ``scores [n]`` at or below ``threshold``; boxes, scores and labels of the first
    ``keep`` kept, best first, then padding (boxes 0, score -1, label -1)."""
    n = _shape(scores)[0]
    threshold = float(np.float32(threshold))
    column = bb.normalize(R.reshape(scores, (n, 1)))
    above = bb.normalize(R.greater(column, relax.const(threshold, "float32")))
    lowest = relax.const(float(np.finfo(np.float32).min), "float32")
    most = R.max(R.where(above, corners, lowest))
    factor = R.astype(R.reshape(labels, (n, 1)), "float32")
    offset = bb.normalize(R.add(corners, R.multiply(factor, R.add(most, relax.const(1.0)))))
    candidate = relax.const(np.arange(n, dtype=np.float32)[:, None])
    data = bb.normalize(R.expand_dims(R.concat([candidate, column, offset], axis=-1), 0))
    kept = suppressed(bb, data, iou=float(iou), valid=threshold, fmt="corner", keep=keep)
    rows = bb.normalize(R.reshape(kept, (_shape(kept)[1], 6)))
    rows = bb.normalize(R.strided_slice(rows, axes=[0], begin=[0], end=[keep]))
    index = bb.normalize(R.strided_slice(rows, axes=[1], begin=[0], end=[1]))
    found = bb.normalize(R.greater_equal(index, relax.const(0.0, "float32")))
    at = bb.normalize(R.astype(R.maximum(R.reshape(index, (keep,)), relax.const(0.0)), "int64"))
    box = R.where(found, R.take(corners, at, axis=0), relax.const(0.0, "float32"))
    score = bb.normalize(R.strided_slice(rows, axes=[1], begin=[1], end=[2]))
    score = R.reshape(score, (keep,))
    ids = bb.normalize(R.take(labels, at, axis=0))
    label = R.where(R.reshape(found, (keep,)), ids, relax.const(-1, "int64"))
    return relax.Tuple([bb.normalize(box), bb.normalize(score), bb.normalize(label)])
