"""Ultralytics' end-to-end NMS head (``model.export(format="onnx", nms=True)``) onto
edgecv's tagged ``box_nms``, with its fixed ``[B, max_det, 6]`` output.

Ultralytics wraps the detector's raw head ``H [B, 4 + C, N]`` (corner boxes, then class
scores) in a loop over the batch, unrolled by the export: per image, the best class and
its score (``ReduceMax``/``ArgMax`` of the transposed head's score columns), the anchors
scoring above ``conf`` (``Greater`` -> ``NonZero`` -> ``GatherND``), their boxes scaled
to ``box / S * m`` and moved by ``class * m`` so classes never overlap (``S`` the input's
longest side, ``m`` one over the classes), one ``NonMaxSuppression``, the first
``max_det`` kept gathered into rows ``x1, y1, x2, y2, score, class`` and zero-padded
(``Pad``, ``ScatterND``). A static plan holds none of its data-dependent shapes, so
:func:`rewrite` recognizes it by how the nodes connect (op types, constants read from the
graph, never node names) and replaces it with one node, ``edgecv.ultralytics::NMS``,
which :func:`NMS` converts: the same scores, classes and moved boxes, one ``box_nms``
over each image's ``N`` anchors (the score threshold its valid threshold), the kept rows
(best first, as ONNX Runtime orders them) gathered from the original boxes, zeros after.
A graph with this head in another form (a segmentation or pose head's extra columns, a
threshold computed at run time) is refused in one line.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import relax
from tvm.relax import op as R

from ...board.errors import ConversionError
from .vision import _shape, suppressed

DOMAIN = "edgecv.ultralytics"
OP_TYPE = "UltralyticsNMS"


@dataclass
class _Graph:
    """Who makes and who reads each value of one ONNX graph, and its initializers."""

    model: object
    producer: dict
    values: dict  # every value asked of constant() (None: not a constant)

    @classmethod
    def of(cls, model) -> _Graph:
        producer = {o: n for n in model.graph.node for o in n.output}
        stored = {t.name for t in model.graph.initializer}
        dynamic = {i.name for i in model.graph.input if i.name not in stored}
        for node in model.graph.node:  # in order: an ONNX graph is sorted
            if node.op_type in ("NonZero", "RandomNormal", "RandomUniform") or dynamic & set(
                node.input
            ):
                dynamic.update(node.output)
        return cls(model, producer, dict.fromkeys(dynamic))

    def ancestors(self, names) -> list:
        """The nodes ``names`` are computed from, each once."""
        seen, stack, found = set(), list(names), []
        while stack:
            node = self.producer.get(stack.pop())
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            found.append(node)
            stack.extend(i for i in node.input if i)
        return found

    def constant(self, name: str) -> np.ndarray | None:
        """The value of ``name`` when it depends on no input (an initializer, a
        ``Constant``, or a small computation of them, evaluated by ONNX's reference
        evaluator), else None."""
        if name not in self.values:
            self.values[name] = self._evaluated(name)
        return self.values[name]

    def _evaluated(self, name: str) -> np.ndarray | None:
        from onnx import numpy_helper

        stored = [t for t in self.model.graph.initializer if t.name == name]
        if stored:
            try:
                return numpy_helper.to_array(stored[0])
            except ValueError:  # a weight without its data (tests' stripped graphs)
                return None
        node = self.producer.get(name)
        if node is None:
            return None
        given = [i for i in node.input if i]
        values = []
        for i in given:  # stops at the first input that is not constant
            values.append(self.constant(i))
            if values[-1] is None:
                return None
        import onnx
        from onnx.reference import ReferenceEvaluator

        ins = [onnx.helper.make_tensor_value_info(i, 0, None) for i in given]
        outs = [onnx.helper.make_tensor_value_info(o, 0, None) for o in node.output]
        graph = onnx.helper.make_graph([node], "constant", ins, outs)
        model = onnx.helper.make_model(graph, opset_imports=list(self.model.opset_import))
        result = ReferenceEvaluator(model).run(None, dict(zip(given, values, strict=True)))
        return np.asarray(result[list(node.output).index(name)])


def _attr(node, name: str, default=None):
    import onnx

    found = [a for a in node.attribute if a.name == name]
    return onnx.helper.get_attribute_value(found[0]) if found else default


def _scalar(graph: _Graph, name: str, what: str, source: str) -> float:
    value = graph.constant(name)
    if value is None or value.size != 1:
        raise ConversionError(
            f"{source}: Ultralytics' NMS head has a {what} computed at run time; edgecv maps "
            "it only with constants (export again with ultralytics' own exporter)"
        )
    return float(value.reshape(()))


def _refuse(source: str, what: str) -> ConversionError:
    return ConversionError(
        f"{source}: a NonMaxSuppression reads an Ultralytics-style head, but {what}; "
        "edgecv maps the head model.export(format='onnx', nms=True) writes for detection "
        "models (see docs/models.md, ONNX)"
    )


def _score_columns(graph: _Graph, nms) -> tuple | None:
    """The ``ReduceMax`` and ``ArgMax`` over the last axis of one ``Slice`` of a
    ``Transpose(perm=[0, 2, 1])`` that NMS's scores come from, and that Transpose; None
    when the scores come from elsewhere (not Ultralytics' head)."""
    for node in graph.ancestors([nms.input[1]]):
        if node.op_type != "ReduceMax":
            continue
        sliced = graph.producer.get(node.input[0])
        if sliced is None or sliced.op_type != "Slice":
            continue
        transpose = graph.producer.get(sliced.input[0])
        if transpose is None or transpose.op_type != "Transpose":
            continue
        if list(_attr(transpose, "perm", [])) != [0, 2, 1]:
            continue
        argmax = [
            n
            for n in graph.model.graph.node
            if n.op_type == "ArgMax" and n.input[0] == sliced.output[0]
        ]
        if argmax:
            return node, argmax[0], sliced, transpose
    return None


@dataclass
class _Head:
    """What :func:`rewrite` reads of Ultralytics' NMS head."""

    head: str  # the raw head's value [B, 4 + C, N]
    output: str  # the graph output [B, max_det, 6]
    nodes: list  # the nodes the head is made of (replaced)
    attrs: dict  # the UltralyticsNMS node's attributes


def _find(model, source: str) -> _Head | None:
    import onnx

    graph = _Graph.of(model)
    nms_nodes = [n for n in model.graph.node if n.op_type == "NonMaxSuppression"]
    found = [_score_columns(graph, n) for n in nms_nodes]
    if not nms_nodes or any(f is None for f in found):
        return None
    if len({f[3].output[0] for f in found}) != 1:
        raise _refuse(source, "its NonMaxSuppression nodes read different heads")
    reduce_max, argmax, sliced, transpose = found[0]
    head = transpose.input[0]
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {
        v.name: [
            d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim
        ]
        for v in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]
    }
    batch, rows, n = (shapes.get(head) or [None, None, None])[:3]
    begin = graph.constant(sliced.input[1])
    end = graph.constant(sliced.input[2])
    if None in (batch, rows, n) or begin is None or end is None:
        raise _refuse(source, "its head's shape or score columns are not static")
    classes = int(min(int(end.reshape(-1)[0]), rows)) - int(begin.reshape(-1)[0])
    if int(begin.reshape(-1)[0]) != 4 or 4 + classes != rows:
        raise _refuse(source, f"its head has {rows - 4 - classes} columns after the classes")
    if len(nms_nodes) != batch:
        raise _refuse(source, f"it has {len(nms_nodes)} NonMaxSuppression nodes for {batch} images")
    outputs = [
        o.name
        for o in model.graph.output
        if any(a.op_type == "NonMaxSuppression" for a in graph.ancestors([o.name]))
    ]
    if len(outputs) != 1 or shapes.get(outputs[0], [None])[-1:] != [6]:
        raise _refuse(source, "it does not end in one [B, max_det, 6] output")
    max_det = shapes[outputs[0]]
    if max_det != [batch, max_det[1], 6] or max_det[1] is None:
        raise _refuse(source, f"its output's shape is {max_det}, not [{batch}, max_det, 6]")
    attrs = _thresholds(graph, nms_nodes, argmax, head, source)
    attrs.update(classes=classes, max_det=int(max_det[1]))
    backbone = {id(n) for n in graph.ancestors([head])}
    nodes = [n for n in graph.ancestors(outputs) if id(n) not in backbone]
    made = {o for n in nodes for o in n.output}
    for node in nodes:
        for name in node.input:
            if name and name not in made and name != head and graph.constant(name) is None:
                raise _refuse(source, f"its {node.op_type} reads `{name}` besides the head")
    return _Head(head, outputs[0], nodes, attrs)


