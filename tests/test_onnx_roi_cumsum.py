"""ONNX ``RoiAlign`` and ``CumSum`` deployed without other operators (graphs built with
``onnx.helper``, a test's cases side by side in one graph: one deploy) for `cpu` and
`deeplens` (Intel's OpenCL runtime stands in), against ONNX Runtime's CPU forward of the
same file; on deeplens every launch is on the GPU, edgecv's tagged ``roi_align`` and
``scan`` kernels among them. An attribute edgecv's kernels do not compute is refused in
one ``edgecv: error:`` line naming it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import assert_one_error_line, cli_here
from onnx import TensorProto, helper, numpy_helper
from test_onnx_vision_ops import deployed, merged, onnxruntime
from test_opencl import device_or_skip

import edgecv
from edgecv.testing import assert_close


def _model(nodes, inputs, outputs, constants, opset) -> onnx.ModelProto:
    weights = [numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()]
    graph = helper.make_graph(nodes, "roi_cumsum", inputs, outputs, weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _tensor(name, dims, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, dims)


def roi_align_model(data_shape, count, opset=16, **attrs) -> onnx.ModelProto:
    node = helper.make_node("RoiAlign", ["x", "rois", "batch"], ["y"], **attrs)
    out = [count, data_shape[1], attrs.get("output_height", 1), attrs.get("output_width", 1)]
    inputs = [
        _tensor("x", data_shape),
        _tensor("rois", [count, 4]),
        _tensor("batch", [count], TensorProto.INT64),
    ]
    return _model([node], inputs, [_tensor("y", out)], {}, opset)


def cumsum_model(shape, axis, dtype=TensorProto.FLOAT, **attrs) -> onnx.ModelProto:
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], **attrs)
    constants = {"axis": np.array(axis, np.int64)}
    return _model([node], [_tensor("x", shape, dtype)], [_tensor("y", shape, dtype)], constants, 14)


def _gpu_only(loaded, kernel: str) -> None:
    """Every launch on the GPU, ``kernel`` (edgecv's tagged operator) among them."""
    steps = [s for s in loaded.executor.plan.steps if s.kind == "kernel" and not s.elided]
    assert all(s.device == "gpu" for s in steps), [(s.kernel, s.device) for s in steps]
    assert any(s.kernel.startswith(kernel) for s in steps), [s.kernel for s in steps]


def _rois(rng, count, height, width, scale):
    """Corners in image coordinates: inside, across the border, beyond it, and tiny."""
    x1 = rng.uniform(-3, width / scale, count)
    y1 = rng.uniform(-3, height / scale, count)
    w = rng.uniform(0.2, width / scale, count)
    h = rng.uniform(0.2, height / scale, count)
    return np.stack([x1, y1, x1 + w, y1 + h], 1).astype(np.float32)


HALF = dict(coordinate_transformation_mode="half_pixel")
OUTPUT_HALF = dict(coordinate_transformation_mode="output_half_pixel")
ROI_CASES = [  # opset, data shape, rois, attributes
    (16, (2, 3, 12, 10), 7, dict(output_height=2, output_width=3, spatial_scale=0.5)),
    (
        16,
        (1, 4, 9, 9),
        5,
        dict(HALF, mode="max", output_height=3, output_width=3, sampling_ratio=2),
    ),
    (16, (2, 2, 8, 11), 6, dict(OUTPUT_HALF, output_height=2, spatial_scale=0.25)),
    (16, (1, 3, 10, 8), 4, dict(OUTPUT_HALF, mode="max", output_width=2, spatial_scale=0.5)),
    (10, (2, 3, 7, 9), 5, dict(output_height=4, output_width=2, sampling_ratio=1)),
]
ROI_IDS = ["avg-adaptive", "max-ratio2", "avg-output_half", "max-output_half", "opset10"]


@pytest.mark.parametrize("profile", ["cpu", "deeplens"])
@pytest.mark.parametrize("opset", [16, 10])
def test_roi_align_matches_onnxruntime(tmp_path, profile, opset):
    """The cases of one opset side by side in one graph (one deploy), each run twice."""
    on = device_or_skip("intel") if profile == "deeplens" else None
    rng = np.random.RandomState(0)
    cases = [case for case in ROI_CASES if case[0] == opset]
    model = merged(
        [roi_align_model(shape, count, opset, **attrs) for _, shape, count, attrs in cases]
    )
    package = deployed(model, tmp_path, profile)
    loaded = edgecv.load(package, on=on) if on else edgecv.load(package)
    if on:
        _gpu_only(loaded, "roi_align")
    for _ in range(2):
        feeds = {}
        for i, (_, shape, count, attrs) in enumerate(cases):
            scale = attrs.get("spatial_scale", 1.0)
            feeds[f"x_{i}"] = rng.standard_normal(shape).astype(np.float32)  # max's zeros
            feeds[f"rois_{i}"] = _rois(rng, count, shape[2], shape[3], scale)
            feeds[f"batch_{i}"] = rng.randint(0, shape[0], count).astype(np.int64)
        ours_all = loaded.run(*feeds.values())
        ref_all = onnxruntime(model, feeds)
        for i, (ours, ref) in enumerate(zip(ours_all, ref_all, strict=True)):
            assert ours.shape == ref.shape
            assert_close(ours, ref, f"roi_align case {i}")


CUMSUM_CASES = [  # shape, axis, exclusive, reverse, dtype
    ((3, 300), 1, 0, 0, np.float32),  # rows longer than a work-group
    ((4, 6, 5), 1, 1, 0, np.float32),
    ((2, 7, 33), -1, 0, 1, np.int32),
    ((5, 3, 4), 0, 1, 1, np.float32),
]


@pytest.mark.parametrize("profile", ["cpu", "deeplens"])
def test_cumsum_matches_onnxruntime(tmp_path, profile):
    """Every case side by side in one graph (one deploy)."""
    on = device_or_skip("intel") if profile == "deeplens" else None
    models = [
        cumsum_model(
            shape,
            axis,
            helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
            exclusive=exclusive,
            reverse=reverse,
        )
        for shape, axis, exclusive, reverse, dtype in CUMSUM_CASES
    ]
    model = merged(models)
    package = deployed(model, tmp_path, profile)
    loaded = edgecv.load(package, on=on) if on else edgecv.load(package)
    if on:
        _gpu_only(loaded, "scan")
    rng = np.random.RandomState(1)
    xs = [(rng.standard_normal(case[0]) * 10).astype(case[4]) for case in CUMSUM_CASES]
    ours_all = loaded.run(*xs)
    ref_all = onnxruntime(model, {f"x_{i}": x for i, x in enumerate(xs)})
    for case, ours, ref in zip(CUMSUM_CASES, ours_all, ref_all, strict=True):
        assert ours.dtype == ref.dtype
        if case[4] == np.int32:
            np.testing.assert_array_equal(ours, ref)
        else:  # the GPU's sums are grouped differently from a sequential scan
            np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-4)


