"""box_nms on OpenCL (segmented sort + scan + NMS in TIR) vs the NumPy reference and MXNet."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from test_box_nms import boxes, run_mxnet

from edgecv.build.opencl import build_opencl
from edgecv.ops.box_nms import box_nms_gpu, box_nms_reference
from edgecv.profiles import load_profile
from edgecv.runtime.opencl_devices import opencl_devices

pytestmark = pytest.mark.skipif(
    not any(d.matches("intel(r) opencl") for d in opencl_devices()),
    reason="no Intel OpenCL runtime here",
)
_BACKENDS: dict = {}


def run_opencl(data: np.ndarray, threads: int = 64, device: str = "intel", **attrs) -> np.ndarray:
    from edgecv.runtime.opencl import OpenCLBackend

    key = (data.shape, threads, device, tuple(sorted(attrs.items())))
    if key not in _BACKENDS:
        func = box_nms_gpu(data.shape, "float32", "opencl", threads, **attrs)
        kernels = build_opencl(tvm.IRModule({"box_nms": func}), load_profile("aisage").tvm_target())
        assert not kernels.unsupported, kernels.unsupported
        _BACKENDS[key] = OpenCLBackend(device, kernels.source, kernels.launches)
    backend = _BACKENDS[key]
    src = backend.view(backend.alloc(data.nbytes), data.shape, "float32")
    dst = backend.view(backend.alloc(data.nbytes), data.shape, "float32")
    backend.upload(src, data)
    backend.bind("box_nms", [src, dst])()
    backend.synchronize()
    return backend.download(dst)


def check(data: np.ndarray, threads: int = 64, **attrs) -> np.ndarray:
    ref = box_nms_reference(data, **attrs)
    ours = run_opencl(data, threads, **attrs)
    np.testing.assert_array_equal(ours[..., :2], ref[..., :2])  # ids and scores: exact
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)
    return ours


SSD = dict(overlap_thresh=0.45, valid_thresh=0.01, topk=400, id_index=0, score_index=1,
           coord_start=2, force_suppress=False)  # fmt: skip


@pytest.mark.parametrize(
    ("batch", "n", "attrs"),
    [
        (1, 1, {}),
        (1, 7, {"overlap_thresh": 0.0}),  # everything overlapping is suppressed
        (2, 100, {"overlap_thresh": 1.0}),  # nothing suppressed
        (2, 300, SSD),
        (1, 257, {"id_index": 0, "force_suppress": True, "topk": 30}),
        (1, 90, {"in_format": "corner", "out_format": "center", "id_index": 0}),
        (3, 64, {"valid_thresh": 2.0}),  # no valid box at all
    ],
)
def test_matches_reference(batch, n, attrs):
    data = boxes(np.random.RandomState(n), batch, n)
    check(data, **attrs)


def test_equal_scores_and_degenerate_boxes():
    rng = np.random.RandomState(7)
    data = boxes(rng, 2, 150, score_levels=[0.2, 0.5, 0.9], degenerate=True)
    ours = check(data, id_index=0, overlap_thresh=0.3)
    np.testing.assert_allclose(ours, run_mxnet(data, id_index=0, overlap_thresh=0.3), atol=1e-5)


def test_more_boxes_than_2_16():
    data = boxes(np.random.RandomState(1), 1, 70000)
    check(data, **SSD)


@settings(max_examples=6, deadline=None)
@given(n=st.integers(1, 400), threads=st.sampled_from([1, 32, 128]), seed=st.integers(0, 999))
def test_random(n, threads, seed):
    data = boxes(np.random.RandomState(seed), 2, n)
    check(data, threads, id_index=0, overlap_thresh=0.5, topk=-1)
