"""Soak: one loaded detector package served for a long time, and loaded and dropped
over and over; what the process holds at the start and at the end.

    python benchmarks/soak.py [--inferences 100000] [--loads 1000] [--threads 2]
                              [--devices cpu,deeplens:intel] [--json FILE] [--out FILE.md]

For each device (a profile, and for a GPU profile the OpenCL device it runs on):

1. serve: the package loaded once with ``streams=THREADS`` and called by THREADS
   threads at once until INFERENCES calls have returned, every call's outputs checked
   against the first call's on the same input (a wrong result under load is a failure,
   whatever the memory does);
2. reload: ``edgecv.load`` + one run + drop, LOADS times.

Before and after each (after a warm-up: allocators, caches and the OpenCL runtime's
own pools settle in the first few hundred calls) it reads the process's resident
memory, open file descriptors, threads and live OpenCL memory objects (pyopencl
buffer objects reachable by the garbage collector), and samples RSS along the way.
A count that is higher at the end, or RSS more than ``--rss-noise-mib`` higher, is
reported as growth and the exit status is 1.

The package is the YOLO-like user detector of ``tests/user_models.py`` (convolutions,
max pools, an upsample, a decoded head and ``box_nms``; 96x96) deployed here with
seeded random weights, unless ``--package PROFILE=PATH`` names one. The suite runs a
short version behind the ``heavy`` marker (``tests/test_soak.py``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests")]

import edgecv  # noqa: E402


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def opencl_memory_objects() -> int:
    """pyopencl memory objects alive in this process (0 without pyopencl loaded)."""
    cl = sys.modules.get("pyopencl")
    if cl is None:
        return 0
    gc.collect()
    return sum(isinstance(o, cl.MemoryObjectHolder) for o in gc.get_objects())


def snapshot() -> dict:
    gc.collect()
    return {
        "rss_mib": round(rss_mib(), 1),
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": len(os.listdir("/proc/self/task")),
        "opencl_mem_objects": opencl_memory_objects(),
    }


def growth(start: dict, end: dict, rss_noise_mib: float) -> list[str]:
    """What grew from ``start`` to ``end`` beyond noise (empty: nothing)."""
    grew = [
        f"{key} {start[key]} -> {end[key]}"
        for key in ("fds", "threads", "opencl_mem_objects")
        if end[key] > start[key]
    ]
    if end["rss_mib"] - start["rss_mib"] > rss_noise_mib:
        grew.append(f"RSS {start['rss_mib']} -> {end['rss_mib']} MiB")
    return grew


def serve(package: Path, on: str | None, x: np.ndarray, count: int, threads: int) -> dict:
    """``count`` inferences from ``threads`` threads on one loaded model (module doc)."""
    model = edgecv.load(package, on=on, streams=threads)
    reference = model.run(x)
    done, wrong, samples = [0], [0], []
    lock = threading.Lock()
    step = max(1, count // 20)

    def work(total: int) -> None:
        while True:
            with lock:
                if done[0] >= total:
                    return
                done[0] += 1
                index = done[0]
            outputs = model.run(x)
            if any(not np.array_equal(a, b) for a, b in zip(outputs, reference, strict=True)):
                with lock:
                    wrong[0] += 1
            if index % step == 0:
                samples.append((index, round(rss_mib(), 1)))

    def from_threads(total: int) -> None:
        done[0] = 0
        workers = [threading.Thread(target=work, args=(total,)) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()

    # warm-up, from the same number of threads: the first calls fill allocators and
    # caches, and make the threads edgecv keeps for CPU kernels (runtime/workers.py)
    from_threads(300)
    samples.clear()
    start = snapshot()
    began = time.perf_counter()
    from_threads(count)
    seconds = time.perf_counter() - began
    end = snapshot()
    return {
        "inferences": count,
        "threads": threads,
        "seconds": round(seconds, 1),
        "per_s": round(count / seconds, 1),
        "wrong": wrong[0],
        "start": start,
        "end": end,
        "rss_samples": sorted(samples),
    }


def reload(package: Path, on: str | None, x: np.ndarray, count: int) -> dict:
    """Load, run once, drop: ``count`` times (module docstring)."""
    for _ in range(10):  # warm-up, as for serving
        edgecv.load(package, on=on).run(x)
    start = snapshot()
    began = time.perf_counter()
    for _ in range(count):
        model = edgecv.load(package, on=on)
        model.run(x)
        del model
    seconds = time.perf_counter() - began
    return {"loads": count, "seconds": round(seconds, 1), "start": start, "end": snapshot()}


def build_detector(profile: str, folder: Path) -> Path:
    from user_models import tiny_yolo

    from edgecv.deploy import deploy
    from edgecv.pipelines import BuildOptions

    symbol, params, shape = tiny_yolo(folder / "tiny_yolo")
    out = folder / f"pkg-{profile}"
    # no device at hand for a check at deploy time nor a layout search: only its run here
    deploy(
        str(symbol),
        out,
        profile,
        params=str(params),
        input_shape=shape,
        host="native",
        options=BuildOptions(check_on=None, layout="NCHW"),
    )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inferences", type=int, default=100_000)
    parser.add_argument("--loads", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2, help="callers (and streams)")
    parser.add_argument("--devices", default="cpu,deeplens:intel", help="PROFILE[:OPENCL]")
    parser.add_argument("--package", action="append", default=[], help="PROFILE=PATH")
    parser.add_argument("--rss-noise-mib", type=float, default=8.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--out", type=Path, help="a Markdown table of the results")
    args = parser.parse_args()
    given = dict(p.split("=", 1) for p in args.package)
    results, failed = {}, False
    with tempfile.TemporaryDirectory(prefix="edgecv-soak-") as tmp:
        for device in args.devices.split(","):
            profile, _, on = device.partition(":")
            package = (
                Path(given[profile]) if profile in given else build_detector(profile, Path(tmp))
            )
            model = edgecv.load(package, on=on or None)
            x = np.random.RandomState(0).uniform(-1, 1, model.input_shape).astype(np.float32)
            del model
            print(f"{device}: serving {args.inferences} inferences ...", flush=True)
            served = serve(package, on or None, x, args.inferences, args.threads)
            print(f"{device}: {args.loads} loads ...", flush=True)
            loaded = reload(package, on or None, x, args.loads)
            served["grew"] = growth(served["start"], served["end"], args.rss_noise_mib)
            loaded["grew"] = growth(loaded["start"], loaded["end"], args.rss_noise_mib)
            failed |= bool(served["grew"] or loaded["grew"] or served["wrong"])
            results[device] = {"serve": served, "reload": loaded}
            for what, r in (("serve", served), ("reload", loaded)):
                verdict = "; ".join(r["grew"]) or "nothing grew"
                print(f"{device} {what}: start {r['start']}, end {r['end']}: {verdict}")
            print(f"{device}: {served['wrong']} wrong of {served['inferences']}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if args.out:
        write_markdown(results, args)
    return 1 if failed else 0


def write_markdown(results: dict, args) -> None:
    keys = ("rss_mib", "fds", "threads", "opencl_mem_objects")
    rows = [
        "| device | run | count | seconds | "
        + " | ".join(f"{k} start -> end" for k in keys)
        + " | wrong | grew |",
        "|---" * (6 + len(keys)) + "|",
    ]
    for device, both in results.items():
        for what, r in both.items():
            count = r.get("inferences", r.get("loads"))
            values = " | ".join(f"{r['start'][k]} -> {r['end'][k]}" for k in keys)
            rows.append(
                f"| {device} | {what} | {count} | {r['seconds']} | {values} | "
                f"{r.get('wrong', '-')} | {'; '.join(r['grew']) or 'nothing'} |"
            )
    command = " ".join(sys.argv[1:])
    args.out.write_text(
        f"# Soak: `benchmarks/soak.py {command}`\n\n"
        + "\n".join(rows)
        + "\n\n"
        + "RSS along the serve runs (inference, MiB):\n\n"
        + "\n".join(f"- {d}: {b['serve']['rss_samples']}" for d, b in results.items())
        + "\n"
    )


if __name__ == "__main__":
    sys.exit(main())
