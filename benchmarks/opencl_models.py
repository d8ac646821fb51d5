"""Whole models on the local OpenCL devices: latency, launches, host overhead, memory, start-up.

    python benchmarks/opencl_models.py                         # squeezenet, mobilenet, resnet50
    python benchmarks/opencl_models.py squeezenet1.0 --repeat 10 --profiles deeplens

For each model, device profile and matching local OpenCL device, one table row:

- latency: median end-to-end ``model.run`` (input upload, every launch, output read);
- launches per inference, and the host time per launch: the time the executor spends
  enqueueing the recorded launches (``clEnqueueNDRangeKernel`` calls, arguments bound at
  load time) divided by their number, measured with the queue drained before and after;
- device memory: every byte edgecv allocates on the device (intermediate slots after the
  memory plan, GPU kernels' workspaces among them, parameters, inputs) against the lower
  bound ``parameters + inputs + the largest set of activations and workspaces live at
  once``;
- start-up: ``edgecv.load`` with an empty program cache (the OpenCL compiler runs) and
  again with the cache filled by the first load.

Not a test: numbers depend on the machine and its load. The OpenCL devices here are
CPU runtimes standing in for integrated GPUs, so latencies say little about a GPU; the
launch overhead, memory and start-up columns carry over.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

import edgecv
from edgecv.bench.harness import time_runs
from edgecv.board.runtime.opencl_devices import opencl_devices
from edgecv.deploy import deploy

DEVICES = {"deeplens": ["intel"], "aisage": ["intel", "pocl"]}


def measure(package: Path, on: str, repeat: int, cache: Path) -> dict:
    os.environ["EDGECV_CACHE_DIR"] = str(cache)
    t = time.perf_counter()
    model = edgecv.load(package, on=on)
    cold = time.perf_counter() - t
    del model
    t = time.perf_counter()
    model = edgecv.load(package, on=on)
    warm = time.perf_counter() - t
    backend, executor = model.executor.backend, model.executor
    x = np.random.RandomState(0).uniform(-1, 1, model.input_shape).astype(np.float32)
    latency = time_runs(lambda: model.run(x), repeat, warmup=1)  # the shared harness
    enqueue = []
    with executor.context() as context:  # its launches, on its own command queue
        for _ in range(repeat):
            context.backend.synchronize()
            t = time.perf_counter()
            for launch in context.launches:
                launch()
            enqueue.append(time.perf_counter() - t)
            context.backend.synchronize()
    build = model.manifest.build
    inputs = sum(int(np.prod(t.shape)) * 4 for t in model.manifest.inputs)
    bound = build["constant_bytes"] + inputs + build["live_bytes_lower_bound"]
    return {
        "device": backend.label,
        "latency_ms": latency.median * 1e3,
        "launches": executor.num_launches,
        "host_us": statistics.median(enqueue) / executor.num_launches * 1e6,
        "device_mb": backend.allocated_bytes / 2**20,
        "bound_mb": bound / 2**20,
        "cold_s": cold,
        "warm_s": warm,
        "cached": (backend.program_cached, cold > warm),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default = ["squeezenet1.0", "mobilenet1.0", "resnet50_v1"]
    parser.add_argument("models", nargs="*", default=default)
    parser.add_argument("--profiles", nargs="*", default=list(DEVICES))
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    present = opencl_devices()
    print("OpenCL devices:", "; ".join(d.label for d in present) or "none")
    header = (
        f"{'model':<15}{'profile':<10}{'device':<34}{'ms':>9}{'launches':>9}{'host us':>9}"
        f"{'dev MB':>8}{'bound MB':>9}{'ratio':>6}{'cold s':>8}{'warm s':>8}"
    )
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory(prefix="edgecv-bench-") as tmp:
        for name in args.models:
            for profile in args.profiles:
                package = deploy(name, Path(tmp) / f"{name}-{profile}", profile, pretrained=False)
                for query in DEVICES[profile]:
                    if not any(d.matches(query) for d in present):
                        continue
                    cache = Path(tmp) / f"cache-{name}-{profile}-{query}"
                    try:
                        r = measure(package, query, args.repeat, cache)
                    except edgecv.EdgecvError as err:
                        first = str(err).splitlines()[0][:90]
                        print(f"{name:<15}{profile:<10}{query:<34}  not run: {first}")
                        continue
                    print(
                        f"{name:<15}{profile:<10}{r['device'][:33]:<34}{r['latency_ms']:>9.1f}"
                        f"{r['launches']:>9}{r['host_us']:>9.1f}{r['device_mb']:>8.1f}"
                        f"{r['bound_mb']:>9.1f}{r['device_mb'] / r['bound_mb']:>6.2f}"
                        f"{r['cold_s']:>8.2f}{r['warm_s']:>8.2f}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
