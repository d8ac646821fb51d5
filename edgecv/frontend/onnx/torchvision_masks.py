"""torchvision's Mask R-CNN, as its ONNX export writes it, onto edgecv's tagged kernels
with fixed-size outputs: what follows Faster R-CNN's three parts
(:mod:`.torchvision_rcnn`).

After the detections (``K = detections_per_img`` rows once their NMS is replaced, the
padding rows the box ``(0, 0, 0, 0)`` with score -1 and label -1) the export has two
more parts whose shapes depend on the data:

- a second MultiScaleRoIAlign, on the detections (``mask_roi_pool``): the same chain of
  ``NonZero`` per level and ``ScatterElements`` as the proposals' pooling, replaced the
  same way (:func:`.torchvision_rcnn.replace_pooling`) by one ``LevelRoiAlign`` over the
  ``K`` rows; the mask head then runs on the padding rows harmlessly;
- the masks pasted into the image (``paste_masks_in_image``): each detection's mask of
  its label padded by one pixel, its box expanded by the padding's scale and truncated
  to integers (all plain ONNX on ``K`` rows, converted as it is), then a ``Loop`` over
  the detections whose body resizes the mask to its box's size (``Resize``: a shape per
  box) and pads it into the image, the results concatenated onto a ``[0, H, W]`` start.
  The ``Loop`` is replaced by one ``edgecv.torchvision::PasteMasks`` node
  (:func:`PasteMasks`): ``[K, H, W]``, each pixel sampled from its box's resized mask
  (:mod:`edgecv.ops.paste_masks`), a padding row (score below 0, read from the
  detections' FilteredNMS) all 0.

Keypoint R-CNN has the same second pooling and, instead of the paste, a ``Loop`` from
heatmaps to keypoints (:mod:`.torchvision_keypoints`). All are recognized by how the
nodes connect (never node names); a graph with a second pooling but another ``Loop`` is
refused with the part that differs.
"""

from __future__ import annotations

from ...board.errors import ConversionError
from . import torchvision_keypoints as keypoints
from . import torchvision_rcnn as rcnn
from .detection_graph import DOMAIN, Graph, Mismatch, descends, splice
from .fold import fold, static_shapes
from .vision import _shape

OP_TYPE = "PasteMasks"


def replace(model):
    """``model`` with Faster R-CNN's parts and, when it has them, Mask R-CNN's replaced
    (module docstring); :class:`Mismatch` saying why when the graph is another form."""
    return rcnn.replace(model, heads=replace_heads)


def replace_heads(model):
    """``model`` (its detections replaced) with the second MultiScaleRoIAlign and the
    paste ``Loop`` replaced; unchanged when it has neither (Faster R-CNN)."""
    if not any(n.op_type == "ScatterElements" for n in model.graph.node):
        return model
    model = fold(rcnn.replace_pooling(model))
    loops = [n for n in model.graph.node if n.op_type == "Loop"]
    if len(loops) != 1:
        raise Mismatch(f"{len(loops)} Loop nodes follow the detections' pooling, expected "
                       f"one (the masks pasted into the image, or the keypoints)")  # fmt: skip
    if keypoints.is_keypoint_loop(loops[0]):
        body = next(a.g for a in loops[0].attribute if a.name == "body")
        outer = _outer_values(body, Graph.of(model.graph))
        return keypoints.replace_loop(model, loops[0], _detections(model), outer)
    return _replace_paste(model, loops[0])


def _detections(model):
    """The detections' FilteredNMS (the last: the proposals' comes first)."""
    nodes = [n for n in model.graph.node if n.domain == DOMAIN and n.op_type == "FilteredNMS"]
    if not nodes:
        raise Mismatch("no detections' FilteredNMS precedes the masks")
    return nodes[-1]


def _outer_values(body, graph: Graph) -> list[str]:
    """The values of the enclosing graph the ``Loop`` body reads (constants aside)."""
    made = {o for n in body.node for o in n.output} | {t.name for t in body.initializer}
    made |= {i.name for i in body.input}
    outer = [i for n in body.node for i in n.input if i and i not in made]
    return list(dict.fromkeys(i for i in outer if i not in graph.constants))


def _replace_paste(model, loop):
    """``model`` with the paste ``Loop`` replaced by one PasteMasks node."""
    import onnx

    graph = Graph.of(model.graph)
    body = next(a.g for a in loop.attribute if a.name == "body")
    if not any(n.op_type == "Resize" for n in body.node):
        raise Mismatch("the Loop after the detections' pooling resizes nothing (not a paste)")
    if len(loop.input) != 3 or len(loop.output) != 1 or loop.input[2] not in graph.constants:
        raise Mismatch("the paste Loop does not carry one value from a constant start")
    start = graph.value(loop.input[2])
    if start.ndim != 3 or start.shape[0] != 0:
        raise Mismatch(f"the paste Loop starts from {list(start.shape)}, expected [0, H, W]")
    height, width = (int(d) for d in start.shape[1:])
    shapes = static_shapes(model)
    outer = {len(shapes.get(v, [])): v for v in _outer_values(body, graph)}
    if len(outer) != 2 or set(outer) != {2, 4}:
        raise Mismatch("the paste Loop does not read one set of masks and one of boxes")
    masks, boxes = outer[4], outer[2]
    count, _, side, _ = shapes[masks]
    if shapes[boxes] != [count, 4] or shapes[masks] != [count, 1, side, side]:
        raise Mismatch(f"the paste Loop reads masks {shapes[masks]} and boxes {shapes[boxes]}, "
                       f"expected [K, 1, S, S] and [K, 4]")  # fmt: skip
    detections = _detections(model)
    if not descends(graph, boxes, detections.output[0]):
        raise Mismatch("the pasted masks' boxes are not the detections'")
    node = onnx.helper.make_node(
        OP_TYPE, [masks, boxes, detections.output[1]], [loop.output[0]], domain=DOMAIN,
        height=height, width=width,
    )  # fmt: skip
    float32 = onnx.TensorProto.FLOAT
    declared = [onnx.helper.make_tensor_value_info(loop.output[0], float32, [count, height, width])]
    return splice(model, [(node, loop.output[0])], {loop.output[0]}, declared)


def PasteMasks(bb, inputs, attrs, opset):  # noqa: N802 (named after the node)
    """``edgecv.torchvision::PasteMasks(masks [K, 1, S, S], boxes [K, 4], scores [K])`` ->
    ``[K, H, W]``: each mask resized into its integer box of the ``H x W`` image, a row
    with a negative score all 0 (module docstring)."""
    from ...ops import paste_masks as paste_op  # the TIR ops import topi: load on first use

    masks, boxes, scores = inputs
    count = _shape(masks)[0]
    dtypes = [str(x.ty.dtype) for x in inputs]
    if (
        len(_shape(masks)) != 4
        or _shape(masks)[1] != 1
        or _shape(boxes) != [count, 4]
        or _shape(scores) != [count]
        or dtypes[0] != "float32"
        or dtypes[1] not in ("int32", "int64")
    ):
        raise ConversionError(
            f"torchvision's mask paste reads float32 masks [K, 1, S, S], integer boxes "
            f"[K, 4] and scores [K], found {dtypes[0]} {_shape(masks)}, {dtypes[1]} "
            f"{_shape(boxes)} and {_shape(scores)}: export Mask R-CNN in float32"
        )
    height, width = int(attrs["height"]), int(attrs["width"])
    return bb.emit_te(paste_op.paste_masks, masks, boxes, scores, height, width,
                      primfunc_name_hint="paste_masks")  # fmt: skip
