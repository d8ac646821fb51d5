"""torchvision's two-stage detectors (Faster R-CNN), as its ONNX export writes them, onto
edgecv's tagged kernels with fixed-size outputs.

Three parts of the graph have shapes that depend on the data:

- the region proposals: the RPN's best ``pre_nms_top_n`` anchors per level (a ``TopK``
  whose ``k`` folds to a constant for the fixed input: it converts as it is), their
  boxes decoded and clipped, then *filtered*: the boxes smaller than ``min_size`` and
  the scores under ``score_thresh`` dropped (each a ``Gather`` of the rows by
  ``NonZero`` of a per-row condition), torchvision's batched NMS by level
  (:class:`.detection_graph.BatchedNMSNodes`) and the first ``post_nms_top_n`` kept;
- MultiScaleRoIAlign: each proposal's level from its area, the proposals of each level
  (``NonZero(Equal(levels, l))``) pooled by a ``RoiAlign`` of that level's feature
  map, the results scattered back into proposal order (``ScatterElements`` into zeros);
- the detections: the box head's classes decoded per proposal, the background dropped,
  filtered as the proposals are (scores above ``box_score_thresh``, boxes of a side
  under 0.01 dropped), the batched NMS by class, the first ``detections_per_img``.

They are replaced, in that order, by how the nodes connect (never node names):

- a filter's ``Gather`` becomes its input, all rows kept, and its condition, computed
  per row on all rows, joins the ``edgecv.torchvision::FilteredNMS`` node replacing
  the batched NMS (:func:`FilteredNMS`): one ``box_nms`` over the rows, those failing a
  condition dropped, offset by label as torchvision offsets the rows that pass, the
  first ``K`` kept rows then padding (boxes 0, score -1, label -1). The proposals are
  ``K = post_nms_top_n`` rows whatever the NMS keeps: a padding row is the box
  ``(0, 0, 0, 0)``, whose decoded detections have no width and are dropped by the
  detections' own small-box filter, as the rows ONNX Runtime never has;
- the pooling by one ``edgecv.torchvision::LevelRoiAlign`` node (:func:`LevelRoiAlign`):
  each level's ``RoiAlign`` over all the proposals, a proposal of another level given
  the batch index -1 (edgecv's ``roi_align`` writes a zero row for it without sampling),
  and the levels' results added: the scatter's values, every row from its own level.

The shape arithmetic after each replacement (the proposals' count, the box decoding's
reshapes) is folded for the fixed input (:func:`.fold.fold`) before the next.
"""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax import op as R

from ...board.errors import ConversionError
from .detection_graph import DOMAIN, BatchedNMSNodes, Graph, Mismatch, attribute, nms_branch
from .detection_graph import splice as splice_nodes
from .fold import fold, static_shapes
from .torchvision_levels import batched_detections
from .vision import _shape
from .vision_roi import RoiAlign

# how a filter's row indices are taken from NonZero's output ([1, n]: transposed, squeezed)
INDEX_STEPS = ("Transpose", "Squeeze", "Reshape", "Gather", "Unsqueeze", "Cast", "Slice", "Split")
# how MultiScaleRoIAlign's row indices reach ScatterElements ([n] -> [n, C, H, W])
SCATTER_STEPS = (*INDEX_STEPS, "Expand")
PARTS = ("boxes", "scores", "labels")
# readers of a filter's indices that die with what is replaced (the shape arithmetic of
# the filtered rows, the scatter); :func:`replace` checks that no NonZero is left
PASSED_READERS = ("Shape", "Expand", "ScatterElements")
ROI_ATTRS = ("mode", "output_height", "output_width", "sampling_ratio")


