"""torchvision's Mask R-CNN exported to ONNX (tests/onnx_models/export_detection.py,
weights filled from a seed): Faster R-CNN's parts, the second MultiScaleRoIAlign on the
detections and the masks pasted into the image on edgecv's fixed-size nodes
(edgecv/frontend/onnx/torchvision_masks.py), against ONNX Runtime's CPU forward of the
same file: the detections compared as the Faster R-CNN test compares them
(test_onnx_detectors.assert_detections_match), each kept row's mask within the
tolerance table, the padding rows' masks all 0.

`tiny_mask_rcnn` is torchvision's MaskRCNN class on the Faster R-CNN test's model (two
levels, 300 proposals, up to 100 detections) with a 14x14 mask pooling, a one-layer
mask head and 28x28 masks, at 128x128: a few dozen detections on the image below, of
both levels' sizes, some touching the image's border. `maskrcnn_resnet50_fpn` and
`maskrcnn_resnet50_fpn_v2` at 320x320, and the small model for `deeplens` (every launch
on Intel's OpenCL), are `heavy` (minutes each).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from test_onnx_detectors import FOLDER, _depth, _image, assert_detections_match
from test_opencl import device_or_skip

import edgecv
from edgecv.board.errors import ConversionError
from edgecv.deploy import deploy
from edgecv.frontend.onnx.importer import from_onnx
from edgecv.frontend.onnx.torchvision_detection import replace_postprocessing
from edgecv.pipelines import BuildOptions
from edgecv.testing import assert_close

sys.path.insert(0, str(Path(__file__).resolve().parent / "onnx_models"))
import seeded  # noqa: E402

NAME, SIZE, DETECTIONS = "tiny_mask_rcnn", 128, 100


@pytest.fixture(scope="module")
def filled(tmp_path_factory) -> Path:
    """The committed graph with its weights filled from seed 0."""
    return seeded.filled(FOLDER / f"{NAME}.onnx", tmp_path_factory.mktemp("masks"))


def _onnxruntime(path: Path, x: np.ndarray) -> list[np.ndarray]:
    """ONNX Runtime's outputs, its warnings off (the paste Loop's growing output is one
    warning per detection)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})


def assert_masks_match(path: Path, size: int, package: Path, on: str | None = None) -> dict:
    """edgecv's boxes, labels, scores and masks (the package run on the OpenCL device
    ``on``, if given) against ONNX Runtime's on the image of ``size``; the comparison's
    numbers."""
    x = _image(size)
    ref = _onnxruntime(path, x)
    ours = (edgecv.load(package, on=on) if on else edgecv.load(package)).run(x)
    count = len(ref[2])
    assert [o.shape for o in ours] == [(DETECTIONS, 4), (DETECTIONS,), (DETECTIONS,),
                                       (DETECTIONS, 1, size, size)]  # fmt: skip
    # Mask R-CNN's outputs are boxes, labels, scores, masks: compared as boxes, scores, labels
    found = assert_detections_match(*([r[i] for i in (0, 2, 1)] for r in (ours, ref)), path, size)
    masks = ours[3][found["order"]]
    assert_close(masks, ref[3][found["ref_order"]], "masks", loosen=_depth(path))
    assert not ours[3][count:].any(), "a padding row's mask is not 0"
    found["masks"] = float(np.abs(masks - ref[3][found["ref_order"]]).max())
    found["mask pixels"] = int((ref[3] > 0).sum())
    return found


def test_tiny_mask_rcnn_matches_onnxruntime(filled, tmp_path):
    # the post-processing is what this test reads: the model in NCHW, no layouts timed
    package = deploy(filled, tmp_path / f"{NAME}-cpu", "cpu", options=BuildOptions(layout="NCHW"))
    names = [o.name for o in onnx.load(str(filled), load_external_data=False).graph.output]
    assert names == ["boxes", "labels", "scores", "masks"]
    found = assert_masks_match(filled, SIZE, package)
    assert 10 <= found["count"] < DETECTIONS, found
    boxes = _onnxruntime(filled, _image(SIZE))[0]
    # boxes pasted over the image's border (their expanded box crosses it) and inside it
    assert (boxes.min(1) < 2).any() and (boxes.max(1) > SIZE - 2).any() and found["mask pixels"]


