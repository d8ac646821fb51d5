"""torchvision's RetinaNet and FCOS exported to ONNX (tests/onnx_models/export_detection.py,
weights filled from a seed), their candidates per feature level and batched NMS on
edgecv's tagged kernels with fixed-size outputs (edgecv/frontend/onnx/torchvision_levels.py),
against ONNX Runtime's CPU forward of the same file, compared as the SSD tests compare
(test_onnx_detectors.assert_detections_match): the kept rows in the same count, labels
and order exact, boxes and scores within the tolerance table, the padding after them.

`tiny_retinanet` and `tiny_fcos` are torchvision's RetinaNet and FCOS classes (heads,
anchors, post-processing) on a three-convolution backbone at 128x128, five classes;
their thresholds pass a few hundred candidates on the image below, so the first level's
top-k cuts (RetinaNet: 590 above the threshold, 400 kept) and RetinaNet's 300-row cap is
reached while FCOS keeps 109 of its 200. RetinaNet-ResNet50-FPN and FCOS-ResNet50-FPN at
320 are `heavy` (whole detectors: minutes each).
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
from edgecv.frontend.onnx.torchvision_detection import replace_postprocessing
from edgecv.pipelines import BuildOptions

sys.path.insert(0, str(Path(__file__).resolve().parent / "onnx_models"))
import seeded  # noqa: E402

SIZES = {"tiny_retinanet": 128, "tiny_fcos": 128}
SIZES |= {"retinanet_resnet50_fpn": 320, "fcos_resnet50_fpn": 320}


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """The committed graph ``name`` with its weights filled from seed 0, once each."""
    folder, done = tmp_path_factory.mktemp("filled"), {}

    def fill(name: str) -> Path:
        if name not in done:
            done[name] = seeded.filled(FOLDER / f"{name}.onnx", folder)
        return done[name]

    return fill


def deploy_and_compare(path: Path, tmp_path: Path) -> dict:
    name = path.stem
    size = SIZES[name]
    # the post-processing is what these tests read: the model in NCHW, no layouts timed
    package = deploy(path, tmp_path / f"{name}-cpu", "cpu", options=BuildOptions(layout="NCHW"))
    x = _image(size)
    ref = _onnxruntime(path, x)
    assert len(ref[1]) > 0, "no detections: the comparison would check the padding alone"
    ours = edgecv.load(package).run(x)
    assert str(ours[2].dtype) == "int64" and ours[1].shape == ours[2].shape
    return assert_detections_match(ours, ref, path, size)


def test_tiny_retinanet_matches_onnxruntime(filled, tmp_path):
    found = deploy_and_compare(filled("tiny_retinanet"), tmp_path)
    assert found["count"] == 300  # the cap: the top-k cut and the slice both matter


@pytest.mark.heavy  # FCOS's form is RetinaNet's; a deploy each: minutes (docs/testing.md)
@pytest.mark.parametrize("name", ["tiny_fcos", "retinanet_resnet50_fpn", "fcos_resnet50_fpn"])
def test_a_level_detector_matches_onnxruntime(name, filled, tmp_path):
    deploy_and_compare(filled(name), tmp_path)


@pytest.mark.parametrize("name", ["tiny_retinanet", "tiny_fcos"])
def test_the_levels_are_replaced_by_fixed_size_nodes(name, filled):
    """Each level's choice becomes one LevelCandidates node with its top-k count, the
    batched NMS one BatchedNMS with the graph's thresholds and cap; nothing with a
    data-dependent shape is left."""
    replaced = replace_postprocessing(onnx.load(str(filled(name))), name)
    ours = [n for n in replaced.graph.node if n.domain == "edgecv.torchvision"]
    assert [n.op_type for n in ours] == ["LevelCandidates"] * 2 + ["BatchedNMS"]
    attrs = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in ours]
    retina = name == "tiny_retinanet"
    # level sizes: 32x32 and 16x16 positions x anchors (3 for RetinaNet, 1 for FCOS) x 5
    sizes = [32 * 32 * (3 if retina else 1) * 5, 16 * 16 * (3 if retina else 1) * 5]
    assert [a["candidates"] for a in attrs[:2]] == [min(400, m) for m in sizes]
    assert attrs[2]["score_threshold"] == pytest.approx(0.0135 if retina else 0.1)
    assert attrs[2]["detections"] == (300 if retina else 200)
    assert attrs[2]["iou_threshold"] == pytest.approx(0.5 if retina else 0.6)
    left = {n.op_type for n in replaced.graph.node}
    assert not left & {"NonZero", "If", "TopK", "NonMaxSuppression", "GatherND"}, left


def test_a_level_whose_indices_are_read_elsewhere_is_one_error_line(filled):
    """A TopK whose indices feed something besides the flat-index Gather is neither
    form: refused in one line naming why for each."""
    model = onnx.load(str(filled("tiny_retinanet")))
    topk = next(n for n in model.graph.node if n.op_type == "TopK")
    message = refused_with_a_reader(model, topk.output[1])
    assert "as SSD:" in message and "TopK's indices are not read by one Gather" in message


def test_level_candidates_are_topk_of_the_thresholded_in_order():
    """LevelCandidates alone, built for the CPU, against NumPy: the best k of all the
    scores, ties in input order (as ONNX's TopK), so the candidates above the threshold
    among them are the best of those above it, in the same order."""
    import tvm
    from tvm import relax

    from edgecv.frontend.onnx.torchvision_levels import LevelCandidates

    rng = np.random.RandomState(0)
    scores = np.round(rng.rand(5000), 2).astype(np.float32)  # many ties
    threshold, k = 0.9, 400
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((5000,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(LevelCandidates(bb, [x], {"candidates": k}, 17))
        bb.emit_func_output(out)
    executable = tvm.compile(bb.get(), target="llvm")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    values, index = (v.numpy() for v in vm["main"](tvm.runtime.tensor(scores)))
    best = np.argsort(-scores, kind="stable")[:k]
    np.testing.assert_array_equal(index, best)
    np.testing.assert_array_equal(values, scores[best])
    above = np.nonzero(scores > threshold)[0]
    expected = above[np.argsort(-scores[above], kind="stable")][:k]
    np.testing.assert_array_equal(index[values > threshold], expected)