def _thresholds(graph: _Graph, nms_nodes: list, argmax, head: str, source: str) -> dict:
    """conf, iou, the boxes' scale and the class offset's factor, read from the graph
    (the same in every image's copy of the loop)."""
    nms = nms_nodes[0]
    if len(nms.input) > 4 and nms.input[4]:
        raise _refuse(source, "its NonMaxSuppression has a score threshold of its own")
    most = _scalar(graph, nms.input[2], "max_output_boxes_per_class", source)
    iou = _scalar(graph, nms.input[3], "iou_threshold", source)
    greater = [n for n in graph.ancestors([nms.input[1]]) if n.op_type == "Greater"]
    if len(greater) != 1:
        raise _refuse(source, "its scores are not thresholded by one Greater")
    conf = _scalar(graph, greater[0].input[1], "confidence threshold", source)
    backbone = {id(n) for n in graph.ancestors([head])}
    box_path = [
        n
        for n in graph.ancestors([nms.input[0]])
        if id(n) not in backbone and graph.constant(n.output[0]) is None  # not shape math
    ]
    from_class = {id(n) for n in box_path if id(argmax) in map(id, graph.ancestors(n.output[:1]))}

    def scalar_input(node) -> tuple[int, float] | None:
        """(position, value) of a node's one float scalar constant input (the boxes'
        arithmetic; the shape arithmetic beside it is in integers)."""
        for i, name in enumerate(node.input):
            value = graph.constant(name)
            if value is not None and value.size == 1 and value.dtype.kind == "f":
                return i, float(value.reshape(()))
        return None

    scaled = [n for n in box_path if n.op_type in ("Mul", "Div") and scalar_input(n)]
    divisors = [n for n in scaled if n.op_type == "Div" and id(n) not in from_class]
    box_muls = [n for n in scaled if n.op_type == "Mul" and id(n) not in from_class]
    class_muls = [n for n in scaled if n.op_type == "Mul" and id(n) in from_class]
    if len(divisors) > 1 or len(box_muls) > 1 or len(class_muls) > 1:
        raise _refuse(source, "its boxes are scaled in a form edgecv does not map")
    if divisors and scalar_input(divisors[0])[0] != 1:
        raise _refuse(source, "its boxes divide a constant, not by one")

    def factor(nodes: list) -> float:
        return scalar_input(nodes[0])[1] if nodes else 1.0

    classwise = any(n.op_type == "Add" and id(n) in from_class for n in box_path)
    return dict(
        conf=conf,
        iou=iou,
        most=int(min(most, np.iinfo(np.int32).max)),  # INT64_MAX: every box
        scale=factor(divisors),
        box_factor=factor(box_muls),
        class_factor=factor(class_muls) if classwise else 0.0,
    )


