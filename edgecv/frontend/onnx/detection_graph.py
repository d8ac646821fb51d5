"""Reading and splicing the detection post-processing torchvision's ONNX export writes:
what :mod:`.torchvision_detection` (SSD, SSDlite) and :mod:`.torchvision_levels`
(RetinaNet, FCOS) share.

Both recognize a part of the graph by how its nodes connect (op types, constants read
from the graph, never node names) and replace it with nodes of edgecv's own domain
whose outputs keep the replaced values' names, so the rest of the graph reads them
unchanged. A form that does not match raises :class:`Mismatch` saying where.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DOMAIN = "edgecv.torchvision"


class Mismatch(Exception):
    """The graph is not the form being recognized (why, for the error)."""


@dataclass
class Graph:
    """Who makes and who reads each value of one ONNX graph, and its constants."""

    producer: dict
    readers: dict
    constants: dict

    @classmethod
    def of(cls, graph) -> Graph:
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
        """The node making ``name`` when it is an ``op_type``, else :class:`Mismatch`."""
        node = self.producer.get(name)
        if node is None or node.op_type != op_type:
            found = node.op_type if node is not None else "a graph input or weight"
            raise Mismatch(f"expected {op_type} making `{name}`, found {found}")
        return node

    def value(self, name: str) -> np.ndarray:
        from onnx import numpy_helper

        if name not in self.constants:
            raise Mismatch(f"`{name}` is not a constant")
        return numpy_helper.to_array(self.constants[name])


def attribute(node, name: str, default=None):
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def nms_branch(node):
    """The branch of ``If`` ``node`` holding a ``NonMaxSuppression`` (None if neither)."""
    for a in node.attribute:
        if a.name in ("then_branch", "else_branch") and any(
            n.op_type == "NonMaxSuppression" for n in a.g.node
        ):
            return a.g
    return None


def branch_iou(branch) -> float:
    """The IoU threshold of the branch's ``NonMaxSuppression`` (a constant there)."""
    sub = Graph.of(branch)
    (nms,) = [n for n in branch.node if n.op_type == "NonMaxSuppression"]
    if len(nms.input) < 4 or not nms.input[3]:
        raise Mismatch("NonMaxSuppression has no IoU threshold")
    return float(sub.value(nms.input[3]).reshape(-1)[0])


@dataclass
class BatchedNMSNodes:
    """torchvision's ``batched_nms`` and the first ``detections`` kept: an ``If`` (no
    boxes: nothing kept) whose other branch offsets the ``boxes`` by ``labels * (their
    maximum + 1)`` into one ``NonMaxSuppression`` of the ``scores``; its kept indices
    sliced to the first ``detections``; ``outputs`` the ``Gather`` of each of boxes,
    scores and labels by them (the values the replacing node makes)."""

    boxes: str
    scores: str
    labels: str
    iou: float
    detections: int
    outputs: dict  # "boxes", "scores", "labels" -> the value gathered from it
    removed: set  # the If's, the Slice's and the Gathers' outputs

    @classmethod
    def of(
        cls, graph: Graph, if_node, gathered: tuple = ("boxes", "scores", "labels")
    ) -> BatchedNMSNodes:
        """The nodes around ``if_node``; the kept rows gathered once from each of the
        parts ``gathered`` names, and from no other (Faster R-CNN's RPN gathers only
        its boxes: the scores are dead in the export)."""
        branch = nms_branch(if_node)
        made = {o for n in branch.node for o in n.output} | {t.name for t in branch.initializer}
        outer = [i for n in branch.node for i in n.input if i and i not in made]
        outer = list(dict.fromkeys(i for i in outer if i not in graph.constants))
        inside = {o: n for n in branch.node for o in n.output}
        maxima = [n for n in branch.node if n.op_type == "ReduceMax" and n.input[0] in outer]
        (nms,) = [n for n in branch.node if n.op_type == "NonMaxSuppression"]
        scores = nms.input[1]
        while scores in inside and inside[scores].op_type in ("Unsqueeze", "Cast", "Reshape"):
            scores = inside[scores].input[0]
        if len(maxima) != 1 or scores not in outer or len(outer) != 3:
            raise Mismatch(
                "the NMS branch does not offset boxes by labels (torchvision's batched_nms)"
            )
        boxes = maxima[0].input[0]
        (labels,) = [i for i in outer if i not in (boxes, scores)]
        slices = [r for r in graph.readers.get(if_node.output[0], []) if r.op_type == "Slice"]
        if len(slices) != 1:
            raise Mismatch("the kept indices are not sliced once")
        (sliced,) = slices
        starts, ends = (graph.value(sliced.input[i]) for i in (1, 2))
        if int(starts.reshape(-1)[0]) != 0:
            raise Mismatch("the kept detections are not sliced from the first")
        gathers = [r for r in graph.readers.get(sliced.output[0], []) if r.op_type == "Gather"]
        parts = {"boxes": boxes, "scores": scores, "labels": labels}
        outputs = {p: g.output[0] for p, v in parts.items() for g in gathers if g.input[0] == v}
        if set(outputs) != set(gathered) or len(gathers) != len(gathered):
            raise Mismatch(f"the kept rows are not gathered once from {', '.join(gathered)}")
        removed = {if_node.output[0], sliced.output[0], *outputs.values()}
        iou = branch_iou(branch)
        return cls(boxes, scores, labels, iou, int(ends.reshape(-1)[0]), outputs, removed)