def replace(model, heads=None):
    """``model`` with Faster R-CNN's proposals, pooling and detections replaced (module
    docstring); :class:`Mismatch` saying why when the graph is another form. ``heads``
    (a function of the model) replaces what follows the detections (Mask R-CNN's,
    :mod:`.torchvision_masks`) before the check that nothing data-dependent is left."""
    model = fold(model)
    ifs = _nms_ifs(model)
    if len(ifs) != 2:
        raise Mismatch(
            f"{len(ifs)} If nodes hold a NonMaxSuppression, expected two (the proposals' "
            f"and the detections')"
        )
    model = fold(_replace_nms(model, ifs[0], ("boxes",), "the proposals"))
    model = fold(replace_pooling(model))
    (last,) = _nms_ifs(model)
    model = _replace_nms(model, last, PARTS, "the detections")
    if heads is not None:
        model = heads(model)
    left = sorted({n.op_type for n in model.graph.node} & {"Loop", "NonZero", "ScatterElements"})
    if left:
        raise Mismatch(f"{' and '.join(left)} read outside the filters, poolings and heads")
    return model


def _nms_ifs(model) -> list:
    return [n for n in model.graph.node if n.op_type == "If" and nms_branch(n) is not None]


def _replace_nms(model, if_node, gathered: tuple, what: str):
    """``model`` with the batched NMS of ``if_node`` and the filters before it replaced
    by one FilteredNMS node."""
    import onnx

    graph = Graph.of(model.graph)
    nms = BatchedNMSNodes.of(graph, if_node, gathered)
    sources, nonzeros = {}, None
    for part in PARTS:
        sources[part], found = _unfiltered(graph, getattr(nms, part))
        if nonzeros is not None and found != nonzeros:
            raise Mismatch(f"{what}' boxes, scores and labels are not filtered alike")
        nonzeros = found
    if not nonzeros:
        raise Mismatch(f"{what} are not filtered by NonZero before their NMS")
    shapes = static_shapes(model)
    n = shapes.get(sources["scores"], [None])[0]
    if shapes.get(sources["scores"]) != [n] or n is None:
        raise Mismatch(f"{what}' scores `{sources['scores']}` are not one static dimension")
    keep = min(nms.detections, n)
    outputs = [nms.outputs.get(p, f"{if_node.output[0]}_{p}") for p in PARTS]
    order = {o: i for i, n in enumerate(model.graph.node) for o in n.output}
    conditions = [graph.producer[z].input[0] for z in sorted(nonzeros, key=order.get)]
    node = onnx.helper.make_node(
        "FilteredNMS", [sources[p] for p in PARTS] + conditions, outputs, domain=DOMAIN,
        iou_threshold=nms.iou, detections=keep,
    )  # fmt: skip
    placed, removed = _all_rows(graph, nonzeros)
    placed.append((node, if_node.output[0]))
    removed |= nms.removed
    float32, int64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    declared = [
        onnx.helper.make_tensor_value_info(outputs[0], float32, [keep, 4]),
        onnx.helper.make_tensor_value_info(outputs[1], float32, [keep]),
        onnx.helper.make_tensor_value_info(outputs[2], int64, [keep]),
    ]
    return splice_nodes(model, placed, removed, declared)


def _row_filter(graph: Graph, node):
    """The ``NonZero`` whose indices ``node`` (a ``Gather`` on axis 0) takes rows by,
    else None."""
    if node is None or node.op_type != "Gather" or int(attribute(node, "axis", 0)) != 0:
        return None
    step = graph.producer.get(node.input[1])
    while step is not None and step.op_type in INDEX_STEPS:
        step = graph.producer.get(step.input[0])
    return step if step is not None and step.op_type == "NonZero" else None


def _unfiltered(graph: Graph, name: str) -> tuple[str, frozenset]:
    """The value ``name`` is taken from by filters (``Gather`` of rows by ``NonZero``),
    and the outputs of those ``NonZero`` nodes."""
    found = set()
    node = graph.producer.get(name)
    while (nonzero := _row_filter(graph, node)) is not None:
        found.add(nonzero.output[0])
        name = node.input[0]
        node = graph.producer.get(name)
    return name, frozenset(found)


def _all_rows(graph: Graph, nonzeros) -> tuple[list, set]:
    """Each ``Gather`` of rows by the ``NonZero`` outputs ``nonzeros`` replaced by its
    input, all rows kept: the nodes to place and the values they replace."""
    import onnx

    placed, removed = [], set()
    for gather in _filters(graph, nonzeros):
        name = gather.output[0]
        placed.append((onnx.helper.make_node("Identity", [gather.input[0]], [name]), name))
        removed.add(name)
    return placed, removed