def _attributes(node) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def test_the_heads_are_replaced_by_fixed_size_nodes(filled):
    """Faster R-CNN's three nodes, then the detections' pooling (14x14, both levels) and
    the paste into the 128x128 image reading the detections' scores; nothing with a
    data-dependent shape is left."""
    replaced = replace_postprocessing(onnx.load(str(filled)), NAME)
    ours = [n for n in replaced.graph.node if n.domain == "edgecv.torchvision"]
    assert [n.op_type for n in ours] == [
        "FilteredNMS", "LevelRoiAlign", "FilteredNMS", "LevelRoiAlign", "PasteMasks"
    ]  # fmt: skip
    pool, paste = _attributes(ours[3]), _attributes(ours[4])
    assert pool["spatial_scales"] == [0.25, 0.125] and pool["sampling_ratio"] == 2
    assert (pool["output_height"], pool["output_width"]) == (14, 14)
    assert (paste["height"], paste["width"]) == (SIZE, SIZE)
    assert ours[4].input[2] == ours[2].output[1]  # the padding told by the detections' scores
    left = {n.op_type for n in replaced.graph.node}
    assert not left & {"NonZero", "If", "NonMaxSuppression", "ScatterElements", "Loop"}, left


def test_another_paste_is_one_error_line(filled):
    """A Loop after the detections' pooling that is not torchvision's paste (here: one
    that resizes nothing) fits no form: one line saying why for each."""
    model = onnx.load(str(filled))
    (loop,) = [n for n in model.graph.node if n.op_type == "Loop"]
    body = loop.attribute[0].g
    (resize,) = [n for n in body.node if n.op_type == "Resize"]
    resize.op_type = "Identity"
    del resize.input[1:]
    del resize.attribute[:]
    with pytest.raises(ConversionError) as caught:
        replace_postprocessing(model, NAME)
    message = str(caught.value)
    assert "\n" not in message
    assert "as Faster R-CNN: the Loop after the detections' pooling resizes nothing" in message


def test_a_loop_elsewhere_is_one_error_line():
    """A Loop outside torchvision's Mask R-CNN passes the operator check (edgecv replaces
    the paste) and is then refused in one line naming it."""
    helper = onnx.helper
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"]),
         helper.make_node("Add", ["acc", "x"], ["acc_out"])],
        "body",
        [helper.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc", onnx.TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("cond_out", onnx.TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", onnx.TensorProto.FLOAT, [2])],
    )  # fmt: skip
    trips = onnx.numpy_helper.from_array(np.array(3, np.int64), "trips")
    keep = onnx.numpy_helper.from_array(np.array(True), "keep")
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "keep", "x"], ["y"], body=body)],
        "loop",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
        [trips, keep],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ConversionError, match=r"^loop.onnx: Loop has no converter; edgecv "
                       r"replaces it only in torchvision's Mask R-CNN") as caught:  # fmt: skip
        from_onnx(model, source="loop.onnx")
    assert "\n" not in str(caught.value)


@pytest.mark.heavy  # every kernel built for OpenCL and compiled by Intel's runtime: 1-2 minutes
def test_tiny_mask_rcnn_runs_every_launch_on_intel_opencl(filled, tmp_path):
    """`deeplens`: the poolings, the paste and the rest all on the GPU (no CPU fallback),
    run on Intel's OpenCL CPU runtime (the DeepLens stand-in), matching ONNX Runtime."""
    import json

    on = device_or_skip("intel")
    options = BuildOptions(layout="NCHW")
    package = deploy(filled, tmp_path / f"{NAME}-deeplens", "deeplens", options=options)
    placement = json.loads((package / "manifest.json").read_text())["build"]["placement"]
    assert placement["launches"].get("cpu", 0) == 0, placement
    assert_masks_match(filled, SIZE, package, on)


@pytest.mark.heavy  # a whole ResNet-50 FPN Mask R-CNN deployed: minutes (docs/testing.md)
@pytest.mark.parametrize("name", ["maskrcnn_resnet50_fpn", "maskrcnn_resnet50_fpn_v2"])
def test_maskrcnn_resnet50_fpn_matches_onnxruntime(name, tmp_path):
    path = seeded.filled(FOLDER / f"{name}.onnx", tmp_path)
    package = deploy(path, tmp_path / "maskrcnn-cpu", "cpu")
    found = assert_masks_match(path, 320, package)
    assert 0 < found["count"] < DETECTIONS, found
