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

from dataclasses import dataclass

import numpy as np
from tvm import relax
from tvm.relax import op as R

from ...board.errors import ConversionError
from .fold import fold
from .vision import _shape, sorted_rows, suppressed

DOMAIN = "edgecv.torchvision"
OP_TYPE = "Detections"


@dataclass
class _Graph:
    """Who makes and who reads each value of one ONNX graph, and its constants."""

    producer: dict
    readers: dict
    constants: dict

    @classmethod
    def of(cls, graph) -> _Graph:
        producer = {o: n for n in graph.node for o in n.output}
        readers: dict = {}
        for n in graph.node:
            for i in n.input:
                readers.setdefault(i, []).append(n)
        constants = {t.name: t for t in graph.initializer}  # read when asked: weights too
        for n in graph.node:
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
                constants[n.output[0]] = n.attribute[0].t
        return cls(producer, readers, constants)

    def node(self, name: str, op_type: str):
        """The node making ``name`` when it is an ``op_type``, else :class:`_Mismatch`."""
        node = self.producer.get(name)
        if node is None or node.op_type != op_type:
            found = node.op_type if node is not None else "a graph input or weight"
            raise _Mismatch(f"expected {op_type} making `{name}`, found {found}")
        return node

    def value(self, name: str) -> np.ndarray:
        from onnx import numpy_helper

        if name not in self.constants:
            raise _Mismatch(f"`{name}` is not a constant")
        return numpy_helper.to_array(self.constants[name])


class _Mismatch(Exception):
    """The graph is not the form this module recognizes (why, for the error)."""


def _attr(node, name: str, default=None):
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _nms_branch(node):
    """The branch of ``If`` ``node`` holding a ``NonMaxSuppression`` (None if neither)."""
    for a in node.attribute:
        if a.name in ("then_branch", "else_branch") and any(
            n.op_type == "NonMaxSuppression" for n in a.g.node
        ):
            return a.g
    return None


def rewrite(model, source: str):
    """``model`` with torchvision's detection post-processing replaced by one
    ``edgecv.torchvision::Detections`` node (module docstring) and the shape arithmetic
    in front of it folded (:func:`.fold.fold`); unchanged when it has none."""
    replaced = replace_postprocessing(model, source)
    return model if replaced is model else fold(replaced)


def replace_postprocessing(model, source: str):
    """:func:`rewrite` without the folding: one :class:`ConversionError` for an ``If``
    around ``NonMaxSuppression`` that is not torchvision's SSD form."""
    ifs = [n for n in model.graph.node if n.op_type == "If" and _nms_branch(n) is not None]
    if not ifs:
        return model
    graph = _Graph.of(model.graph)
    try:
        if len(ifs) != 1:
            raise _Mismatch(f"{len(ifs)} If nodes hold a NonMaxSuppression, expected one")
        node, removed = _detections_node(graph, ifs[0])
    except _Mismatch as why:
        raise ConversionError(
            f"{source}: the detection post-processing around NonMaxSuppression is not a "
            f"form edgecv maps to fixed-size outputs (torchvision's SSD and SSDlite are; "
            f"{why}); see docs/models.md, torchvision's detectors"
        ) from None
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = list(out.graph.node)
    at = min(i for i, n in enumerate(nodes) if n.output[0] in removed)
    kept = [n for n in nodes[:at] if n.output[0] not in removed]
    kept += [node] + [n for n in nodes[at:] if n.output[0] not in removed]
    del out.graph.node[:]
    out.graph.node.extend(_live(kept, {o.name for o in out.graph.output}))
    if not any(o.domain == DOMAIN for o in out.opset_import):
        out.opset_import.append(onnx.helper.make_opsetid(DOMAIN, 1))
    return out


def _live(nodes: list, wanted: set[str]) -> list:
    """``nodes`` (in order) that a graph output depends on."""
    needed, keep = set(wanted), []
    for n in reversed(nodes):
        if needed & set(n.output):
            keep.append(n)
            needed.update(i for i in n.input if i)
    return keep[::-1]


