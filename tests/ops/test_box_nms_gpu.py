"""box_nms on OpenCL (segmented sort + scan + NMS in TIR) vs the NumPy reference and MXNet."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from conftest import needs_pocl
from hypothesis import given, settings
from hypothesis import strategies as st
from matrix import each_once, examples, heavy_selected
from test_box_nms import boxes, fractional_ids, run_mxnet

from edgecv.board.runtime.opencl_devices import opencl_devices
from edgecv.codegen.opencl import build_opencl
from edgecv.ops.box_nms import box_nms_gpu, box_nms_reference
from edgecv.profiles import load_profile
from edgecv.testing import assert_close

pytestmark = pytest.mark.skipif(
    not any(d.matches("intel(r) opencl") for d in opencl_devices()),
    reason="no Intel OpenCL runtime here",
)
_BACKENDS: dict = {}


def run_opencl(
    data: np.ndarray, threads: int = 64, device: str = "intel", subgroup=None, **attrs
) -> np.ndarray:
    from edgecv.board.runtime.opencl import OpenCLBackend

    key = (data.shape, threads, device, subgroup, tuple(sorted(attrs.items())))
    if key not in _BACKENDS:
        func = box_nms_gpu(data.shape, "float32", "opencl", threads, subgroup, **attrs)
        target = load_profile("deeplens" if subgroup else "aisage").tvm_target()
        kernels = build_opencl(tvm.IRModule({"box_nms": func}), target, subgroup)
        assert not kernels.unsupported, kernels.unsupported
        _BACKENDS[key] = OpenCLBackend(device, kernels.source, kernels.launches, kernels.requires)
    backend = _BACKENDS[key]
    rows = attrs.get("out_rows", -1)
    shape = data.shape if rows < 0 else (*data.shape[:-2], rows, data.shape[-1])
    src = backend.view(backend.alloc(data.nbytes), data.shape, "float32")
    dst = backend.view(backend.alloc(int(np.prod(shape)) * 4), shape, "float32")
    backend.upload(src, data)
    backend.bind("box_nms", [src, dst])()
    backend.synchronize()
    return backend.download(dst)


def check(
    data: np.ndarray, threads: int = 64, subgroup=None, device="intel", **attrs
) -> np.ndarray:
    rows = attrs.get("out_rows", -1)
    ref = box_nms_reference(data, **{a: v for a, v in attrs.items() if a != "out_rows"})
    ref = ref if rows < 0 else ref[..., :rows, :]
    ours = run_opencl(data, threads, device, subgroup, **attrs)
    np.testing.assert_array_equal(ours[..., :2], ref[..., :2])  # ids and scores: exact
    assert_close(ours, ref, "OpenCL box_nms")
    return ours


SSD = dict(
    overlap_thresh=0.45,
    valid_thresh=0.01,
    topk=400,
    id_index=0,
    score_index=1,
    coord_start=2,
    force_suppress=False,
)


CASES = [
    (1, 1, {}),
    (1, 7, {"overlap_thresh": 0.0}),  # everything overlapping is suppressed
    (2, 100, {"overlap_thresh": 1.0}),  # nothing suppressed
    (2, 300, SSD),
    (1, 257, {"id_index": 0, "force_suppress": True, "topk": 30}),
    (1, 90, {"in_format": "corner", "out_format": "center", "id_index": 0}),
    (3, 64, {"valid_thresh": 2.0}),  # no valid box at all
    (2, 300, {**SSD, "out_rows": 7}),  # the first rows only (a following slice's)
    (1, 90, {"overlap_thresh": 1.0, "out_rows": 89}),  # more kept than written
]


@pytest.mark.parametrize(
    ("batch", "n", "attrs", "subgroup"),
    each_once(CASES, [None, 16], ["work-group", "intel-subgroup"]),
)
def test_matches_reference(batch, n, attrs, subgroup):
    data = boxes(np.random.RandomState(n), batch, n)
    check(data, subgroup=subgroup, **attrs)


@pytest.mark.parametrize("subgroup", [None, 16], ids=["work-group", "intel-subgroup"])
def test_class_ids_compare_as_truncated_integers(subgroup):
    check(fractional_ids(), subgroup=subgroup, id_index=0)


@pytest.mark.parametrize("subgroup", [None, 16], ids=["work-group", "intel-subgroup"])
def test_equal_scores_and_degenerate_boxes(subgroup):
    rng = np.random.RandomState(7)
    data = boxes(rng, 2, 150, score_levels=[0.2, 0.5, 0.9], degenerate=True)
    ours = check(data, subgroup=subgroup, id_index=0, overlap_thresh=0.3)
    assert_close(ours, run_mxnet(data, id_index=0, overlap_thresh=0.3), "vs MXNet")


# the work-group version passes 2^16 boxes in the default suite by the PoCL case below
@pytest.mark.parametrize(
    "subgroup",
    [pytest.param(None, marks=pytest.mark.heavy), 16],
    ids=["work-group", "intel-subgroup"],
)
def test_more_boxes_than_2_16(subgroup):
    data = boxes(np.random.RandomState(1), 1, 70000)
    check(data, subgroup=subgroup, **SSD)


@needs_pocl()
@pytest.mark.parametrize(
    ("batch", "n", "attrs"),
    [
        (1, 70000, SSD),  # the top-k sort; PoCL compiles box_nms in ~30 s: the rest is heavy
        pytest.param(1, 7, {"overlap_thresh": 0.0}, marks=pytest.mark.heavy),
        pytest.param(2, 300, SSD, marks=pytest.mark.heavy),
    ],
)
def test_on_pocl(batch, n, attrs):
    data = boxes(np.random.RandomState(n + 1), batch, n)
    check(data, 256, device="pocl", **attrs)


@settings(max_examples=examples(6), deadline=None)
@given(
    n=st.integers(1, 700),
    batch=st.integers(1, 3),
    thresh=st.sampled_from([0.0, 0.3, 0.7]),
    topk=st.sampled_from([-1, 5, 100]),
    force=st.booleans(),
    ties=st.booleans(),
    threads=st.sampled_from([1, 32, 128]),
    subgroup=st.sampled_from([None, 16]),
    seed=st.integers(0, 2**16),
)
def test_random(n, batch, thresh, topk, force, ties, threads, subgroup, seed):
    """Random boxes and attributes: the work-group version at ``threads`` work-items a row,
    the subgroup version (tiles of 16, survivors list) at 256; each keeps exactly the
    greedy set. One variant an example (drawn: each example is a program of its own,
    5-15 s to compile), both with ``-m heavy``."""
    data = boxes(np.random.RandomState(seed), batch, n, score_levels=[0.3, 0.6] if ties else None)
    attrs = dict(id_index=0, overlap_thresh=thresh, topk=topk, force_suppress=force)
    for variant in [None, 16] if heavy_selected() else [subgroup]:
        check(data, threads if variant is None else 256, subgroup=variant, **attrs)
