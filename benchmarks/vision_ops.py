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
import statistics
import time
import warnings

import numpy as np
import tvm

from edgecv._mxnet import import_mxnet
from edgecv.build.opencl import build_opencl
from edgecv.ops.argsort import segmented_argsort_gpu, segmented_argsort_reference
from edgecv.ops.box_nms import box_nms_gpu, box_nms_reference
from edgecv.ops.scan import scan_gpu, scan_reference
from edgecv.profiles import load_profile
from edgecv.runtime.opencl import OpenCLBackend
from edgecv.runtime.opencl_devices import opencl_devices

SSD = dict(overlap_thresh=0.45, valid_thresh=0.01, topk=400, id_index=0, score_index=1,
           coord_start=2, force_suppress=False)  # fmt: skip


def median_time(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


class DeviceOp:
    """One edgecv operator PrimFunc built and bound on one OpenCL device."""

    def __init__(self, name: str, func, device: str, arrays: list[np.ndarray]):
        kernels = build_opencl(tvm.IRModule({name: func}), load_profile("aisage").tvm_target())
        self.backend = OpenCLBackend(device, kernels.source, kernels.launches)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--devices", nargs="*", default=["intel", "pocl"])
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    mx = import_mxnet()
    import cv2

    present = opencl_devices()
    for device in args.devices:
        if not any(d.matches(device) for d in present):
            continue
        print(f"\n== {device} ==")
        print(f"{'operator':<34}{'edgecv ms':>10}{'launches':>9}{'MXNet ms':>10}"
              f"{'NumPy ms':>10}{'OpenCV ms':>10}{'MXNet/edgecv':>13}")  # fmt: skip
        for label, n in (("box_nms SSD-512 (122640 boxes)", 122640),
                         ("box_nms YOLOv3-512 (16128 boxes)", 16128)):  # fmt: skip
            data = ssd_like_boxes(n)
            try:
                op = DeviceOp("box_nms", box_nms_gpu(data.shape, **SSD), device,
                              [data, np.zeros_like(data)])  # fmt: skip
            except Exception as err:  # noqa: BLE001 - a device that cannot build
                print(f"{label:<34} not run: {str(err).splitlines()[0][:70]}")
                break
            op()
            ref = box_nms_reference(data, **SSD)
            np.testing.assert_allclose(op.result(1), ref, rtol=1e-5, atol=1e-4)
            ours = median_time(op, args.repeat)
            nd = mx.nd.array(data)
            theirs = median_time(lambda: mx.nd.contrib.box_nms(nd, **SSD).wait_to_read(),
                                 args.repeat)  # fmt: skip
            numpy_s = median_time(lambda: box_nms_reference(data, **SSD), 1)
            valid = data[0, data[0, :, 1] > 0.01]
            rects = np.concatenate([valid[:, 2:4], valid[:, 4:6] - valid[:, 2:4]], 1).tolist()
            opencv = median_time(
                lambda: cv2.dnn.NMSBoxes(rects, valid[:, 1].tolist(), 0.01, 0.45, top_k=400),
                args.repeat,
            )
            print(f"{label:<34}{ours * 1e3:>10.2f}{op.launches:>9}{theirs * 1e3:>10.2f}"
                  f"{numpy_s * 1e3:>10.1f}{opencv * 1e3:>10.2f}{theirs / ours:>13.2f}")  # fmt: skip
        for label, lengths in (("argsort 1 x 122640", [122640]),
                               ("argsort 20 classes x 6132", [6132] * 20)):  # fmt: skip
            total = sum(lengths)
            keys = np.random.RandomState(1).uniform(0, 1, total).astype(np.float32)
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            work = [np.zeros(total, d) for d in ("float32", "int32", "int32") * 2]
            op = DeviceOp("segmented_argsort",
                          segmented_argsort_gpu(total, len(lengths), "float32", True),
                          device, [keys, offsets, np.zeros(total, np.int32), *work])  # fmt: skip
            op()
            ref = segmented_argsort_reference(keys, offsets, True)
            np.testing.assert_array_equal(op.result(2), ref)
            ours = median_time(op, args.repeat)
            rows = mx.nd.array(keys.reshape(len(lengths), -1))
            theirs = median_time(
                lambda: mx.nd.argsort(rows, axis=-1, is_ascend=False).wait_to_read(), args.repeat
            )
            numpy_s = median_time(
                lambda: np.argsort(-keys.reshape(len(lengths), -1), axis=-1, kind="stable"),
                args.repeat,
            )
            print(f"{label:<34}{ours * 1e3:>10.2f}{op.launches:>9}{theirs * 1e3:>10.2f}"
                  f"{numpy_s * 1e3:>10.2f}{'':>10}{theirs / ours:>13.2f}")  # fmt: skip
        for label, shape in (("scan 1 x 122640 (int32)", (1, 122640)),
                             ("scan 20 x 6132 (int32)", (20, 6132))):  # fmt: skip
            x = np.random.RandomState(2).randint(0, 2, shape).astype(np.int32)
            op = DeviceOp("scan", scan_gpu(*shape, "int32", True), device, [x, np.zeros_like(x)])
            op()
            np.testing.assert_array_equal(op.result(1), scan_reference(x, True))
            ours = median_time(op, args.repeat)
            nd = mx.nd.array(x, dtype="int32").as_np_ndarray()
            theirs = median_time(lambda: mx.np.cumsum(nd, axis=1).wait_to_read(), args.repeat)
            numpy_s = median_time(lambda: np.cumsum(x, axis=1), args.repeat)
            print(f"{label:<34}{ours * 1e3:>10.2f}{op.launches:>9}{theirs * 1e3:>10.2f}"
                  f"{numpy_s * 1e3:>10.2f}{'':>10}{theirs / ours:>13.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