def _filters(graph: Graph, nonzeros) -> list:
    """Every ``Gather`` of rows by the indices of the ``NonZero`` outputs ``nonzeros``."""
    found, todo, seen = [], list(nonzeros), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for reader in graph.readers.get(name, []):
            if reader.op_type == "Gather" and reader.input[1] == name:
                if _row_filter(graph, reader) is None:
                    raise Mismatch("a NonZero's indices are read by a Gather not on rows")
                found.append(reader)
            elif reader.op_type in INDEX_STEPS and reader.input[0] == name:
                todo.extend(reader.output)
            elif reader.op_type not in PASSED_READERS:
                raise Mismatch(f"a filter's indices are read by {reader.op_type}")
    return found


def replace_pooling(model):
    """``model`` with the first MultiScaleRoIAlign's (in graph order) per-level pooling
    and scatter replaced by one LevelRoiAlign node; Mask R-CNN's second, on the
    detections, is replaced by calling this again once they have a static count."""
    import onnx

    graph = Graph.of(model.graph)
    chain = _scatter_chain(graph, model)
    inputs, scales, shared, nonzeros = [], [], set(), set()
    for scatter in chain:
        if int(attribute(scatter, "axis", 0)) != 0:
            raise Mismatch("MultiScaleRoIAlign's results are not scattered by rows")
        roi = graph.producer.get(scatter.input[2])
        while roi is not None and roi.op_type == "Cast":
            roi = graph.producer.get(roi.input[0])
        if roi is None or roi.op_type != "RoiAlign":
            raise Mismatch("a level's scattered rows are not a RoiAlign's")
        nonzero = _scatter_rows(graph, scatter.input[1])
        nonzeros.add(nonzero.output[0])
        scales.append(float(attribute(roi, "spatial_scale", 1.0)))
        kept = {a: attribute(roi, a) for a in (*ROI_ATTRS, "coordinate_transformation_mode")}
        shared.add(tuple(sorted((k, v) for k, v in kept.items() if v is not None)))
        inputs += [nonzero.input[0], *roi.input[:3]]
    if len(shared) != 1:
        raise Mismatch("the levels' RoiAlign attributes other than the scale differ")
    placed, removed = _all_rows(graph, nonzeros)
    removed.add(chain[-1].output[0])
    node = onnx.helper.make_node(
        "LevelRoiAlign", inputs, [chain[-1].output[0]], domain=DOMAIN, spatial_scales=scales,
        **dict(shared.pop()),
    )  # fmt: skip
    placed.append((node, chain[-1].output[0]))
    shapes = static_shapes(model)
    rows = {tuple(shapes.get(r, [])) for r in inputs[::4]}
    channels = {tuple(shapes.get(x, [0, 0])[1:2]) for x in inputs[1::4]}
    if len(rows) != 1 or len(channels) != 1 or len(rows.pop()) != 1 or channels == {()}:
        raise Mismatch("the proposals' levels or the feature maps have no static shape")
    shape = [shapes[inputs[0]][0], channels.pop()[0]]
    shape += [int(attribute(roi, "output_height", 1)), int(attribute(roi, "output_width", 1))]
    declared = [onnx.helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, shape)]
    return splice_nodes(model, placed, removed, declared)


def _scatter_chain(graph: Graph, model) -> list:
    """The ``ScatterElements`` nodes writing the levels' results into zeros, in order."""
    scatters = [n for n in model.graph.node if n.op_type == "ScatterElements"]
    ends = [
        s
        for s in scatters
        if not any(r.op_type == "ScatterElements" for r in graph.readers.get(s.output[0], []))
    ]
    if not ends:
        raise Mismatch("no chain of ScatterElements (MultiScaleRoIAlign) is left to replace")
    chain = [ends[0]]  # the first in graph order: the chains do not interleave
    while (prev := graph.producer.get(chain[0].input[0])) is not None and (
        prev.op_type == "ScatterElements"
    ):
        chain.insert(0, prev)
    base = chain[0].input[0]
    fill = graph.producer.get(base)
    if base in graph.constants:
        zeros = not graph.value(base).any()
    else:  # its shape read from the levels' results: folded later, once they have one
        zeros = fill is not None and fill.op_type == "ConstantOfShape"
        value = attribute(fill, "value") if zeros else None
        zeros = zeros and (value is None or not _array(value).any())
    if not zeros:
        raise Mismatch("MultiScaleRoIAlign's results are not scattered into zeros")
    return chain


