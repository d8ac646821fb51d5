"""torchvision's Faster R-CNN exported to ONNX (tests/onnx_models/export_detection.py,
weights filled from a seed): its proposals, MultiScaleRoIAlign and detections on
edgecv's tagged kernels with fixed-size outputs (edgecv/frontend/onnx/torchvision_rcnn.py),
against ONNX Runtime's CPU forward of the same file, compared as the SSD tests compare
(test_onnx_detectors.assert_detections_match): the kept rows in the same count, labels
and order exact, boxes and scores within the tolerance table, the padding after them.

`tiny_faster_rcnn` is torchvision's FasterRCNN class (RPN, MultiScaleRoIAlign over two
levels, a two-layer box head, post-processing) on the three-convolution backbone of the
RetinaNet and FCOS tests, at 128x128, five classes: on the image below its RPN keeps
fewer proposals than its 300 rows (the padding rows go through the box head), they pool
from both levels, and a few dozen detections pass the threshold, fewer than the cap.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from test_onnx_detectors import (
    FOLDER,
    _image,
    _onnxruntime,
    assert_detections_match,
    refused_with_a_reader,
)

import edgecv
from edgecv.deploy import deploy
from edgecv.frontend.onnx.detection_graph import BatchedNMSNodes, Graph, nms_branch
from edgecv.frontend.onnx.fold import fold
from edgecv.frontend.onnx.torchvision_detection import replace_postprocessing
from edgecv.pipelines import BuildOptions

sys.path.insert(0, str(Path(__file__).resolve().parent / "onnx_models"))
import seeded  # noqa: E402

NAME, SIZE = "tiny_faster_rcnn", 128
PROPOSALS, DETECTIONS = 300, 100  # the export's rpn_post_nms_top_n_test, the default cap


@pytest.fixture(scope="module")
def filled(tmp_path_factory) -> Path:
    """The committed graph with its weights filled from seed 0."""
    return seeded.filled(FOLDER / f"{NAME}.onnx", tmp_path_factory.mktemp("rcnn"))


def _proposals(path: Path, x: np.ndarray) -> np.ndarray:
    """ONNX Runtime's proposals (the RPN's kept boxes) for ``x``: the graph with them
    added to its outputs."""
    model = onnx.load(str(path))
    folded = fold(model)  # the RPN's slice read from constants
    first = next(n for n in folded.graph.node if n.op_type == "If" and nms_branch(n))
    boxes = BatchedNMSNodes.of(Graph.of(folded.graph), first, ("boxes",)).outputs["boxes"]
    model.graph.output.append(onnx.helper.make_empty_tensor_value_info(boxes))
    changed = path.with_name("proposals.onnx")
    onnx.save(model, str(changed))
    return _onnxruntime(changed, x)[-1]


def test_tiny_faster_rcnn_matches_onnxruntime(filled, tmp_path):
    x = _image(SIZE)
    proposals = _proposals(filled, x)
    # padding rows in the RPN's output, and proposals pooled from each level
    # (MultiScaleRoIAlign: floor(4 + log2(sqrt(area) / 64)) clamped to 2..3)
    assert 0 < len(proposals) < PROPOSALS, len(proposals)
    side = np.sqrt((proposals[:, 2] - proposals[:, 0]) * (proposals[:, 3] - proposals[:, 1]))
    levels = np.clip(np.floor(4 + np.log2(side / 64) + 1e-6), 2, 3)
    assert set(levels) == {2, 3}, np.bincount(levels.astype(int))
    # the post-processing is what this test reads: the model in NCHW, no layouts timed
    package = deploy(filled, tmp_path / f"{NAME}-cpu", "cpu", options=BuildOptions(layout="NCHW"))
    # Faster R-CNN's outputs are boxes, labels, scores: compared as boxes, scores, labels
    names = [o.name for o in onnx.load(str(filled), load_external_data=False).graph.output]
    assert names == ["boxes", "labels", "scores"]
    ref, ours = _onnxruntime(filled, x), edgecv.load(package).run(x)
    ref, ours = ([r[i] for i in (0, 2, 1)] for r in (ref, ours))
    assert [o.shape for o in ours] == [(DETECTIONS, 4), (DETECTIONS,), (DETECTIONS,)]
    assert str(ours[2].dtype) == "int64"
    found = assert_detections_match(ours, ref, filled, SIZE)
    assert 10 <= found["count"] < DETECTIONS, found


def test_the_stages_are_replaced_by_fixed_size_nodes(filled):
    """The proposals' filters and NMS become one FilteredNMS, MultiScaleRoIAlign one
    LevelRoiAlign, the detections' filters and NMS another FilteredNMS, with the graph's
    thresholds and caps; nothing with a data-dependent shape is left."""
    replaced = replace_postprocessing(onnx.load(str(filled)), NAME)
    ours = [n for n in replaced.graph.node if n.domain == "edgecv.torchvision"]
    assert [n.op_type for n in ours] == ["FilteredNMS", "LevelRoiAlign", "FilteredNMS"]
    rpn, pool, boxes = ({a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
                        for n in ours)  # fmt: skip
    # the RPN: 150 candidates per level, 300 rows; small boxes and the score threshold
    assert rpn["detections"] == PROPOSALS and rpn["iou_threshold"] == pytest.approx(0.7)
    assert len(ours[0].input) == 3 + 2  # boxes, scores, levels and the two conditions
    assert pool["spatial_scales"] == [0.25, 0.125] and pool["sampling_ratio"] == 2
    assert (pool["output_height"], pool["output_width"]) == (7, 7)
    assert boxes["detections"] == DETECTIONS and boxes["iou_threshold"] == pytest.approx(0.5)
    assert len(ours[2].input) == 3 + 2  # boxes, scores, labels; the threshold, small boxes
    left = {n.op_type for n in replaced.graph.node}
    assert not left & {"NonZero", "If", "NonMaxSuppression", "ScatterElements"}, left
    # the RPN's best 200 per level stay TopK nodes, of a constant k (edgecv's row sort)
    constants = {t.name for t in replaced.graph.initializer}
    topks = [n for n in replaced.graph.node if n.op_type == "TopK"]
    assert len(topks) == 2 and all(n.input[1] in constants for n in topks)


def test_a_filter_read_elsewhere_is_one_error_line(filled):
    """A filter's row indices read by something besides the Gathers of rows fit no form:
    refused in one line naming why for each form."""
    model = onnx.load(str(filled))
    nonzero = next(n for n in model.graph.node if n.op_type == "NonZero")
    message = refused_with_a_reader(model, nonzero.output[0])
    assert "as SSD: 2 If nodes" in message and "as Faster R-CNN: " in message
    assert "indices are read by Neg" in message


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> Path:
    """torchvision's fasterrcnn_mobilenet_v3_large_320_fpn (at its own 320x320, the box
    score threshold 0.02: export_detection.MODELS), weights filled from seed 0."""
    name = "fasterrcnn_mobilenet_v3_large_320_fpn.onnx"
    return seeded.filled(FOLDER / name, tmp_path_factory.mktemp("real-rcnn"))


def test_the_seeded_weights_reach_every_layer(real):
    """seeded.filled rescales every weighted layer of a real Faster R-CNN, the RPN's and
    the box head's too, so each layer's output on the test image has a standard deviation
    of order 1: a probe that also ran the detector's own outputs failed on the box
    decoding of zero rows for every layer, which left all at He's scale (the RPN's logits
    in the hundreds, 5 proposals, no detection)."""
    model = onnx.load(str(real))
    weights = {t.name for t in model.graph.initializer}
    layers = [n.output[0] for n in model.graph.node
              if n.op_type in ("Conv", "Gemm") and n.input[1] in weights]  # fmt: skip
    model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in layers)
    probed = real.with_name("layers.onnx")
    onnx.save(model, str(probed))
    outputs = _onnxruntime(probed, _image(320))
    stds = {name: float(np.std(out)) for name, out in zip(layers, outputs[3:], strict=True)}
    assert len(stds) > 60 and all(0.1 < s < 10 for s in stds.values()), stds
    # and the detections a comparison can read: more than a few, fewer than the cap
    assert 10 <= len(outputs[2]) < DETECTIONS, len(outputs[2])


@pytest.mark.heavy  # a whole detector deployed: minutes (docs/testing.md)
def test_the_real_faster_rcnn_matches_onnxruntime(real, tmp_path):
    """fasterrcnn_mobilenet_v3_large_320_fpn deployed for cpu, row by row against ONNX
    Runtime (the tiny Faster R-CNN above is the default suite's check of the same
    replacements)."""
    x = _image(320)
    package = deploy(real, tmp_path / "real-cpu", "cpu")
    ref, ours = _onnxruntime(real, x), edgecv.load(package).run(x)
    ref, ours = ([r[i] for i in (0, 2, 1)] for r in (ref, ours))
    found = assert_detections_match(ours, ref, real, 320)
    assert 10 <= found["count"] < DETECTIONS, found
