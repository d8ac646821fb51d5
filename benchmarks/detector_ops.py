"""Detectors end to end with edgecv's GPU NMS vs the naive GPU NMS (one work-item per row).

    python benchmarks/detector_ops.py                      # SSD-MobileNet, SSD-ResNet50, YOLOv3
    python benchmarks/detector_ops.py yolo3_mobilenet1.0_coco --repeat 5

For each detector and local OpenCL device, three all-GPU packages of the same weights
for the deeplens profile: edgecv's box_nms in its Intel-subgroup variant (the default
for a device with subgroups), in its work-group variant (``OpVersions(subgroups=
False)``: segmented sort, scan, work-group suppression), and the naive version
(``OpVersions({"box_nms": "naive"})``: keys, merge sort and the serial NMS loop in a
single work-item per batch row). Printed: end-to-end latency of each (median,
alternating runs), the speed-ups over naive, and the NMS step alone in each (queues
drained around it). Outputs of the packages are checked equal first.

Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path

import numpy as np
from fallback_overhead import MODELS, model_medians, nms_time

import edgecv
from edgecv.board.runtime.opencl_devices import opencl_devices
from edgecv.codegen.op_versions import OpVersions
from edgecv.deploy import deploy
from edgecv.pipelines import BuildOptions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="*", default=MODELS)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--devices", nargs="*", default=["intel", "pocl"])
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    present = opencl_devices()
    header = (
        f"{'model':<26}{'device':<16}{'subgroup ms':>12}{'work-group ms':>14}"
        f"{'naive ms':>10}{'sub x':>7}{'wg x':>7}{'NMS sub ms':>11}{'NMS wg ms':>10}"
        f"{'NMS naive ms':>13}"
    )
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory(prefix="edgecv-bench-") as tmp:
        for name in args.models:
            packages = [deploy(name, Path(tmp) / f"{name}-sub", "deeplens", pretrained=False)]
            for label, versions in (
                ("wg", OpVersions(subgroups=False)),
                ("naive", OpVersions({"box_nms": "naive"})),
            ):
                options = BuildOptions(op_versions=versions)
                packages.append(
                    deploy(
                        name,
                        Path(tmp) / f"{name}-{label}",
                        "deeplens",
                        pretrained=False,
                        options=options,
                    )
                )
            for query in args.devices:
                if not any(d.matches(query) for d in present):
                    continue
                try:
                    models = [edgecv.load(p, on=query) for p in packages]
                except edgecv.EdgecvError as err:
                    print(f"{name:<26}{query:<16}  not run: {str(err).splitlines()[0][:80]}")
                    continue
                x = np.random.RandomState(0).uniform(-1, 1, models[0].input_shape)
                x = x.astype(np.float32)
                first = models[0].run(x)
                for other in models[1:]:
                    for a, b in zip(first, other.run(x), strict=True):
                        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
                t_sub, t_wg, t_naive = model_medians(models, x, args.repeat)
                nms = [nms_time(m.executor, x, args.repeat)[1] for m in models]
                label = models[0].executor.backends["gpu"].label.split(" / ")[0]
                print(
                    f"{name:<26}{label[:15]:<16}{t_sub * 1e3:>12.1f}{t_wg * 1e3:>14.1f}"
                    f"{t_naive * 1e3:>10.1f}{t_naive / t_sub:>6.2f}x{t_naive / t_wg:>6.2f}x"
                    f"{nms[0] * 1e3:>11.1f}{nms[1] * 1e3:>10.1f}{nms[2] * 1e3:>13.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