def _array(tensor) -> np.ndarray:
    from onnx import numpy_helper

    return numpy_helper.to_array(tensor)


def _scatter_rows(graph: Graph, name: str):
    """The ``NonZero`` choosing the rows a level's results are scattered to."""
    step = graph.producer.get(name)
    while step is not None and step.op_type in SCATTER_STEPS:
        step = graph.producer.get(step.input[0])
    if step is None or step.op_type != "NonZero":
        raise Mismatch("a level's results are not scattered to the rows of a NonZero")
    return step


def FilteredNMS(bb, inputs, attrs, opset):  # noqa: N802 (named after the node)
    """``edgecv.torchvision::FilteredNMS(boxes [N, 4], scores [N], labels [N], condition
    [N], ...)`` -> boxes ``[K, 4]``, scores ``[K]``, labels ``[K]`` (int64): torchvision's
    batched NMS of the rows meeting every condition (module docstring)."""
    boxes, scores, labels, *conditions = inputs
    n = _shape(scores)[0]
    if (
        _shape(boxes) != [n, 4]
        or _shape(labels) != [n]
        or any(_shape(c) != [n] for c in conditions)
    ):
        raise ConversionError(
            f"torchvision's filtered batched NMS reads boxes [N, 4], scores [N], labels "
            f"[N] and conditions [N], found {_shape(boxes)}, {_shape(scores)}, "
            f"{_shape(labels)} and {[_shape(c) for c in conditions]}"
        )
    valid = None
    for condition in conditions:
        if str(condition.ty.dtype) != "bool":
            condition = R.not_equal(condition, relax.const(0, str(condition.ty.dtype)))
        valid = condition if valid is None else R.logical_and(valid, condition)
    lowest = float(np.finfo(np.float32).min)  # a row failing a condition: below it
    if valid is not None:
        scores = bb.normalize(R.where(valid, scores, relax.const(-np.inf, "float32")))
    labels = bb.normalize(R.astype(labels, "int64"))
    keep = min(int(attrs["detections"]), n)
    return batched_detections(bb, boxes, scores, labels, lowest, attrs["iou_threshold"], keep)


def LevelRoiAlign(bb, inputs, attrs, opset):  # noqa: N802 (named after the node)
    """``edgecv.torchvision::LevelRoiAlign(rows_0, X_0, rois_0, batch_0, rows_1, ...)``
    -> ``[R, C, H, W]``: each level ``l``'s RoiAlign of ``X_l`` over the rois where
    ``rows_l`` holds (batch index -1 elsewhere: a zero row), the levels added."""
    scales = list(attrs["spatial_scales"])
    if len(inputs) != 4 * len(scales):
        raise ConversionError(
            f"LevelRoiAlign reads four inputs per level, found {len(inputs)} for "
            f"{len(scales)} levels"
        )
    total = None
    for level, scale in enumerate(scales):
        rows, data, rois, batch = inputs[4 * level : 4 * level + 4]
        if str(rows.ty.dtype) != "bool":
            rows = R.not_equal(rows, relax.const(0, str(rows.ty.dtype)))
        batch = bb.normalize(R.where(rows, batch, relax.const(-1, str(batch.ty.dtype))))
        level_attrs = {k: v for k, v in attrs.items() if k != "spatial_scales"}
        pooled = RoiAlign(bb, [data, rois, batch], {**level_attrs, "spatial_scale": scale}, opset)
        total = pooled if total is None else bb.normalize(R.add(total, pooled))
    return total
