"""What CPU fallback costs: detectors on a local OpenCL device with the NMS on the CPU.

    python benchmarks/fallback_overhead.py          # SSD-MobileNet, SSD-ResNet50, YOLOv3
    python benchmarks/fallback_overhead.py ssd_512_mobilenet1.0_voc --repeat 5

For each detector and local OpenCL device: end-to-end latency, the number of device
copies and bytes copied per inference, and the time the copies take, timed step by
step inside the same runs (the OpenCL queue is drained before and after each copy, so
a copy's time is its own). ``copy %`` is that time over the whole inference. A second
column set runs the same package with every step timed the same way, so the share of
the NMS itself is visible too.

The all-GPU comparison of the issue needs a GPU NMS (the vision-operator issue); until
then the overhead is measured directly as the copies' share of the inference.

Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

import edgecv
from edgecv.deploy import deploy
from edgecv.runtime.opencl_devices import opencl_devices

MODELS = ["ssd_512_mobilenet1.0_voc", "ssd_512_resnet50_v1_voc", "yolo3_mobilenet1.0_coco"]


def timed_run(executor, x: np.ndarray) -> tuple[float, float, float]:
    """One inference step by step: (total, copy, cpu-kernel) seconds."""
    plan = executor.plan
    sync = [b.synchronize for b in set(executor.backends.values())]
    executor.backends[plan.buffers[plan.inputs[0]].device].upload(
        executor._tensors[plan.inputs[0]], x
    )
    copies = cpu = 0.0
    start = time.perf_counter()
    for step, launch in zip(plan.steps, executor._launches, strict=True):
        for s in sync:
            s()
        t = time.perf_counter()
        launch()
        for s in sync:
            s()
        spent = time.perf_counter() - t
        if step.kind == "copy":
            copies += spent
        elif step.device == "cpu":
            cpu += spent
    return time.perf_counter() - start, copies, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="*", default=MODELS)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--devices", nargs="*", default=["intel", "pocl"])
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    present = opencl_devices()
    header = (
        f"{'model':<26}{'device':<28}{'ms':>9}{'copies':>7}{'bytes':>12}"
        f"{'copy ms':>9}{'copy %':>8}{'NMS ms':>8}{'launches':>9}"
    )
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory(prefix="edgecv-bench-") as tmp:
        for name in args.models:
            package = deploy(name, Path(tmp) / name, "deeplens", pretrained=False)
            for query in args.devices:
                if not any(d.matches(query) for d in present):
                    continue
                try:
                    model = edgecv.load(package, on=query)
                except edgecv.EdgecvError as err:
                    print(f"{name:<26}{query:<28}  not run: {str(err).splitlines()[0][:80]}")
                    continue
                x = np.random.RandomState(0).uniform(-1, 1, model.input_shape).astype(np.float32)
                model.run(x)  # warm-up
                plain = []
                for _ in range(args.repeat):
                    t = time.perf_counter()
                    model.run(x)
                    plain.append(time.perf_counter() - t)
                steps = [timed_run(model.executor, x) for _ in range(args.repeat)]
                placement = model.manifest["build"]["placement"]
                total = statistics.median(plain)
                copy_s = statistics.median(s[1] for s in steps)
                nms_s = statistics.median(s[2] for s in steps)
                label = model.executor.backends["gpu"].label
                print(
                    f"{name:<26}{label[:27]:<28}{total * 1e3:>9.1f}{len(placement['copies']):>7}"
                    f"{placement['copy_bytes']:>12,}{copy_s * 1e3:>9.2f}"
                    f"{100 * copy_s / total:>7.2f}%{nms_s * 1e3:>8.1f}"
                    f"{model.executor.num_launches:>9}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
