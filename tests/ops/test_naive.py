"""The naive GPU baselines (one work-item per row) are correct: same references."""

from __future__ import annotations

import numpy as np
import pytest
from kernels import run_opencl
from test_box_nms import boxes

from edgecv.board.runtime.opencl_devices import opencl_devices
from edgecv.ops.box_nms import box_nms_reference
from edgecv.ops.naive import naive_box_nms_gpu, naive_scan_gpu, naive_segmented_argsort_gpu
from edgecv.ops.scan import scan_reference
from edgecv.ops.segmented_argsort import segmented_argsort_reference
from edgecv.testing import assert_close

pytestmark = pytest.mark.skipif(
    not any(d.matches("intel(r) opencl") for d in opencl_devices()),
    reason="no Intel OpenCL runtime here",
)


@pytest.mark.parametrize(
    ("rows", "n", "exclusive"), [(1, 1, False), (3, 100, True), (70, 9, False)]
)
def test_naive_scan(rows, n, exclusive):
    x = np.random.RandomState(n).randint(-5, 6, (rows, n)).astype(np.int32)
    out = run_opencl(naive_scan_gpu(rows, n, "int32", exclusive), [x, np.zeros_like(x)])[1]
    np.testing.assert_array_equal(out, scan_reference(x, exclusive))


@pytest.mark.parametrize(
    ("lengths", "descending"), [([1], False), ([0, 5, 17, 0, 64], True), ([300, 1, 33], False)]
)
def test_naive_argsort(lengths, descending):
    total = sum(lengths)
    keys = np.random.RandomState(total).randint(0, 5, total).astype(np.float32)  # many ties
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    func = naive_segmented_argsort_gpu(lengths, "float32", descending)
    out = run_opencl(func, [keys, np.zeros(total, np.int32), np.zeros(total, np.int32)])[1]
    np.testing.assert_array_equal(out, segmented_argsort_reference(keys, offsets, descending))


@pytest.mark.parametrize(
    ("batch", "n", "attrs"),
    [
        (1, 1, {}),
        (2, 150, {"id_index": 0, "topk": 40}),
        (3, 77, {"overlap_thresh": 0.2}),
        (2, 60, {"overlap_thresh": 0.6, "out_rows": 9}),
    ],
)
def test_naive_box_nms(batch, n, attrs):
    data = boxes(np.random.RandomState(n), batch, n)
    rows = attrs.get("out_rows", n)
    out = np.zeros((batch, rows, data.shape[-1]), np.float32)
    out = run_opencl(naive_box_nms_gpu(data.shape, **attrs), [data, out])[1]
    ref = box_nms_reference(data, **{a: v for a, v in attrs.items() if a != "out_rows"})
    assert_close(out, ref[:, :rows], "naive box_nms")
