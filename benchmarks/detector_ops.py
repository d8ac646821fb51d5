"""Detectors end to end with edgecv's GPU NMS vs the naive GPU NMS (one work-item per row).

    python benchmarks/detector_ops.py                      # SSD-MobileNet, SSD-ResNet50, YOLOv3
    python benchmarks/detector_ops.py yolo3_mobilenet1.0_coco --repeat 5

For each detector and local OpenCL device, two all-GPU packages of the same weights:
one built with edgecv's box_nms (segmented sort, scan, work-group suppression), one
with ``gpu_versions(box_nms="naive")`` (keys, merge sort and the serial NMS loop in a
single work-item per batch row). Printed: end-to-end latency of each (median,
alternating runs), their ratio, and the NMS step alone in each (queues drained around
it). Outputs of the two packages are checked equal first.

Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path

import numpy as np
from fallback_overhead import MODELS, alternating_medians, nms_time

import edgecv
from edgecv.build.gpu import gpu_versions
from edgecv.deploy import deploy
from edgecv.runtime.opencl_devices import opencl_devices


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="*", default=MODELS)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--devices", nargs="*", default=["intel", "pocl"])
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    present = opencl_devices()
    header = (f"{'model':<26}{'device':<16}{'edgecv ms':>10}{'naive ms':>10}{'speed-up':>9}"
              f"{'NMS edgecv ms':>14}{'NMS naive ms':>13}{'NMS x':>8}")  # fmt: skip
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory(prefix="edgecv-bench-") as tmp:
        for name in args.models:
            ours_pkg = deploy(name, Path(tmp) / f"{name}-ours", "deeplens", pretrained=False)
            with gpu_versions(box_nms="naive"):
                naive_pkg = deploy(name, Path(tmp) / f"{name}-naive", "deeplens",
                                   pretrained=False)  # fmt: skip
            for query in args.devices:
                if not any(d.matches(query) for d in present):
                    continue
                try:
                    ours, naive = edgecv.load(ours_pkg, on=query), edgecv.load(naive_pkg, on=query)
                except edgecv.EdgecvError as err:
                    print(f"{name:<26}{query:<16}  not run: {str(err).splitlines()[0][:80]}")
                    continue
                x = np.random.RandomState(0).uniform(-1, 1, ours.input_shape).astype(np.float32)
                for a, b in zip(ours.run(x), naive.run(x), strict=True):
                    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
                t_ours, t_naive = alternating_medians([ours, naive], x, args.repeat)
                _, nms_ours = nms_time(ours.executor, x, args.repeat)
                _, nms_naive = nms_time(naive.executor, x, args.repeat)
                label = ours.executor.backends["gpu"].label.split(" / ")[0]
                print(
                    f"{name:<26}{label[:15]:<16}{t_ours * 1e3:>10.1f}{t_naive * 1e3:>10.1f}"
                    f"{t_naive / t_ours:>8.2f}x{nms_ours * 1e3:>14.1f}{nms_naive * 1e3:>13.1f}"
                    f"{nms_naive / nms_ours:>7.1f}x",
                    flush=True,
                )


if __name__ == "__main__":
    main()
