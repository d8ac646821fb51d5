"""A model quantized by ONNX Runtime (``quantize_static``, QDQ format) deploys on edgecv's
INT8 path with the file's own scales (edgecv/frontend/onnx/qdq.py,
edgecv/pipelines/int8_given.py), against ONNX Runtime running the same QDQ file.

The model is the small classifier of tests/onnx_graphs.py, quantized at test time with
symmetric int8 activations, per-channel int8 weights and 7-bit range
(``reduce_range``: without it ONNX Runtime's own u8 x s8 kernels saturate on an AVX2
CPU and its integer path is 15-18% of the output's scale off the file's
QuantizeLinear/DequantizeLinear arithmetic, measured here)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from helpers import assert_one_error_line, cli_here
from onnx import helper
from onnx_graphs import classifier, save

import edgecv
from edgecv.deploy import deploy
from edgecv.frontend.onnx.qdq import strip_qdq
from edgecv.pipelines import BuildOptions
from edgecv.testing import assert_close_int8_against_qdq

ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")

# the weighted layers on the classifier's longest path (tests/test_onnx_deploy.py)
CLASSIFIER_LAYERS = 7
QUICK = BuildOptions(check_on=None, layout="NCHW", tuning=None)


class _Inputs(quantization.CalibrationDataReader):
    def __init__(self, arrays: np.ndarray):
        self._it = iter({"x": x} for x in arrays)

    def get_next(self):
        return next(self._it, None)


def _inputs(seed: int, count: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(count, 1, 3, 32, 32)).astype(np.float32)


def _quantized(folder, activation: str = "QInt8", symmetric: bool = True):
    float_path = save(classifier(batch=1), folder / "cls.onnx")
    path = folder / f"cls_qdq_{activation}.onnx"
    quantization.quantize_static(
        str(float_path),
        str(path),
        _Inputs(_inputs(0, 8)),
        quant_format=quantization.QuantFormat.QDQ,
        activation_type=getattr(quantization.QuantType, activation),
        weight_type=quantization.QuantType.QInt8,
        per_channel=True,
        reduce_range=True,
        op_types_to_quantize=["Conv", "Gemm", "MatMul"],
        extra_options={"ActivationSymmetric": symmetric},
    )
    return path


@pytest.fixture(scope="module")
def qdq_package(tmp_path_factory):
    folder = tmp_path_factory.mktemp("onnx_qdq")
    path = _quantized(folder)
    return path, deploy(path, folder / "qdq-cpu", "cpu", options=QUICK)


def test_the_qdq_model_runs_its_convolutions_on_int8_kernels_with_its_own_scales(qdq_package):
    path, package = qdq_package
    manifest = json.loads((package / "manifest.json").read_text())
    build = manifest["build"]
    assert build["precision"] == "int8"
    quant = build["quantization"]
    assert quant["method"] == "model file"
    assert quant["calibration"]["source"] == "the model file (QDQ)"
    assert quant["quantized"] == {"conv2d": 6, "dense": 2}, quant["quantized"]
    assert "cpu.Conv2DInt8" in json.dumps(build), build["schedules"]
    assert not (package / "calibration.json").exists()
    # each site's input scale is the file's (doubled where AVX2's kernel reads 7 bits)
    _, entries = strip_qdq(onnx.load(str(path)), "cls")
    file_scales = {e["scale"] for e in entries}
    for record in quant["operators"]:
        # the file's 7-bit weights (reduce_range: |q| <= 64) as they are, or 63 where
        # AVX2's dot-product kernel needs it
        on_avx2_dot = record["arithmetic"] == "int32" and record["weight_max"] == 63
        assert record["weight_max"] == 64 or on_avx2_dot, record
        scale = record["input_scale"]
        assert any(np.isclose(scale, s * k, rtol=1e-6) for s in file_scales for k in (1, 2)), (
            record,
            file_scales,
        )


def test_the_qdq_model_matches_onnxruntime_on_the_same_file(qdq_package):
    path, package = qdq_package
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    model = edgecv.load(package)
    agree, errors = 0, []
    inputs = _inputs(7, 8)
    for x in inputs:
        ours, theirs = model.run(x)[0], session.run(None, {"x": x})[0]
        errors.append(assert_close_int8_against_qdq(ours, theirs, CLASSIFIER_LAYERS))
        agree += int(ours.argmax() == theirs.argmax())
    assert agree >= len(inputs) - 1, (agree, errors)  # a near tie may flip one


def test_an_asymmetric_uint8_activation_leaves_its_reader_in_float32(tmp_path):
    """quantize_static's default uint8 activations: a signed tensor gets a zero point
    edgecv's kernels do not read; its reader computes in float32 on the rounded values,
    the file's arithmetic, and the readers of tensors never negative stay int8."""
    path = _quantized(tmp_path, "QUInt8", symmetric=False)
    _, entries = strip_qdq(onnx.load(str(path)), "cls")
    model = onnx.load(str(path))
    zero_points = {
        i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer if "zero" in i.name
    }
    assert any(np.any(z != 0) for z in zero_points.values())  # the case exists
    assert 0 < len(entries) < 8 and all(e["dtype"] == "uint8" for e in entries), entries
    stripped, _ = strip_qdq(model, "cls")
    reference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ours = ort.InferenceSession(stripped.SerializeToString(), options)
    for x in _inputs(3, 2):  # the float graph rounds as the file's pairs do
        np.testing.assert_allclose(
            ours.run(None, {"x": x})[0], reference.run(None, {"x": x})[0], atol=1e-6
        )


def test_a_qoperator_model_is_one_error_line(tmp_path, capfd):
    """QLinearConv (the other format) is refused before anything is compiled (the command
    run in this process)."""
    x = helper.make_tensor_value_info("x", onnx.TensorProto.UINT8, [1, 1, 4, 4])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.UINT8, [1, 1, 4, 4])
    scalars = [
        helper.make_tensor(n, t, [], [v])
        for n, t, v in [
            ("s", onnx.TensorProto.FLOAT, 0.1),
            ("z", onnx.TensorProto.UINT8, 0),
            ("wz", onnx.TensorProto.INT8, 0),
        ]
    ]
    weight = helper.make_tensor("w", onnx.TensorProto.INT8, [1, 1, 1, 1], [3])
    node = helper.make_node("QLinearConv", ["x", "s", "z", "w", "s", "wz", "s", "z"], ["y"])
    graph = helper.make_graph([node], "q", [x], [y], [*scalars, weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, tmp_path / "qop.onnx")
    out = tmp_path / "out"
    result = cli_here(capfd, "deploy", tmp_path / "qop.onnx", "--device", "cpu", "-o", out)
    assert_one_error_line(result, "QuantFormat.QDQ")