def test_an_int64_cumsum_deploys_by_topi_and_matches(tmp_path):
    """edgecv's scan sums float32 and int32; an int64 CumSum (a count or position an
    exporter writes) still deploys for the CPU, as TOPI's sequential cumsum (inclusive
    forward and exclusive reversed, side by side in one graph)."""
    model = merged(
        [
            cumsum_model((2, 9), 1, TensorProto.INT64, exclusive=exclusive, reverse=reverse)
            for exclusive, reverse in [(0, 0), (1, 1)]
        ]
    )
    loaded = edgecv.load(deployed(model, tmp_path, "cpu"))
    rng = np.random.RandomState(2)
    xs = [rng.randint(-1000, 1000, (2, 9)).astype(np.int64) for _ in range(2)]
    ours_all = loaded.run(*xs)
    ref_all = onnxruntime(model, {"x_0": xs[0], "x_1": xs[1]})
    for ours, ref in zip(ours_all, ref_all, strict=True):
        assert ours.dtype == np.int64
        np.testing.assert_array_equal(ours, ref)


CROP = dict(coordinate_transformation_mode="tf_crop_and_resize")
REFUSED = [
    (roi_align_model((1, 2, 6, 6), 2, **CROP), "coordinate_transformation_mode='tf_crop"),
]


@pytest.mark.parametrize("model, fragment", REFUSED, ids=["roi_transform"])
def test_what_the_kernels_do_not_compute_is_refused_in_one_line(tmp_path, capfd, model, fragment):
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    result = cli_here(capfd, "deploy", path, "--device", "cpu", "-o", tmp_path / "out")
    assert_one_error_line(result, fragment)


@pytest.mark.parametrize("opset, shape, count, attrs", ROI_CASES, ids=ROI_IDS)
def test_roi_align_reference_modes_match_onnxruntime(opset, shape, count, attrs):
    """The NumPy reference's ``mode`` and transforms are ONNX Runtime's too (it checks
    the kernels in tests/ops/test_roi_align.py)."""
    from edgecv.ops.roi_align import roi_align_reference

    rng = np.random.RandomState(2)
    model = roi_align_model(shape, count, opset, **attrs)
    x = rng.standard_normal(shape).astype(np.float32)
    rois = _rois(rng, count, shape[2], shape[3], attrs.get("spatial_scale", 1.0))
    batch = rng.randint(0, shape[0], count).astype(np.int64)
    (ref,) = onnxruntime(model, {"x": x, "rois": rois, "batch": batch})
    half = attrs.get("coordinate_transformation_mode", "half_pixel" if opset >= 16 else "")
    ours = roi_align_reference(
        x,
        np.concatenate([batch[:, None].astype(np.float32), rois], 1),
        (attrs.get("output_height", 1), attrs.get("output_width", 1)),
        attrs.get("spatial_scale", 1.0),
        attrs.get("sampling_ratio", 0) or -1,
        aligned=half == "half_pixel",
        mode=attrs.get("mode", "avg"),
    )
    assert_close(ours, ref, "roi_align_reference")
