# ruff: noqa: B023  (every lambda is timed and dropped inside its own loop iteration)
"""edgecv's vision operators on each local OpenCL device vs CPU baselines, detector sizes.

    python benchmarks/vision_ops.py [--repeat 5] [--devices intel]

Problem sizes come from the detectors: SSD-512's 122,640 boxes (NMS topk 400) and
YOLOv3-512's 16,128 boxes; the sort and scan run over the same lengths (one segment,
and 20 class segments of SSD's boxes). Each row: edgecv's kernel on the device (time
of the recorded launches, queue drained), MXNet's CPU operator, NumPy, and for NMS
OpenCV's ``cv2.dnn.NMSBoxes`` (class-agnostic, so a lower bound on the work), all in
this process on this machine, median of ``--repeat`` runs after a warm-up. Results are
checked against the NumPy reference before timing.

Not a test: numbers depend on the machine and its load. The OpenCL devices here are
CPU runtimes standing in for integrated GPUs.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import tvm

from edgecv._mxnet import import_mxnet
from edgecv.bench.harness import median_time  # one warm-up, then the median
from edgecv.board.runtime.opencl import OpenCLBackend
from edgecv.board.runtime.opencl_devices import opencl_devices
from edgecv.codegen.opencl import build_opencl
from edgecv.ops.box_nms import box_nms_gpu, box_nms_reference
from edgecv.ops.multibox import multibox_detection_gpu, multibox_detection_reference
from edgecv.ops.naive import naive_box_nms_gpu, naive_scan_gpu, naive_segmented_argsort_gpu
from edgecv.ops.roi_align import roi_align_gpu, roi_align_reference
from edgecv.ops.scan import scan_gpu, scan_reference
from edgecv.ops.segmented_argsort import segmented_argsort_gpu, segmented_argsort_reference
from edgecv.profiles import load_profile

SSD = dict(
    overlap_thresh=0.45,
    valid_thresh=0.01,
    topk=400,
    id_index=0,
    score_index=1,
    coord_start=2,
    force_suppress=False,
)


class DeviceOp:
    """One edgecv operator PrimFunc built and bound on one OpenCL device."""

    def __init__(self, name: str, func, device: str, arrays: list[np.ndarray], subgroup=None):
        # deeplens: the profile with Intel subgroups of 16; aisage: without subgroups
        target = load_profile("deeplens" if subgroup else "aisage").tvm_target()
        kernels = build_opencl(tvm.IRModule({name: func}), target, subgroup)
        if name in kernels.unsupported:
            raise RuntimeError(kernels.unsupported[name])
        self.backend = OpenCLBackend(device, kernels.source, kernels.launches, kernels.requires)
        self.tensors = []
        for array in arrays:
            tensor = self.backend.view(
                self.backend.alloc(array.nbytes), array.shape, str(array.dtype)
            )
            self.backend.upload(tensor, array)
            self.tensors.append(tensor)
        self.run_bound = self.backend.bind(name, self.tensors)
        self.launches = len(kernels.launches[name])

    def __call__(self) -> None:
        self.run_bound()
        self.backend.synchronize()

    def result(self, index: int) -> np.ndarray:
        return self.backend.download(self.tensors[index])


def ssd_like_boxes(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.RandomState(seed)
    data = np.zeros((1, n, 6), np.float32)
    data[..., 0] = rng.randint(0, 20, (1, n))
    data[..., 1] = rng.uniform(0, 1, (1, n)) ** 4  # most scores low, as after softmax
    xy = rng.uniform(0, 480, (1, n, 2))
    data[..., 2:4] = xy
    data[..., 4:6] = xy + rng.uniform(4, 120, (1, n, 2))
    return data


def tvm_stock(kind: str, shape, exclusive_or_desc: bool):
    """TVM's own GPU argsort / cumsum (topi.gpu) as a PrimFunc for OpenCL."""
    from tvm import te, topi

    target = load_profile("aisage").tvm_target()
    with target:
        if kind == "argsort":
            x = te.placeholder(shape, "float32", name="keys")
            out = topi.gpu.argsort(x, axis=-1, is_ascend=not exclusive_or_desc, dtype="int32")
        else:
            x = te.placeholder(shape, "int32", name="data")
            out = topi.gpu.cumsum(x, axis=1, dtype="int32", exclusive=exclusive_or_desc)
    func = te.create_prim_func([x, out])
    return func.with_attr({"tirx.is_scheduled": True})