def thresholded(graph: Graph, gathered) -> tuple[str, object]:
    """``GatherND(x, Transpose(NonZero(Greater(x, t))))``: ``x`` and the ``Greater``."""
    nonzero = graph.node(graph.node(gathered.input[1], "Transpose").input[0], "NonZero")
    greater = graph.node(nonzero.input[0], "Greater")
    return greater.input[0], greater


def candidate_count(graph: Graph, name: str) -> int:
    """TopK's ``k = min(topk_candidates, n)``: ``Reshape(ReduceMin(Concat(c, n)))``."""
    node = graph.producer.get(name)
    while node is not None and node.op_type in ("Reshape", "Unsqueeze", "Squeeze", "Cast"):
        node = graph.producer.get(node.input[0])
    if node is None or node.op_type != "ReduceMin":
        raise Mismatch("TopK's k is not min(top-k candidates, count)")
    parts = graph.node(node.input[0], "Concat").input
    values = [int(graph.value(p).reshape(-1)[0]) for p in parts if p in graph.constants]
    if len(values) != 1 or values[0] < 1:
        raise Mismatch("TopK's k has no constant top-k candidate count")
    return values[0]


def descends(graph: Graph, name: str, ancestor: str) -> bool:
    """Whether the value ``name`` is computed from the value ``ancestor``."""
    todo, seen = [name], set()
    while todo:
        value = todo.pop()
        if value == ancestor:
            return True
        if value in seen or value not in graph.producer:
            continue
        seen.add(value)
        todo.extend(i for i in graph.producer[value].input if i)
    return False


def splice(model, placed: list, removed: set[str], value_info: list = ()):
    """A copy of ``model`` without the nodes making ``removed`` values and with each
    ``(node, at)`` of ``placed`` where the removed node making ``at`` was; nodes no graph
    output depends on any more are dropped. ``value_info`` declares the new nodes'
    outputs (ONNX's shape inference knows no custom domain: what reads them folds)."""
    import onnx

    at = {name: node for node, name in placed}
    nodes = []
    for node in model.graph.node:
        if not removed & set(node.output):
            nodes.append(node)
        nodes += [at[o] for o in node.output if o in at]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(_live(nodes, {o.name for o in out.graph.output}))
    out.graph.value_info.extend(value_info)
    if not any(o.domain == DOMAIN for o in out.opset_import):
        out.opset_import.append(onnx.helper.make_opsetid(DOMAIN, 1))
    return out


def _live(nodes: list, wanted: set[str]) -> list:
    """``nodes`` (in order) that a graph output depends on."""
    needed, keep = set(wanted), []
    for n in reversed(nodes):
        if needed & set(n.output):
            keep.append(n)
            needed.update(_reads(n))
    return keep[::-1]


def _reads(node) -> set[str]:
    """The values ``node`` reads: its inputs and those its subgraphs (a ``Loop``'s body,
    an ``If``'s branches) read from the enclosing graph by name (and their own values,
    which name nothing outside)."""
    reads = {i for i in node.input if i}
    for a in node.attribute:
        for sub in [a.g] if a.HasField("g") else list(a.graphs):
            for n in sub.node:
                reads |= _reads(n)
    return reads
