"""Fold the shape arithmetic an exporter traces into an ONNX graph, for a static input.

torchvision's detectors compute sizes at run time from ``Shape`` (the padding that
batches images, the anchors of each feature map): with the input's shape fixed these
are constants, but TVM's converter sees tensors of unknown values and cannot reshape by
them. :func:`fold` replaces every node whose inputs are constants (initializers,
``Constant`` nodes, the ``Shape`` of a value ONNX's shape inference gives a static shape)
by an initializer with its value, computed by ONNX's reference evaluator. Nodes reading
large tensors (weights) and nodes of other domains are left to the converter.
"""

from __future__ import annotations

import numpy as np

# a node reading a constant larger than this is left alone (a weight's Identity)
LARGEST_INPUT = 1 << 16


def static_shapes(model) -> dict[str, list[int]]:
    """Every value's shape that ONNX's shape inference finds static."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    shapes = {}
    graph = inferred.graph
    for value in [*graph.input, *graph.value_info, *graph.output]:
        dims = value.type.tensor_type.shape.dim
        if value.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = [d.dim_value for d in dims]
    return shapes


def fold(model, rounds: int = 8):
    """``model`` with its constant sub-computations folded into initializers (module
    docstring); the input is not changed. Folding makes more shapes static (a ``Resize``
    to computed sizes), so it repeats while a round folds anything."""
    for _ in range(rounds):
        model, folded = _fold_round(model)
        if not folded:
            break
    return model


def _fold_round(model):
    import onnx
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    shapes = static_shapes(model)
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    kept, added = [], []
    for node in model.graph.node:
        value = _fold_one(node, values, shapes, ReferenceEvaluator)
        if value is None:
            kept.append(node)
            continue
        for name, array in zip(node.output, value, strict=True):
            values[name] = array
            added.append(numpy_helper.from_array(np.asarray(array), name))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(kept)
    out.graph.initializer.extend(added)
    return out, len(added)


def _fold_one(node, values: dict, shapes: dict, evaluator) -> list | None:
    """The values of ``node``'s outputs when it can be folded, else None."""
    import onnx

    if node.domain not in ("", "ai.onnx") or node.op_type in ("If", "Loop", "Scan"):
        return None
    if node.op_type == "Shape" and node.input[0] in shapes and node.input[0] not in values:
        start = next((a.i for a in node.attribute if a.name == "start"), 0)
        end = next((a.i for a in node.attribute if a.name == "end"), None)
        return [np.asarray(shapes[node.input[0]][start:end], np.int64)]
    given = [i for i in node.input if i]
    if node.op_type != "Constant" and (not given or any(i not in values for i in given)):
        return None
    if any(values[i].size > LARGEST_INPUT for i in given):
        return None
    inputs = [onnx.helper.make_tensor_value_info(i, 0, None) for i in given]
    outputs = [onnx.helper.make_tensor_value_info(o, 0, None) for o in node.output]
    graph = onnx.helper.make_graph([node], "fold", inputs, outputs)
    try:
        results = evaluator(onnx.helper.make_model(graph)).run(None, {i: values[i] for i in given})
    except Exception:  # an op the reference evaluator lacks: the converter takes the node
        return None
    return [np.asarray(r) for r in results]