def try_op(name, make, device, arrays, check, subgroup=None):
    """(built op, None) of a device op, or (None, reason) when it fails."""
    try:
        op = DeviceOp(name, make(), device, arrays, subgroup)
        op()
        check(op)
    except Exception as err:  # noqa: BLE001 - a version that cannot build or is wrong
        first = (str(err).strip().splitlines() or [type(err).__name__])[-1]
        return None, f"{type(err).__name__}: {first[:60]}"
    return op, None


def row(label, ours, launches, sub, naive, stock, mxnet_s, other, note=""):
    def ms(v):
        return f"{v * 1e3:>10.2f}" if isinstance(v, float) else f"{'-':>10}"

    ratio = lambda a: f"{a / ours:>8.2f}" if isinstance(a, float) else f"{'-':>8}"  # noqa: E731
    print(
        f"{label:<34}{ms(ours)}{launches:>5}{ms(sub)}{ms(naive)}{ms(stock)}{ms(mxnet_s)}"
        f"{ms(other)}{ratio(sub)}{ratio(naive)}{ratio(stock)}{ratio(mxnet_s)}  {note}",
        flush=True,
    )


def subgroup_time(has_subgroups: bool, name, make, device, arrays, check, repeat):
    """Median seconds of the Intel-subgroup variant (subgroups of 16), or None."""
    if not has_subgroups:
        return None
    op, err = try_op(name, make, device, arrays, check, subgroup=16)
    if op is None:
        print(f"  ({name} subgroup variant not run: {err})")
        return None
    return median_time(op, repeat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--devices", nargs="*", default=["intel", "pocl"])
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    mx = import_mxnet()

    present = opencl_devices()
    for device in args.devices:
        if any(d.matches(device) for d in present):
            bench_device(device, args.repeat, mx)


def nms_rows(device: str, repeat: int, mx, subgroups: bool) -> bool:
    """box_nms at SSD's and YOLOv3's box counts; False when the device cannot build it."""
    import cv2

    for label, n in (
        ("box_nms SSD-512 (122640 boxes)", 122640),
        ("box_nms YOLOv3-512 (16128 boxes)", 16128),
    ):
        data = ssd_like_boxes(n)
        ref = box_nms_reference(data, **SSD)

        def same(op, ref=ref):
            np.testing.assert_allclose(op.result(1), ref, rtol=1e-5, atol=1e-4)

        op, err = try_op(
            "box_nms",
            lambda: box_nms_gpu(data.shape, **SSD),
            device,
            [data, np.zeros_like(data)],
            same,
        )
        if op is None:
            print(f"{label:<34} not run: {err}")
            return False
        ours = median_time(op, repeat)
        sub = subgroup_time(
            subgroups,
            "box_nms",
            lambda: box_nms_gpu(data.shape, subgroup=16, **SSD),
            device,
            [data, np.zeros_like(data)],
            same,
            repeat,
        )
        naive, _ = try_op(
            "naive_box_nms",
            lambda: naive_box_nms_gpu(data.shape, **SSD),
            device,
            [data, np.zeros_like(data)],
            same,
        )
        naive_s = median_time(naive, 1) if naive else None
        nd = mx.nd.array(data)
        theirs = median_time(lambda: mx.nd.contrib.box_nms(nd, **SSD).wait_to_read(), repeat)
        valid = data[0, data[0, :, 1] > 0.01]
        rects = np.concatenate([valid[:, 2:4], valid[:, 4:6] - valid[:, 2:4]], 1).tolist()
        opencv = median_time(
            lambda: cv2.dnn.NMSBoxes(rects, valid[:, 1].tolist(), 0.01, 0.45, top_k=400),
            repeat,
        )
        row(
            label,
            ours,
            op.launches,
            sub,
            naive_s,
            None,
            theirs,
            opencv,
            "TVM: no GPU NMS; CV: cv2.dnn.NMSBoxes, class-agnostic",
        )
    return True


def argsort_rows(device: str, repeat: int, mx, subgroups: bool) -> None:
    """The segmented argsort: one long row, and one row per class."""
    for label, lengths in (
        ("argsort 1 x 122640", [122640]),
        ("argsort 20 classes x 6132", [6132] * 20),
    ):
        total = sum(lengths)
        keys = np.random.RandomState(1).uniform(0, 1, total).astype(np.float32)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        ref = segmented_argsort_reference(keys, offsets, True)
        work = [np.zeros(total, d) for d in ("float32", "int32", "int32") * 2]
        op, err = try_op(
            "segmented_argsort",
            lambda: segmented_argsort_gpu(total, len(lengths), "float32", True),
            device,
            [keys, offsets, np.zeros(total, np.int32), *work],
            lambda op: np.testing.assert_array_equal(op.result(2), ref),
        )
        ours = median_time(op, repeat)
        sub = subgroup_time(
            subgroups,
            "segmented_argsort",
            lambda: segmented_argsort_gpu(total, len(lengths), "float32", True, subgroup=16),
            device,
            [keys, offsets, np.zeros(total, np.int32), *work],
            lambda op: np.testing.assert_array_equal(op.result(2), ref),
            repeat,
        )
        naive, _ = try_op(
            "naive_argsort",
            lambda: naive_segmented_argsort_gpu(lengths, "float32", True),
            device,
            [keys, np.zeros(total, np.int32), np.zeros(total, np.int32)],
            lambda op: np.testing.assert_array_equal(op.result(1), ref),
        )
        naive_s = median_time(naive, 1) if naive else None
        rows2d = keys.reshape(len(lengths), -1)
        stock, why = try_op(
            "argsort",
            lambda: tvm_stock("argsort", rows2d.shape, True),
            device,
            [rows2d, np.zeros(rows2d.shape, np.int32)],
            lambda op: np.testing.assert_array_equal(op.result(1).ravel(), ref),
        )
        stock_s = median_time(stock, repeat) if stock else None
        nd = mx.nd.array(rows2d)
        theirs = median_time(
            lambda: mx.nd.argsort(nd, axis=-1, is_ascend=False).wait_to_read(), repeat
        )
        numpy_s = median_time(lambda: np.argsort(-rows2d, axis=-1, kind="stable"), repeat)
        row(
            label,
            ours,
            op.launches,
            sub,
            naive_s,
            stock_s,
            theirs,
            numpy_s,
            f"TVM: {why}" if why else "",
        )


def scan_rows(device: str, repeat: int, mx, subgroups: bool) -> None:
    """The inclusive scan (int32): one long row, and one row per class."""
    for label, shape in (
        ("scan 1 x 122640 (int32)", (1, 122640)),
        ("scan 20 x 6132 (int32)", (20, 6132)),
    ):
        x = np.random.RandomState(2).randint(0, 2, shape).astype(np.int32)
        ref = scan_reference(x, True)

        def same_scan(op, ref=ref):
            np.testing.assert_array_equal(op.result(1), ref)

        op, err = try_op(
            "scan",
            lambda: scan_gpu(*shape, "int32", True),
            device,
            [x, np.zeros_like(x)],
            same_scan,
        )
        ours = median_time(op, repeat)
        sub = subgroup_time(
            subgroups,
            "scan",
            lambda: scan_gpu(*shape, "int32", True, subgroup=16),
            device,
            [x, np.zeros_like(x)],
            same_scan,
            repeat,
        )
        naive, _ = try_op(
            "naive_scan",
            lambda: naive_scan_gpu(*shape, "int32", True),
            device,
            [x, np.zeros_like(x)],
            same_scan,
        )
        naive_s = median_time(naive, 1) if naive else None
        stock, why = try_op(
            "cumsum",
            lambda: tvm_stock("cumsum", shape, True),
            device,
            [x, np.zeros_like(x)],
            same_scan,
        )
        stock_s = median_time(stock, repeat) if stock else None
        nd = mx.nd.array(x, dtype="int32").as_np_ndarray()
        theirs = median_time(lambda: mx.np.cumsum(nd, axis=1).wait_to_read(), repeat)
        numpy_s = median_time(lambda: np.cumsum(x, axis=1), repeat)
        row(
            label,
            ours,
            op.launches,
            sub,
            naive_s,
            stock_s,
            theirs,
            numpy_s,
            f"TVM: {why}" if why else "",
        )


def bench_device(device: str, repeat: int, mx) -> None:
    """Every row of one device's table (none past a device that cannot build NMS)."""
    subgroups = any(d.matches(device) and d.intel_subgroups for d in opencl_devices())
    print(
        f"\n== {device} ==  (ms; x = that version's time / edgecv's work-group version; "
        f"subgroup: edgecv's Intel-subgroup variant, subgroups of 16)"
    )
    print(
        f"{'operator':<34}{'edgecv':>10}{'lnch':>5}{'subgroup':>10}{'naive GPU':>10}"
        f"{'TVM GPU':>10}{'MXNet CPU':>10}{'NumPy/CV':>10}{'sub x':>8}{'naive x':>8}"
        f"{'TVM x':>8}{'MXNet x':>8}"
    )
    if not nms_rows(device, repeat, mx, subgroups):
        return  # a device that cannot build NMS runs nothing more
    argsort_rows(device, repeat, mx, subgroups)
    scan_rows(device, repeat, mx, subgroups)
    # ROIAlign at a Faster-RCNN-like size; MultiBoxDetection at SSD-300's anchors
    rng = np.random.RandomState(3)
    feat = rng.standard_normal((1, 256, 32, 32)).astype(np.float32)
    xy = rng.uniform(0, 400, (300, 2))
    rois = np.concatenate([np.zeros((300, 1)), xy, xy + rng.uniform(16, 200, (300, 2))], 1)
    rois = rois.astype(np.float32)
    attrs = dict(pooled_size=(7, 7), spatial_scale=0.0625, sample_ratio=2)
    ref = roi_align_reference(feat, rois, **attrs)
    op, err = try_op(
        "roi_align",
        lambda: roi_align_gpu(feat.shape, rois.shape, "float32", 256, **attrs),
        device,
        [feat, rois, np.zeros_like(ref)],
        lambda op: np.testing.assert_allclose(op.result(2), ref, rtol=1e-4, atol=1e-4),
    )
    if op is not None:
        ours = median_time(op, repeat)
        nf, nr = mx.nd.array(feat), mx.nd.array(rois)
        theirs = median_time(lambda: mx.nd.contrib.ROIAlign(nf, nr, **attrs).wait_to_read(), repeat)
        row(
            "ROIAlign 300 x 256ch 7x7 (32x32)",
            ours,
            op.launches,
            None,
            None,
            None,
            theirs,
            None,
            "no subgroup variant: one work-item per output, nothing shared",
        )
    # the synthetic detector inputs the tests feed MultiBoxDetection (tests/helpers.py)
    tests = str(Path(__file__).resolve().parent.parent / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from helpers import detector_inputs

    cls, loc, anchors = detector_inputs(np.random.RandomState(4), 1, 21, 8732)
    det = dict(nms_threshold=0.45, nms_topk=400)
    ref = multibox_detection_reference(cls, loc, anchors, **det)
    op, err = try_op(
        "multibox_detection",
        lambda: multibox_detection_gpu(cls.shape, loc.shape, anchors.shape, **det),
        device,
        [cls, loc, anchors, np.zeros_like(ref)],
        lambda op: np.testing.assert_allclose(op.result(3), ref, rtol=1e-5, atol=1e-5),
    )
    if op is not None:
        ours = median_time(op, repeat)
        sub = subgroup_time(
            subgroups,
            "multibox_detection",
            lambda: multibox_detection_gpu(cls.shape, loc.shape, anchors.shape, subgroup=16, **det),
            device,
            [cls, loc, anchors, np.zeros_like(ref)],
            lambda op: np.testing.assert_allclose(op.result(3), ref, rtol=1e-5, atol=1e-5),
            repeat,
        )
        args_nd = [mx.nd.array(a) for a in (cls, loc, anchors)]
        theirs = median_time(
            lambda: mx.nd.contrib.MultiBoxDetection(*args_nd, **det).wait_to_read(),
            repeat,
        )
        row("MultiBoxDetection SSD-300 (8732x21)", ours, op.launches, sub, None, None, theirs, None)
    elif err:
        print(f"MultiBoxDetection not run: {err}")


if __name__ == "__main__":
    main()