def _detections_node(graph: _Graph, if_node):
    """The replacing node and the outputs of the nodes it replaces, from the ``If``."""
    import onnx

    (sliced,) = [r for r in graph.readers.get(if_node.output[0], []) if r.op_type == "Slice"]
    starts, ends = (graph.value(sliced.input[i]) for i in (1, 2))
    if int(starts.reshape(-1)[0]) != 0:
        raise _Mismatch("the kept detections are not sliced from the first")
    gathers = [r for r in graph.readers.get(sliced.output[0], []) if r.op_type == "Gather"]
    parts = {_part(graph, graph.producer.get(g.input[0])): g for g in gathers}
    if set(parts) != {"boxes", "scores", "labels"}:
        raise _Mismatch(f"the kept rows gather {sorted(parts)}, not boxes, scores and labels")
    branch_reads = {i for n in _nms_branch(if_node).node for i in n.input}
    if not {parts[p].input[0] for p in parts} <= branch_reads:
        raise _Mismatch("the NMS branch does not read the concatenated boxes, scores, labels")
    iou = _branch_iou(_nms_branch(if_node))
    found = _candidates(graph, graph.producer[parts["scores"].input[0]])
    labels = _labels(graph, graph.producer[parts["labels"].input[0]], found["topks"])
    boxes = _box_source(graph, graph.producer[parts["boxes"].input[0]], found["topks"])
    n = int(len(found["columns"]))
    detections = min(int(ends.reshape(-1)[0]), n * found["candidates"])
    node = onnx.helper.make_node(
        OP_TYPE,
        [found["scores"], boxes],
        [parts["boxes"].output[0], parts["scores"].output[0], parts["labels"].output[0]],
        domain=DOMAIN,
        columns=found["columns"],
        labels=labels,
        score_threshold=found["threshold"],
        candidates=found["candidates"],
        iou_threshold=iou,
        detections=detections,
    )
    removed = {o for g in gathers for o in g.output} | set(sliced.output) | set(if_node.output)
    return node, removed


def _part(graph: _Graph, concat) -> str:
    """Which of torchvision's three lists a ``Concat`` joins, from what its inputs are."""
    if concat is None or concat.op_type != "Concat" or not concat.input:
        return "other"
    first = graph.producer.get(concat.input[0])
    kinds = {"TopK": "scores", "Gather": "boxes", "ConstantOfShape": "labels"}
    return kinds.get(first.op_type if first is not None else "", "other")


def _branch_iou(branch) -> float:
    """The IoU threshold of the branch's ``NonMaxSuppression`` (a constant there)."""
    sub = _Graph.of(branch)
    (nms,) = [n for n in branch.node if n.op_type == "NonMaxSuppression"]
    if len(nms.input) < 4 or not nms.input[3]:
        raise _Mismatch("NonMaxSuppression has no IoU threshold")
    return float(sub.value(nms.input[3]).reshape(-1)[0])


def _candidates(graph: _Graph, scores_concat) -> dict:
    """Per class: the column of the ``[N, C]`` scores, the threshold and ``k`` each
    class's candidates come through (one each for all classes)."""
    columns, topks, thresholds, ks, sources = [], [], set(), set(), set()
    for name in scores_concat.input:
        topk = graph.node(name, "TopK")
        if name != topk.output[0] or int(_attr(topk, "largest", 1)) != 1:
            raise _Mismatch("the concatenated scores are not TopK's largest values")
        gathered = graph.node(topk.input[0], "GatherND")
        column, greater = _thresholded(graph, gathered)
        ks.add(_candidate_count(graph, topk.input[1]))
        thresholds.add(float(graph.value(greater.input[1]).reshape(-1)[0]))
        take = graph.node(column, "Gather")
        if int(_attr(take, "axis", 0)) != 1:
            raise _Mismatch("a class's scores are not a column of the scores")
        sources.add(take.input[0])
        columns.append(int(graph.value(take.input[1]).reshape(-1)[0]))
        topks.append(topk)
    if len(sources) != 1 or len(thresholds) != 1 or len(ks) != 1:
        raise _Mismatch("the classes' scores, thresholds or top-k counts differ")
    return {
        "scores": sources.pop(),
        "columns": columns,
        "threshold": thresholds.pop(),
        "candidates": ks.pop(),
        "topks": topks,
    }


def _thresholded(graph: _Graph, gathered) -> tuple[str, object]:
    """``GatherND(x, Transpose(NonZero(Greater(x, t))))``: ``x`` and the ``Greater``."""
    nonzero = graph.node(graph.node(gathered.input[1], "Transpose").input[0], "NonZero")
    greater = graph.node(nonzero.input[0], "Greater")
    return greater.input[0], greater


