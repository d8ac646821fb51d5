"""The C device runtime (runtime_c/) in numbers, against the Python runtime on the same
packages: the library's size, load time and time per call on a tiny model.

    python benchmarks/c_runtime.py [--calls 2000] [--ssd] [--out FILE.md]

1. libedgecv_runtime.so built with CMake (Release), its size as built and stripped.
2. As on a board, each runtime in a process of its own with no TVM compiler: the Python
   runtime (``edgecv.load(path).run(x)``) and the C demo (``demos/c/run_package
   --repeat``), both on the package's own ``libtvm_runtime.so``: load time and the median
   time per call, rounds alternated.
3. In one process with TVM imported (both on TVM's runtime): ``edgecv.load(...).run(x)``
   against the C library called through ctypes, alternated.

4. ``--ssd``: ssd_512_mobilenet1.0_voc (random weights) for `cpu` in NCHW: load and first
   run of each runtime in a process of its own.

The tiny model is tests/graph_tuner/small_model.py (1x3x12x12, 8 launches): its kernels
take tens of microseconds, so the time per call is mostly each runtime's own overhead.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "graph_tuner")]

import c_library  # noqa: E402
from small_model import SHAPE, export_small_model  # noqa: E402

import edgecv  # noqa: E402
from edgecv.deploy import deploy  # noqa: E402
from edgecv.pipelines import BuildOptions  # noqa: E402

PYTHON_RUN = """
import sys, time, numpy as np
t = time.perf_counter()
import edgecv
model = edgecv.load(sys.argv[1])
x = np.zeros(model.input_shape, np.float32)
loaded = time.perf_counter()
model.run(x)
load, first = loaded - t, time.perf_counter() - loaded
if len(sys.argv) > 3:
    print(load * 1e3, first * 1e3)
    sys.exit()
times = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter(); model.run(x); times.append(time.perf_counter() - t)
print(load * 1e3, np.median(times) * 1e6, "tvm" in sys.modules)
"""


def board_like(package: Path, demo: Path, calls: int, env: dict) -> dict[str, list[float]]:
    """Load ms and median us per call of each runtime in a fresh process, 3 rounds."""
    found: dict[str, list[float]] = {
        "python load": [],
        "python call": [],
        "c load": [],
        "c call": [],
    }
    for _ in range(3):
        done = subprocess.run(
            [sys.executable, "-c", PYTHON_RUN, str(package), str(calls)],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        load, call, tvm = done.stdout.split()
        assert tvm == "False", "the Python runtime imported TVM"
        found["python load"].append(float(load))
        found["python call"].append(float(call))
        done = subprocess.run(
            [str(demo), str(package), "--repeat", str(calls)],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        lines = done.stdout.splitlines()
        found["c load"].append(float(lines[0].split(" in ")[1].split()[0]))
        found["c call"].append(float(lines[-1].split("median ")[1].split()[0]))
    return found


def first_runs(package: Path, demo: Path, env: dict) -> dict[str, float]:
    """Load ms (Python: import included) and first-run ms of each runtime in a process
    of its own, medians of 3 rounds, alternated."""
    found: dict[str, list[float]] = {}
    for _ in range(3):
        done = subprocess.run(
            [sys.executable, "-c", PYTHON_RUN, str(package), "0", "first"],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        python_load, python_first = map(float, done.stdout.split())
        lines = subprocess.run(
            [str(demo), str(package)], capture_output=True, text=True, env=env, check=True
        ).stdout.splitlines()
        first = next(line for line in lines if line.startswith("first run"))
        measured = {
            "python load": python_load,
            "python first run": python_first,
            "c load": float(lines[0].split(" in ")[1].split()[0]),
            "c first run": float(first.split()[3]),
        }
        for key, value in measured.items():
            found.setdefault(key, []).append(value)
    return {key: float(np.median(values)) for key, values in found.items()}


def in_one_process(package: Path, build: Path, calls: int) -> tuple[float, float]:
    """Median us per call: the Python runtime and the C library through ctypes."""
    import tvm  # noqa: F401  (TVM's runtime serves both, as in the tests)

    python = edgecv.load(package)
    c = c_library.CModel(c_library.library(build), package)
    x = np.zeros(SHAPE, np.float32)
    times: dict[str, list[float]] = {"python": [], "c": []}
    for _ in range(5):
        for name, run in (("python", python.run), ("c", c.run)):
            run(x)
            for _ in range(calls // 5):
                t = time.perf_counter()
                run(x)
                times[name].append(time.perf_counter() - t)
    c.close()
    return float(np.median(times["python"]) * 1e6), float(np.median(times["c"]) * 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--ssd", action="store_true", help="time SSD-512's load too")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="edgecv-c-runtime-"))
    symbol, params = export_small_model(work / "export" / "small")
    package = deploy(
        str(symbol),
        work / "small",
        "cpu",
        params=str(params),
        input_shape=SHAPE,
        options=BuildOptions(layout="NCHW"),
    )
    build = c_library.build(work / "build")
    library = build / "libedgecv_runtime.so"
    shutil.copy(library, work / "stripped.so")
    subprocess.run(["strip", "--strip-unneeded", str(work / "stripped.so")], check=True)
    threads = str(len(os.sched_getaffinity(0)))
    env = {**os.environ, "TVM_NUM_THREADS": threads, "PYTHONPATH": str(REPO)}
    board = board_like(package, build / "run_package", args.calls, env)
    python_call, c_call = in_one_process(package, build, args.calls)
    median = {k: float(np.median(v)) for k, v in board.items()}
    lines = [
        f"# The C device runtime against the Python runtime ({time.strftime('%Y-%m-%d')})",
        "",
        f"`python benchmarks/c_runtime.py --calls {args.calls}`; tiny model 1x3x12x12, "
        f"`cpu` package in NCHW, TVM_NUM_THREADS={threads}; medians of 3 rounds.",
        "",
        "| | measured |",
        "|---|---|",
        f"| libedgecv_runtime.so | {library.stat().st_size:,} bytes as built (RelWithDebInfo), "
        f"{(work / 'stripped.so').stat().st_size:,} stripped |",
        f"| load, own process (Python: import edgecv, load, first run; C: edgecv_load) | Python "
        f"{median['python load']:.0f} ms, C {median['c load']:.0f} ms |",
        f"| per call, own process, package's libtvm_runtime.so | Python "
        f"{median['python call']:.1f} us, C {median['c call']:.1f} us |",
        f"| per call, one process with TVM imported (C through ctypes) | Python "
        f"{python_call:.1f} us, C {c_call:.1f} us |",
        "",
        f"Every round: {board}",
    ]
    if args.ssd:
        ssd = deploy(
            "ssd_512_mobilenet1.0_voc",
            work / "ssd",
            "cpu",
            pretrained=False,
            options=BuildOptions(layout="NCHW"),
        )
        t = first_runs(ssd, build / "run_package", env)
        lines[-2:-2] = [
            f"| ssd_512_mobilenet1.0_voc, own process: load, first run | Python "
            f"{t['python load']:.0f} ms (import included), {t['python first run']:.0f} ms; "
            f"C {t['c load']:.0f} ms, {t['c first run']:.0f} ms |"
        ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