def rewrite(model, source: str):
    """``model`` with Ultralytics' NMS head replaced by one ``UltralyticsNMS`` node
    (module docstring); unchanged when it has none."""
    import onnx

    found = _find(model, source)
    if found is None:
        return model
    replaced = {id(n) for n in found.nodes}
    node = onnx.helper.make_node(
        OP_TYPE, [found.head], [found.output], domain=DOMAIN, **found.attrs
    )
    kept = [n for n in model.graph.node if id(n) not in replaced]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(kept + [node])
    return out


def NMS(bb, inputs, attrs, opset):  # noqa: N802 (named after the node)
    """``edgecv.ultralytics::UltralyticsNMS(head [B, 4 + C, N])`` -> ``[B, max_det, 6]``
    (module docstring)."""

    (head,) = inputs
    batch, rows, n = _shape(head)
    classes, max_det = int(attrs["classes"]), int(attrs["max_det"])
    if rows != 4 + classes:
        raise ConversionError(f"Ultralytics' head is [B, 4 + {classes}, N], found {_shape(head)}")
    f32 = "float32"
    boxes = bb.normalize(R.permute_dims(R.strided_slice(head, [1], [0], [4]), [0, 2, 1]))
    scores = bb.normalize(R.strided_slice(head, [1], [4], [rows]))
    best = bb.normalize(R.max(scores, axis=1))  # [B, N]
    label = bb.normalize(R.astype(R.argmax(scores, axis=1), f32))
    moved = R.multiply(
        R.divide(boxes, relax.const(attrs["scale"], f32)), relax.const(attrs["box_factor"], f32)
    )
    if attrs["class_factor"]:
        offset = R.multiply(R.expand_dims(label, -1), relax.const(attrs["class_factor"], f32))
        moved = R.add(moved, offset)
    moved = bb.normalize(moved)
    first = R.strided_slice(moved, [2], [0], [2])
    second = R.strided_slice(moved, [2], [2], [4])
    corners = R.concat([R.minimum(first, second), R.maximum(first, second)], axis=-1)
    index = R.broadcast_to(relax.const(np.arange(n, dtype=np.float32)[:, None]), (batch, n, 1))
    data = bb.normalize(R.concat([index, R.expand_dims(best, -1), corners], axis=-1))
    keep = min(max_det, n, int(attrs["most"]))
    conf = float(np.float32(attrs["conf"]))
    kept = suppressed(bb, data, iou=float(attrs["iou"]), valid=conf, fmt="corner", keep=keep)
    return _rows(bb, kept, boxes, label, keep, max_det)


def _rows(bb, kept, boxes, label, keep: int, max_det: int) -> relax.Expr:
    """``[B, max_det, 6]`` rows ``x1, y1, x2, y2, score, class`` of ``box_nms``'s kept
    rows ``(B, keep, 6)``, the original boxes gathered by their anchor; zeros after."""
    batch = _shape(kept)[0]
    kept = bb.normalize(R.strided_slice(kept, [1], [0], [keep]))
    position = bb.normalize(R.strided_slice(kept, [2], [0], [1]))  # [B, keep, 1], -1 padding
    found = bb.normalize(R.greater_equal(position, relax.const(0.0, "float32")))
    anchor = bb.normalize(R.astype(R.maximum(position, relax.const(0.0, "float32")), "int64"))
    corner = R.gather_elements(boxes, R.broadcast_to(anchor, (batch, keep, 4)), axis=1)
    cls = R.expand_dims(R.gather_elements(label, R.reshape(anchor, (batch, keep)), axis=1), -1)
    score = R.strided_slice(kept, [2], [1], [2])
    rows = R.where(found, R.concat([corner, score, cls], axis=-1), relax.const(0.0, "float32"))
    if keep < max_det:
        rows = R.concat([rows, relax.const(np.zeros((batch, max_det - keep, 6), np.float32))], 1)
    return bb.normalize(rows)
