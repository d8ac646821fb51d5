"""torchvision's Keypoint R-CNN exported to ONNX (tests/onnx_models/export_detection.py,
weights filled from a seed): Faster R-CNN's parts, the second MultiScaleRoIAlign on the
detections and the heatmaps-to-keypoints loop on edgecv's fixed-size nodes
(edgecv/frontend/onnx/torchvision_keypoints.py), against ONNX Runtime's CPU forward of
the same file: the detections compared as the Faster R-CNN test compares them, each kept
row's 17 keypoints (x, y, visibility) and scores within the tolerance table, the
padding rows' all 0.

`tiny_keypoint_rcnn` is torchvision's KeypointRCNN class on the Faster R-CNN test's
model with a 14x14 keypoint pooling, a one-layer keypoint head and 56x56 heatmaps, at
128x128: a few dozen detections on the image below. `keypointrcnn_resnet50_fpn` at
320x320 (torchvision's thresholds: two classes, so the cap of 100 is reached) is `heavy`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
import pytest
from test_onnx_detectors import FOLDER, _depth, _image, assert_detections_match
from test_onnx_masks import _attributes, _onnxruntime

import edgecv
from edgecv.deploy import deploy
from edgecv.frontend.onnx.torchvision_detection import replace_postprocessing
from edgecv.pipelines import BuildOptions
from edgecv.testing import assert_close

sys.path.insert(0, str(Path(__file__).resolve().parent / "onnx_models"))
import seeded  # noqa: E402

NAME, SIZE, DETECTIONS, JOINTS = "tiny_keypoint_rcnn", 128, 100, 17


@pytest.fixture(scope="module")
def filled(tmp_path_factory) -> Path:
    """The committed graph with its weights filled from seed 0."""
    return seeded.filled(FOLDER / f"{NAME}.onnx", tmp_path_factory.mktemp("keypoints"))


def assert_keypoints_match(path: Path, size: int, package: Path) -> dict:
    """edgecv's boxes, labels, scores, keypoints and their scores against ONNX Runtime's
    on the image of ``size``; the comparison's numbers."""
    names = [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]
    assert names == ["boxes", "labels", "scores", "keypoints", "keypoints_scores"]
    x = _image(size)
    ref, ours = _onnxruntime(path, x), edgecv.load(package).run(x)
    assert [o.shape for o in ours] == [(DETECTIONS, 4), (DETECTIONS,), (DETECTIONS,),
                                       (DETECTIONS, JOINTS, 3), (DETECTIONS, JOINTS)]  # fmt: skip
    found = assert_detections_match(*([r[i] for i in (0, 2, 1)] for r in (ours, ref)), path, size)
    count, order, ref_order = found["count"], found["order"], found["ref_order"]
    loosen = _depth(path)
    points, ref_points = ours[3][order], ref[3][ref_order]
    assert_close(points, ref_points, "keypoints", loosen=loosen, scale=size)
    assert_close(ours[4][order], ref[4][ref_order], "keypoint scores", loosen=loosen)
    assert (points[..., 2] == 1).all()
    assert not ours[3][count:].any() and not ours[4][count:].any(), "padding rows are not 0"
    return found


def test_tiny_keypoint_rcnn_matches_onnxruntime(filled, tmp_path):
    package = deploy(filled, tmp_path / f"{NAME}-cpu", "cpu", options=BuildOptions(layout="NCHW"))
    found = assert_keypoints_match(filled, SIZE, package)
    assert 10 <= found["count"] < DETECTIONS, found


@pytest.mark.heavy  # a whole ResNet-50 FPN Keypoint R-CNN deployed: minutes (docs/testing.md)
def test_keypointrcnn_resnet50_fpn_matches_onnxruntime(tmp_path):
    path = seeded.filled(FOLDER / "keypointrcnn_resnet50_fpn.onnx", tmp_path)
    package = deploy(path, tmp_path / "keypointrcnn-cpu", "cpu")
    assert assert_keypoints_match(path, 320, package)["count"] > 0


def test_the_keypoint_loop_is_replaced_by_a_fixed_size_node(filled):
    """Faster R-CNN's three nodes, then the detections' pooling and one
    HeatmapKeypoints reading the detections' boxes and scores, its argmax grid the
    128x128 image; nothing with a data-dependent shape is left."""
    replaced = replace_postprocessing(onnx.load(str(filled)), NAME)
    ours = [n for n in replaced.graph.node if n.domain == "edgecv.torchvision"]
    assert [n.op_type for n in ours] == [
        "FilteredNMS", "LevelRoiAlign", "FilteredNMS", "LevelRoiAlign", "HeatmapKeypoints"
    ]  # fmt: skip
    pool, points = _attributes(ours[3]), _attributes(ours[4])
    assert (pool["output_height"], pool["output_width"]) == (14, 14)
    assert (points["height"], points["width"]) == (SIZE, SIZE)
    assert list(ours[4].input[1:]) == list(ours[2].output[:2])
    left = {n.op_type for n in replaced.graph.node}
    assert not left & {"NonZero", "If", "NonMaxSuppression", "ScatterElements", "Loop"}, left
