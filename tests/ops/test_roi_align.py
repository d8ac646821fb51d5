"""ROIAlign: TIR on the CPU and on OpenCL vs the NumPy reference vs MXNet's operator."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import needs_pocl
from hypothesis import given, settings
from hypothesis import strategies as st
from kernels import run_cpu, run_opencl
from matrix import examples
from tvm import te

from edgecv._mxnet import import_mxnet
from edgecv.board.runtime.opencl_devices import opencl_devices
from edgecv.ops.roi_align import roi_align, roi_align_gpu, roi_align_reference
from edgecv.testing import assert_close

mx = import_mxnet()
HAVE_INTEL = any(d.matches("intel(r) opencl") for d in opencl_devices())


def rois_for(rng, count, batch, height, width, scale):
    """ROIs in image coordinates: some inside, some crossing or beyond the border."""
    x1 = rng.uniform(-4, width / scale, count)
    y1 = rng.uniform(-4, height / scale, count)
    w = rng.uniform(0.5, width / scale, count)
    h = rng.uniform(0.5, height / scale, count)
    b = rng.randint(0, batch, count)
    return np.stack([b, x1, y1, x1 + w, y1 + h], 1).astype(np.float32)


def cpu(data, rois, **attrs):
    d = te.placeholder(data.shape, "float32", name="data")
    r = te.placeholder(rois.shape, "float32", name="rois")
    out = roi_align(d, r, **attrs)
    func = te.create_prim_func([d, r, out])
    shape = tuple(int(s) for s in out.shape)
    return run_cpu(func, [data, rois, np.zeros(shape, np.float32)])[2]


def opencl(data, rois, threads=64, device="intel", **attrs):
    func = roi_align_gpu(data.shape, rois.shape, "float32", threads, **attrs)
    ref_shape = roi_align_reference(data[:, :, :1, :1], rois[:0], **attrs).shape[1:]
    shape = (rois.shape[0], *ref_shape)
    return run_opencl(func, [data, rois, np.zeros(shape, np.float32)], device)[2]


def mxnet(data, rois, **attrs):
    return mx.nd.contrib.ROIAlign(mx.nd.array(data), mx.nd.array(rois), **attrs).asnumpy()


CASES = [
    dict(pooled_size=(2, 2), spatial_scale=0.5),
    dict(pooled_size=(3, 2), spatial_scale=0.25, sample_ratio=2, aligned=True),
    dict(pooled_size=(2, 2), spatial_scale=1.0, position_sensitive=True),
    dict(pooled_size=(1, 1), spatial_scale=0.125),
    dict(pooled_size=(7, 7), spatial_scale=0.0625, sample_ratio=2),  # Faster-RCNN's
]


@pytest.mark.parametrize("attrs", CASES)
def test_reference_matches_mxnet(attrs):
    rng = np.random.RandomState(len(str(attrs)))
    data = rng.standard_normal((2, 8 if not attrs.get("position_sensitive") else 12, 9, 11))
    data = data.astype(np.float32)
    rois = rois_for(rng, 9, 2, 9, 11, attrs["spatial_scale"])
    assert_close(roi_align_reference(data, rois, **attrs), mxnet(data, rois, **attrs), "NumPy")


@pytest.mark.parametrize("attrs", CASES)
def test_cpu_matches_reference(attrs):
    rng = np.random.RandomState(3)
    data = rng.standard_normal((2, 12, 9, 11)).astype(np.float32)
    rois = rois_for(rng, 7, 2, 9, 11, attrs["spatial_scale"])
    assert_close(cpu(data, rois, **attrs), roi_align_reference(data, rois, **attrs), "CPU")


@pytest.mark.skipif(not HAVE_INTEL, reason="no Intel OpenCL runtime here")
@pytest.mark.parametrize("attrs", CASES)
def test_opencl_matches_reference_and_mxnet(attrs):
    rng = np.random.RandomState(4)
    data = rng.standard_normal((2, 12, 9, 11)).astype(np.float32)
    rois = rois_for(rng, 7, 2, 9, 11, attrs["spatial_scale"])
    ours = opencl(data, rois, **attrs)
    assert_close(ours, roi_align_reference(data, rois, **attrs), "OpenCL vs NumPy")
    assert_close(ours, mxnet(data, rois, **attrs), "OpenCL vs MXNet")


@needs_pocl()
@pytest.mark.parametrize(
    "attrs", [CASES[1], pytest.param(CASES[2], marks=pytest.mark.heavy)]
)  # aligned + sampling; position-sensitive
def test_pocl_matches_reference(attrs):
    rng = np.random.RandomState(5)
    data = rng.standard_normal((2, 12, 9, 11)).astype(np.float32)
    rois = rois_for(rng, 7, 2, 9, 11, attrs["spatial_scale"])
    ours = opencl(data, rois, 64, "pocl", **attrs)
    assert_close(ours, roi_align_reference(data, rois, **attrs))


@pytest.mark.skipif(not HAVE_INTEL, reason="no Intel OpenCL runtime here")
def test_edge_cases():
    rng = np.random.RandomState(5)
    data = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    rois = np.array(
        [
            [0, 2, 2, 2, 2],  # a point: widened to 1x1 unless aligned
            [1, -50, -50, -40, -40],  # entirely outside: every sample counts 0
            [1, 0, 0, 5, 4],  # the whole map: samples reach the last row/column
            [-1, 0, 0, 3, 3],  # a negative batch index: a zero row
            [0, 4.9, 3.9, 5.0, 4.0],  # on the far corner
        ],
        np.float32,
    )
    attrs = dict(pooled_size=(2, 3), spatial_scale=1.0)
    ref = roi_align_reference(data, rois, **attrs)
    assert not ref[3].any() and not ref[1].any()
    for ours in (cpu(data, rois, **attrs), opencl(data, rois, threads=16, **attrs)):
        assert_close(ours, ref)
    # MXNet agrees on every ROI with a valid batch index (given one with a negative
    # index, its CPU operator writes zeros over another ROI's output: not compared)
    assert_close(ref[[0, 1, 2, 4]], mxnet(data, rois[[0, 1, 2, 4]], **attrs))


@pytest.mark.skipif(not HAVE_INTEL, reason="no Intel OpenCL runtime here")
def test_one_roi_one_element_and_more_than_a_work_group():
    rng = np.random.RandomState(6)
    data = rng.standard_normal((1, 1, 4, 4)).astype(np.float32)
    one = np.array([[0, 0.5, 0.5, 3.0, 2.0]], np.float32)
    attrs = dict(pooled_size=(1, 1), spatial_scale=1.0)
    assert_close(opencl(data, one, **attrs), mxnet(data, one, **attrs))
    data = rng.standard_normal((1, 16, 20, 20)).astype(np.float32)
    rois = rois_for(rng, 300, 1, 20, 20, 0.25)  # 300 * 16 * 4 elements, many groups
    attrs = dict(pooled_size=(2, 2), spatial_scale=0.25)
    assert_close(opencl(data, rois, threads=256, **attrs), mxnet(data, rois, **attrs), "OpenCL")


@settings(max_examples=examples(15), deadline=None)
@given(
    seed=st.integers(0, 2**16),
    pooled=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    ratio=st.sampled_from([-1, 1, 2, 3]),
    aligned=st.booleans(),
    scale=st.sampled_from([1.0, 0.5, 0.25]),
)
def test_random_vs_mxnet(seed, pooled, ratio, aligned, scale):
    rng = np.random.RandomState(seed)
    data = rng.standard_normal((2, 3, 6, 7)).astype(np.float32)
    rois = rois_for(rng, 5, 2, 6, 7, scale)
    rois[:, 3:] = np.maximum(rois[:, 3:], rois[:, 1:3] + 0.5)  # MXNet aborts on empty aligned
    attrs = dict(pooled_size=pooled, spatial_scale=scale, sample_ratio=ratio, aligned=aligned)
    ref = mxnet(data, rois, **attrs)
    assert_close(cpu(data, rois, **attrs), ref)
    if HAVE_INTEL:
        assert_close(opencl(data, rois, **attrs), ref)


def test_bad_attributes():
    d = te.placeholder((1, 6, 4, 4), "float32", name="data")
    with pytest.raises(ValueError, match="rois must be"):
        roi_align(d, te.placeholder((3, 4), "float32", name="rois"), (2, 2), 1.0)
    with pytest.raises(ValueError, match="divisible by pooled_size"):
        roi_align(d, te.placeholder((3, 5), "float32"), (2, 2), 1.0, position_sensitive=True)
    with pytest.raises(ValueError, match="spatial_scale"):
        roi_align(d, te.placeholder((3, 5), "float32"), (2, 2), 0.0)


def _roi_net(tmp_path, rois):
    """conv -> ROIAlign over fixed ROIs (a parameter), saved as an MXNet model."""
    x = mx.sym.var("data")
    feat = mx.sym.Convolution(x, num_filter=4, kernel=(3, 3), pad=(1, 1), name="conv")
    out = mx.sym.contrib.ROIAlign(
        feat, mx.sym.var("rois"), pooled_size=(2, 3), spatial_scale=0.5, sample_ratio=2, name="roi"
    )
    rng = np.random.RandomState(8)
    params = {
        "arg:conv_weight": rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3,
        "arg:conv_bias": rng.standard_normal(4).astype(np.float32),
        "arg:rois": rois,
    }
    out.save(str(tmp_path / "roi-symbol.json"))
    mx.nd.save(str(tmp_path / "roi-0000.params"), {k: mx.nd.array(v) for k, v in params.items()})
    return tmp_path / "roi-symbol.json", tmp_path / "roi-0000.params"


@pytest.mark.parametrize("profile", ["cpu", "aisage"])
def test_imported_graph_matches_mxnet(tmp_path, profile):
    from conftest import mxnet_forward

    from edgecv.board.model import load
    from edgecv.deploy import deploy
    from edgecv.pipelines import BuildOptions
    from edgecv.testing import assert_close

    if profile != "cpu" and not HAVE_INTEL:
        pytest.skip("no Intel OpenCL runtime here")
    rois = rois_for(np.random.RandomState(9), 6, 2, 10, 12, 0.5)
    symbol, params = _roi_net(tmp_path, rois)
    pkg = deploy(
        str(symbol),
        tmp_path / "pkg",
        profile,
        params=str(params),
        input_shape=(2, 3, 10, 12),
        options=BuildOptions(layout="NCHW"),  # not about layouts: no graph-tuner timings
    )
    if profile != "cpu":  # the GPU version (one work-item per output element) ran
        import json

        launches = json.loads((pkg / "kernels" / "opencl_launches.json").read_text())
        (launch,) = launches["roi_align"]
        assert launch["global_size"] == [256, 1, 1] and launch["local_size"] == [256, 1, 1]
    x = np.random.RandomState(10).standard_normal((2, 3, 10, 12)).astype(np.float32)
    ours = load(pkg, on="intel" if profile != "cpu" else None).run(x)[0]
    assert_close(ours, mxnet_forward(symbol, params, x)[0], "ROIAlign graph")
