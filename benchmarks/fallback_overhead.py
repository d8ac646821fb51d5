"""What CPU fallback costs: detectors all on OpenCL vs with the NMS on the CPU.

    python benchmarks/fallback_overhead.py          # SSD-MobileNet, SSD-ResNet50, YOLOv3
    python benchmarks/fallback_overhead.py ssd_512_mobilenet1.0_voc --repeat 5

For each detector and local OpenCL device, two packages of the same weights: every
launch on the GPU (edgecv's GPU box_nms), and ``--cpu-ops box_nms`` (the NMS and its
sort on the CPU, two device copies). Printed: both end-to-end latencies (median,
alternating runs), the copies and bytes copied per inference, the copies' own time
(timed step by step with the queues drained around each step) and its share of the
mixed package's inference, and the NMS step's time on each device.

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
from edgecv.bench.harness import alternating_medians
from edgecv.board.runtime.opencl_devices import opencl_devices
from edgecv.deploy import deploy

MODELS = ["ssd_512_mobilenet1.0_voc", "ssd_512_resnet50_v1_voc", "yolo3_mobilenet1.0_coco"]


def nms_time(executor, x, repeat: int) -> tuple[float, float]:
    """Median (copy seconds, box_nms seconds) over step-by-step timed runs."""
    copies, nms = [], []
    with executor.context() as context:  # its buffers, launches and queues
        plan = context.plan
        sync = [b.synchronize for b in set(context.backends.values())]
        first = plan.buffers[plan.inputs[0]]
        for _ in range(repeat):
            context.backends[first.device].upload(context.tensors[plan.inputs[0]], x)
            c = n = 0.0
            for step, launch in zip(context.steps, context.launches, strict=True):
                for s in sync:
                    s()
                t = time.perf_counter()
                launch()
                for s in sync:
                    s()
                spent = time.perf_counter() - t
                if step.kind == "copy":
                    c += spent
                elif step.kernel.startswith("box_nms"):
                    n += spent
            copies.append(c)
            nms.append(n)
    return statistics.median(copies), statistics.median(nms)


def model_medians(models, x, repeat: int) -> list[float]:
    """Median seconds per inference of each model, in alternating runs (the shared
    harness, edgecv.bench) so that drift in the machine's load hits all alike."""
    return alternating_medians([lambda m=m: m.run(x) for m in models], repeat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="*", default=MODELS)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--devices", nargs="*", default=["intel", "pocl"])
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    present = opencl_devices()
    header = (
        f"{'model':<26}{'device':<16}{'all-GPU ms':>11}{'NMS-CPU ms':>11}{'overhead':>9}"
        f"{'copies':>7}{'bytes':>12}{'copy ms':>8}{'copy %':>7}{'NMS gpu ms':>11}{'NMS cpu ms':>11}"
    )
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory(prefix="edgecv-bench-") as tmp:
        for name in args.models:
            gpu_pkg = deploy(name, Path(tmp) / f"{name}-gpu", "deeplens", pretrained=False)
            cpu_pkg = deploy(
                name, Path(tmp) / f"{name}-mixed", "deeplens", pretrained=False, cpu_ops=["box_nms"]
            )
            for query in args.devices:
                if not any(d.matches(query) for d in present):
                    continue
                try:
                    gpu, mixed = edgecv.load(gpu_pkg, on=query), edgecv.load(cpu_pkg, on=query)
                except edgecv.EdgecvError as err:
                    print(f"{name:<26}{query:<16}  not run: {str(err).splitlines()[0][:80]}")
                    continue
                x = np.random.RandomState(0).uniform(-1, 1, gpu.input_shape).astype(np.float32)
                gpu.run(x), mixed.run(x)  # warm-up
                t_gpu, t_mixed = model_medians([gpu, mixed], x, args.repeat)
                copy_s, nms_cpu = nms_time(mixed.executor, x, args.repeat)
                _, nms_gpu = nms_time(gpu.executor, x, args.repeat)
                placement = mixed.manifest.placement
                label = gpu.executor.backends["gpu"].label.split(" / ")[0]
                print(
                    f"{name:<26}{label[:15]:<16}{t_gpu * 1e3:>11.1f}{t_mixed * 1e3:>11.1f}"
                    f"{100 * (t_mixed - t_gpu) / t_gpu:>8.1f}%{len(placement['copies']):>7}"
                    f"{placement['copy_bytes']:>12,}{copy_s * 1e3:>8.2f}"
                    f"{100 * copy_s / t_mixed:>6.2f}%{nms_gpu * 1e3:>11.1f}{nms_cpu * 1e3:>11.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
