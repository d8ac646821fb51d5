"""ONNX files through the whole pipeline for `cpu`, against ONNX Runtime's CPU forward of
the same file (edgecv.testing.compare_with_onnxruntime): a small classifier with every
operator kind torchvision exports (weights in an external data file, a symbolic batch
given by --input-shape), a custom-domain operator registered with edgecv.register_op
(against its NumPy reference), `bench --vs` feeding the same file to ONNX Runtime and
OpenVINO, the classifier in INT8 (`cpu`) and float16 (`deeplens`; in float32 there
`heavy`), and the committed torchvision exports (tests/onnx_models/, weights filled from a
seed: MobileNetV3-Small here, MobileNetV3-Large, ResNet-50 and the rest `heavy`)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import cli_here
from onnx import numpy_helper
from onnx_graphs import classifier, custom_domain, save
from test_opencl import device_or_skip
from tvm import te

import edgecv
from edgecv.deploy import deploy
from edgecv.op_registry import register_op, unregister_op
from edgecv.pipelines import BuildOptions
from edgecv.testing import (
    assert_close,
    assert_close_fp16,
    assert_close_int8,
    compare_with_onnxruntime,
)

sys.path.insert(0, str(Path(__file__).resolve().parent / "onnx_models"))
import seeded  # noqa: E402

# the committed exports the default suite deploys; the others are heavy (deploys of
# 1-3 minutes each on 2 cores). MobileNetV3-Small has Large's operators (depthwise,
# squeeze-and-excitation, hardswish, hardsigmoid) in fewer kernels.
DEFAULT_EXPORTS = {"mobilenet_v3_small"}
EXPORTS = sorted(p.stem for p in seeded.FOLDER.glob("*.onnx"))
SHAPES = {"resnet50": {"input": (1, 3, 224, 224)}}  # exported with a symbolic batch


@pytest.fixture(scope="module")
def small_package(tmp_path_factory):
    """The classifier with a symbolic batch and external data, deployed for `cpu`."""
    folder = tmp_path_factory.mktemp("onnx_classifier")
    path = save(classifier(batch="N"), folder / "cls.onnx", external=True)
    package = deploy(path, folder / "cls-cpu", "cpu", input_shape={"x": (1, 3, 32, 32)})
    return path, package


def test_the_classifier_matches_onnxruntime(small_package):
    path, package = small_package
    compared = compare_with_onnxruntime(package, path)
    assert compared["max_error"] < 1e-5 and compared["scale"] > 0.1, compared
    manifest = json.loads((package / "manifest.json").read_text())
    assert manifest["model"]["source"] == {
        "kind": "onnx",
        "path": str(path.resolve()),
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "input_shapes": {"x": [1, 3, 32, 32]},
    }
    assert manifest["inputs"] == [{"name": "x", "shape": [1, 3, 32, 32], "dtype": "float32"}]
    assert [o["name"] for o in manifest["outputs"]] == ["probs"]
    # the packed layouts the graph tuner chose hold for an ONNX graph too
    assert manifest["build"]["layouts"]["chosen"] == "plan", manifest["build"]["layouts"]


def test_outputs_computed_elsewhere_are_compared_without_loading(small_package, tmp_path):
    """A board's outputs (a package this machine cannot load) compare against ONNX
    Runtime with the same tolerances; changed outputs fail, and outputs without the
    inputs they came from are refused."""
    path, package = small_package
    x = np.random.RandomState(3).standard_normal((1, 3, 32, 32)).astype(np.float32)
    outputs = edgecv.load(package).run(x)
    # the package's manifest is read, its kernels are not loaded: a copy without them
    manifest_only = tmp_path / "manifest-only"
    manifest_only.mkdir()
    shutil.copy(package / "manifest.json", manifest_only / "manifest.json")
    found = compare_with_onnxruntime(manifest_only, path, [x], outputs=outputs)
    assert found["max_error"] < 1e-5 and found["scale"] > 0.1, found
    with pytest.raises(AssertionError):
        compare_with_onnxruntime(manifest_only, path, [x], outputs=[o + 0.1 for o in outputs])
    with pytest.raises(ValueError, match="need their inputs"):
        compare_with_onnxruntime(manifest_only, path, outputs=outputs)


def test_bench_feeds_the_source_file_to_the_baselines(small_package, tmp_path, capfd):
    """`bench --vs` in this process (the command's own process: tests/test_bench.py)."""
    path, package = small_package
    out = tmp_path / "bench.json"
    baselines = "mxnet,onnxruntime,openvino"
    ran = cli_here(capfd, "bench", package, "--repeat", "5", "--vs", baselines, "--json", out)
    assert ran.returncode == 0, ran.stderr
    report = json.loads(out.read_text())
    assert "does not read" in report["not_run"]["mxnet"]
    for name in ("onnxruntime", "openvino"):
        if importlib.util.find_spec(name):
            agreement = report["runtimes"][name]["agreement"]
            assert agreement["max_rel_diff"] < 1e-5 and agreement["same_top1"], agreement


# an Intel OpenCL compile of its own; the ONNX importer's forms placed and scheduled on the
# GPU, every launch there: test_the_classifier_deploys_in_fp16_for_intel_graphics
@pytest.mark.heavy
def test_the_classifier_runs_every_launch_on_intel_opencl(tmp_path):
    """`deeplens` (Intel Graphics; Intel's CPU OpenCL runtime stands in): the ONNX
    importer's forms place and schedule on the GPU as the MXNet importer's do."""
    on = device_or_skip("intel")
    path = save(classifier(batch=1), tmp_path / "cls.onnx")
    package = deploy(path, tmp_path / "cls-deeplens", "deeplens")
    manifest = json.loads((package / "manifest.json").read_text())
    assert manifest["build"]["placement"]["launches"].get("cpu", 0) == 0, manifest["build"]
    compare_with_onnxruntime(edgecv.load(package, on=on), path)


def test_a_registered_custom_domain_op_deploys(tmp_path):
    def compute(inputs, attrs):
        x, w = inputs
        alpha = attrs["alpha"]
        return te.compute(
            x.shape, lambda i, j: x[i, j] / (1 + te.abs(x[i, j])) * alpha + w[0, j], name="sss"
        )

    register_op("ScaledSoftsign", compute, shape=lambda shapes, attrs: shapes[0])
    try:
        model = custom_domain()
        path = save(model, tmp_path / "custom.onnx")
        options = BuildOptions(check_on=None, tuning=None, layout="NCHW")
        package = deploy(path, tmp_path / "custom-cpu", "cpu", options=options)
    finally:
        unregister_op("ScaledSoftsign")
    w0, w1 = (numpy_helper.to_array(t) for t in model.graph.initializer)
    x = np.random.RandomState(0).standard_normal((2, 8)).astype(np.float32)
    relu = np.maximum(x, 0)
    expected = relu / (1 + np.abs(relu)) * 0.5 + w0 + w1
    (actual,) = edgecv.load(package).run(x)
    assert_close(actual, expected)


@pytest.mark.parametrize(
    "name",
    [n if n in DEFAULT_EXPORTS else pytest.param(n, marks=pytest.mark.heavy) for n in EXPORTS],
)
def test_a_torchvision_export_matches_onnxruntime(name, tmp_path):
    path = seeded.filled(seeded.FOLDER / f"{name}.onnx", tmp_path)
    graph = onnx.load(str(path), load_external_data=False).graph
    assert not any(t.doc_string for t in graph.initializer)  # every weight filled
    # the operators' numbers are what this reads: packed without timing candidates (the
    # graph tuner on an ONNX graph: test_the_classifier_matches_onnxruntime)
    options = BuildOptions(layout="packed")
    package = deploy(
        path, tmp_path / f"{name}-cpu", "cpu", input_shape=SHAPES.get(name), options=options
    )
    compared = compare_with_onnxruntime(package, path)  # the table's, loosened for depth
    assert compared["scale"] > 0.5, compared  # logits of order 1: the comparison means something


# the weighted layers on the small classifier's longest path (3x3 conv, depthwise, the
# squeeze-and-excitation pair, a 1x1, Gemm, MatMul) and its largest reduction (MatMul's 32)
CLASSIFIER_LAYERS, CLASSIFIER_REDUCTION = 7, 32


def _onnxruntime_outputs(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def test_the_classifier_deploys_in_int8_calibrated_on_its_inputs(tmp_path):
    """`--precision int8 --calibrate` applies to an ONNX source unchanged: its
    convolutions run on the INT8 rule, within the INT8 bound of ONNX Runtime's float32."""
    path = save(classifier(batch=1), tmp_path / "cls.onnx")
    calibration = np.random.default_rng(0).normal(size=(16, 1, 3, 32, 32)).astype(np.float32)
    np.save(tmp_path / "calibration.npy", calibration[:, 0])
    # the INT8 rule, not the layouts, is what this reads: NCHW, no graph-tuner timings
    # (the graph tuner on an ONNX graph: test_the_classifier_matches_onnxruntime)
    options = BuildOptions(
        precision="int8",
        calibrate=tmp_path / "calibration.npy",
        calibration_method="minmax",
        layout="NCHW",
    )
    package = deploy(path, tmp_path / "cls-int8", "cpu", options=options)
    manifest = json.loads((package / "manifest.json").read_text())
    assert manifest["build"]["precision"] == "int8"
    assert "cpu.Conv2DInt8" in json.dumps(manifest["build"]), manifest["build"]
    model = edgecv.load(package)
    for x in calibration[:3]:  # inside the calibrated range: nothing clipped
        assert_close_int8(model.run(x)[0], _onnxruntime_outputs(path, x), CLASSIFIER_LAYERS)


def test_the_classifier_deploys_in_fp16_for_intel_graphics(tmp_path):
    """`--precision fp16` for `deeplens` applies to an ONNX source unchanged: the ONNX
    importer's forms place and schedule on the GPU (no CPU launch), within the float16
    bound of ONNX Runtime's float32 on Intel's OpenCL runtime."""
    on = device_or_skip("intel")
    path = save(classifier(batch=1), tmp_path / "cls.onnx")
    package = deploy(path, tmp_path / "cls-fp16", "deeplens", precision="fp16")
    build = json.loads((package / "manifest.json").read_text())["build"]
    assert build["precision"] == "fp16"
    assert build["placement"]["launches"].get("cpu", 0) == 0, build["placement"]
    x = np.random.default_rng(1).normal(size=(1, 3, 32, 32)).astype(np.float32)
    actual = edgecv.load(package, on=on).run(x)[0]
    expected = _onnxruntime_outputs(path, x)
    assert_close_fp16(actual, expected, CLASSIFIER_LAYERS, CLASSIFIER_REDUCTION)