def _candidate_count(graph: _Graph, name: str) -> int:
    """TopK's ``k = min(topk_candidates, n)``: ``Reshape(ReduceMin(Concat(c, n)))``."""
    node = graph.producer.get(name)
    while node is not None and node.op_type in ("Reshape", "Unsqueeze", "Squeeze", "Cast"):
        node = graph.producer.get(node.input[0])
    if node is None or node.op_type != "ReduceMin":
        raise _Mismatch("TopK's k is not min(top-k candidates, count)")
    parts = graph.node(node.input[0], "Concat").input
    values = [int(graph.value(p).reshape(-1)[0]) for p in parts if p in graph.constants]
    if len(values) != 1 or values[0] < 1:
        raise _Mismatch("TopK's k has no constant top-k candidate count")
    return values[0]


def _labels(graph: _Graph, labels_concat, topks) -> list[int]:
    """Each class's label: ``ConstantOfShape(Shape(TopK values))``'s value."""
    labels = []
    for name, topk in zip(labels_concat.input, topks, strict=True):
        fill = graph.node(name, "ConstantOfShape")
        shape = graph.node(fill.input[0], "Shape")
        if shape.input[0] != topk.output[0]:
            raise _Mismatch("a label column is not the length of its class's scores")
        from onnx import numpy_helper

        labels.append(int(numpy_helper.to_array(_attr(fill, "value")).reshape(-1)[0]))
    return labels


def _box_source(graph: _Graph, boxes_concat, topks) -> str:
    """The ``[N, 4]`` boxes each class's candidates are gathered from (one for all)."""
    sources = set()
    for name, topk in zip(boxes_concat.input, topks, strict=True):
        take = graph.node(name, "Gather")
        if take.input[1] != topk.output[1]:
            raise _Mismatch("a class's boxes are not gathered by its TopK indices")
        gathered = graph.node(take.input[0], "GatherND")
        _thresholded(graph, gathered)
        sources.add(gathered.input[0])
    if len(sources) != 1:
        raise _Mismatch("the classes' boxes come from different tensors")
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
    best = bb.normalize(R.reshape(R.gather_elements(rows, index, axis=1), (classes * k, 1)))
    flat = bb.normalize(R.reshape(index, (classes * k,)))
    corners = bb.normalize(R.take(boxes, flat, axis=0))
    label = np.repeat(np.asarray(labels, np.float32), k)[:, None]
    threshold = float(np.float32(attrs["score_threshold"]))
    above = bb.normalize(R.greater(best, relax.const(threshold, "float32")))
    lowest = relax.const(float(np.finfo(np.float32).min), "float32")
    most = R.max(R.where(above, corners, lowest))
    offsets = R.multiply(relax.const(label), R.add(most, relax.const(1.0, "float32")))
    offset = bb.normalize(R.add(corners, offsets))  # torchvision's batched NMS trick
    candidate = relax.const(np.arange(classes * k, dtype=np.float32)[:, None])
    data = bb.normalize(R.expand_dims(R.concat([candidate, best, offset], axis=-1), 0))
    keep = min(int(attrs["detections"]), classes * k)
    iou = float(attrs["iou_threshold"])
    kept = suppressed(bb, data, iou=iou, valid=threshold, fmt="corner", keep=keep)
    return _outputs(bb, kept, corners, label[:, 0], keep)


def _outputs(bb, kept, corners, label: np.ndarray, keep: int) -> relax.Tuple:
    """boxes, scores, labels of ``box_nms``'s kept rows ``(1, keep, 6)``; padding rows
    (index -1) get boxes 0, score -1 and label -1."""
    rows = bb.normalize(R.reshape(kept, (_shape(kept)[1], 6)))
    rows = bb.normalize(R.strided_slice(rows, axes=[0], begin=[0], end=[keep]))
    index = bb.normalize(R.strided_slice(rows, axes=[1], begin=[0], end=[1]))
    found = bb.normalize(R.greater_equal(index, relax.const(0.0, "float32")))
    at = bb.normalize(R.astype(R.maximum(R.reshape(index, (keep,)), relax.const(0.0)), "int64"))
    box = R.where(found, R.take(corners, at, axis=0), relax.const(0.0, "float32"))
    score = bb.normalize(R.strided_slice(rows, axes=[1], begin=[1], end=[2]))
    score = R.reshape(score, (keep,))
    ids = bb.normalize(R.take(relax.const(label.astype(np.int64), "int64"), at, axis=0))
    labels = R.where(R.reshape(found, (keep,)), ids, relax.const(-1, "int64"))
    return relax.Tuple([bb.normalize(box), bb.normalize(score), bb.normalize(labels)])
