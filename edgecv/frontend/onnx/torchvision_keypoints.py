"""torchvision's Keypoint R-CNN heatmaps-to-keypoints loop, as its ONNX export writes it,
onto one fixed-size node: what follows its detections' second MultiScaleRoIAlign
(:mod:`.torchvision_masks` replaces that pooling and calls :func:`replace_loop`).

The keypoint head gives ``J`` heatmaps of ``S x S`` per detection; torchvision
(``heatmaps_to_keypoints``) resizes each detection's to its box's size (bicubic, a shape
per box) in a ``Loop`` over the detections and takes each heatmap's argmax as the
keypoint, its value as the score, the results concatenated onto ``[0, 3, J]`` and
``[0, J]`` starts. The ``Loop`` is replaced by one ``edgecv.torchvision::HeatmapKeypoints``
node (:func:`HeatmapKeypoints`, :mod:`edgecv.ops.heatmap_keypoints`) reading the
heatmaps and the detections' boxes and scores: keypoints ``[K, 3, J]`` (transposed
after it, as the loop's were) and scores ``[K, J]``, a padding row (score below 0) all
0. The argmax runs over a grid as large as the largest box: the image the backbone
reads (the first convolution's input), which holds every detection.
"""

from __future__ import annotations

from ...board.errors import ConversionError
from .detection_graph import DOMAIN, Graph, Mismatch, descends, splice
from .fold import static_shapes
from .vision import _shape

OP_TYPE = "HeatmapKeypoints"


def is_keypoint_loop(loop) -> bool:
    """Whether ``loop``'s body takes an argmax of resized maps (not a mask paste)."""
    body = next(a.g for a in loop.attribute if a.name == "body")
    ops = {n.op_type for n in body.node}
    return {"Resize", "ArgMax"} <= ops


def replace_loop(model, loop, detections, outer: list[str]):
    """``model`` with the keypoint ``Loop`` replaced by one HeatmapKeypoints node;
    ``detections`` is the detections' FilteredNMS, ``outer`` the values of the graph
    the loop's body reads."""
    import onnx

    graph = Graph.of(model.graph)
    shapes = static_shapes(model)
    if len(loop.input) != 4 or len(loop.output) != 2:
        raise Mismatch("the keypoint Loop does not carry keypoints and scores")
    maps = [v for v in outer if len(shapes.get(v, [])) == 4]
    if len(maps) != 1:
        raise Mismatch(f"the keypoint Loop reads {len(maps)} sets of heatmaps, expected one")
    count, joints, side, _ = shapes[maps[0]]
    boxes, scores = detections.output[0], detections.output[1]
    others = [v for v in outer if v != maps[0]]
    if shapes[maps[0]] != [count, joints, side, side] or shapes.get(boxes) != [count, 4]:
        raise Mismatch(f"the keypoint Loop reads heatmaps {shapes[maps[0]]} for "
                       f"{shapes.get(boxes)} boxes, expected [K, J, S, S] and [K, 4]")  # fmt: skip
    if not all(descends(graph, v, boxes) for v in others):
        raise Mismatch("the keypoint Loop reads values other than the detections' boxes")
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    image = shapes.get(convs[0].input[0], []) if convs else []
    if len(image) != 4:
        raise Mismatch("the image the backbone reads has no static shape")
    node = onnx.helper.make_node(
        OP_TYPE, [maps[0], boxes, scores], list(loop.output), domain=DOMAIN,
        height=int(image[2]), width=int(image[3]),
    )  # fmt: skip
    float32 = onnx.TensorProto.FLOAT
    declared = [
        onnx.helper.make_tensor_value_info(loop.output[0], float32, [count, 3, joints]),
        onnx.helper.make_tensor_value_info(loop.output[1], float32, [count, joints]),
    ]
    return splice(model, [(node, loop.output[0])], set(loop.output), declared)


def HeatmapKeypoints(bb, inputs, attrs, opset):  # noqa: N802 (named after the node)
    """``edgecv.torchvision::HeatmapKeypoints(heatmaps [K, J, S, S], boxes [K, 4], scores
    [K])`` -> keypoints ``[K, 3, J]``, scores ``[K, J]`` (module docstring)."""
    from tvm import relax

    from ...ops import heatmap_keypoints as keypoints_op  # TIR ops: loaded on first use

    maps, boxes, scores = inputs
    count = _shape(maps)[0]
    dtypes = {str(x.ty.dtype) for x in inputs}
    if (
        len(_shape(maps)) != 4
        or _shape(boxes) != [count, 4]
        or _shape(scores) != [count]
        or dtypes != {"float32"}
    ):
        raise ConversionError(
            f"torchvision's heatmaps-to-keypoints reads float32 heatmaps [K, J, S, S], "
            f"boxes [K, 4] and scores [K], found {_shape(maps)}, {_shape(boxes)} and "
            f"{_shape(scores)} ({', '.join(sorted(dtypes))}): export Keypoint R-CNN in float32"
        )
    out = bb.emit_te(keypoints_op.heatmap_keypoints, maps, boxes, scores,
                     int(attrs["height"]), int(attrs["width"]),
                     primfunc_name_hint="heatmap_keypoints")  # fmt: skip
    return relax.Tuple([bb.normalize(relax.TupleGetItem(out, i)) for i in range(2)])
