"""The board's side in numbers: the device runtime's installed size, and packages built
here run on the emulated aarch64 board (tests/emulation, prepared by
``bash tests/emulation/prepare_aarch64.sh``).

    python benchmarks/board_runtime.py [--ssd] [--out FILE.md]

1. Installed size for an aarch64 board (Python 3.11 wheels, ``pip install --target``):
   edgecv's wheel with its base dependencies (the device runtime), with ``[opencl]``,
   and, for comparison, the ``apache-tvm`` wheel a board needed before (``import
   edgecv`` pulled in the whole compiler).
2. Under qemu: import of the device runtime, ``edgecv.load`` and one run of a small
   YOLO-like detector's ``aisage`` package (``box_nms`` on the CPU), against MXNet.
3. ``--ssd``: ssd_512_mobilenet1.0_voc for ``aisage`` (random weights, seed 0) on the
   emulated PoCL, detections against MXNet's (correctness, not speed: qemu emulates).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "graph_tuner")]

from conftest import mxnet_forward  # noqa: E402
from emulation import aarch64  # noqa: E402
from user_models import tiny_yolo  # noqa: E402

from edgecv.deploy import deploy  # noqa: E402
from edgecv.testing import assert_close, match_detections, network_loosening  # noqa: E402

PLATFORMS = ["manylinux_2_28_aarch64", "manylinux2014_aarch64", "manylinux_2_17_aarch64"]


def folder_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def pip_target(requirements: list[str], target: Path) -> None:
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--target",
            str(target),
            "--only-binary=:all:",
            *platforms,
            "--python-version",
            "3.11",
            *requirements,
        ],
        check=True,
        capture_output=True,
    )


def installed_sizes(work: Path) -> list[str]:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(work), str(REPO)],
        check=True,
        capture_output=True,
    )
    (wheel,) = work.glob("edgecv-*.whl")
    rows = ["| install (aarch64, Python 3.11) | MB | largest parts |", "|---|---|---|"]
    for label, requirement in [
        ("`pip install edgecv` (device runtime)", str(wheel)),
        ("`pip install edgecv[opencl]`", f"edgecv[opencl] @ {wheel.as_uri()}"),
        ("before: `apache-tvm` 0.27.0.post1 + its dependencies", "apache-tvm==0.27.0.post1"),
    ]:
        target = work / f"t{len(rows)}"
        pip_target([requirement], target)
        parts = sorted(
            ((folder_mb(p), p.name) for p in target.iterdir() if p.is_dir()), reverse=True
        )
        largest = ", ".join(f"{name} {mb:.1f}" for mb, name in parts[:5])
        rows.append(f"| {label} | {folder_mb(target):.1f} | {largest} |")
        print(rows[-1], flush=True)
    return rows


BOARD = """
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import edgecv
t1 = time.perf_counter()
model = edgecv.load(sys.argv[1])
t2 = time.perf_counter()
outputs = model.run(np.load(sys.argv[2]))
t3 = time.perf_counter()
outputs = model.run(np.load(sys.argv[2]))
t4 = time.perf_counter()
np.savez(sys.argv[2] + ".out.npz", *outputs)
maps = open("/proc/self/maps").read()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "first_run_s": t3 - t2,
                  "run_s": t4 - t3, "compiler_library": "libtvm_compiler" in maps}))
"""


def on_board(runtime: Path, package: Path, x: np.ndarray) -> tuple[dict, list[np.ndarray]]:
    np.save(package.parent / "x.npy", x)
    started = time.perf_counter()
    done = aarch64.run_python(
        ["-c", BOARD, str(package), str(package.parent / "x.npy")],
        binds=[package.parent, runtime],
        env={"PYTHONPATH": str(runtime)},
        timeout=7200,
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    facts["process_s"] = time.perf_counter() - started
    with np.load(package.parent / "x.npy.out.npz") as npz:
        return facts, [npz[f"arr_{i}"] for i in range(len(npz.files))]


def exported(case: str, folder: Path) -> tuple[Path, Path, tuple[int, ...], list[str]]:
    """(symbol, params, input shape, CPU operators) of a case, seeded random weights."""
    if case == "tiny":
        symbol, params, shape = tiny_yolo(folder / "tiny", size=64)
        return symbol, params, shape, ["box_nms"]
    from edgecv.frontend.mxnet import zoo

    model = zoo.export("ssd_512_mobilenet1.0_voc", folder / "ssd", pretrained=False, seed=0)
    return model.symbol_path, model.params_path, model.input_shape, []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ssd", action="store_true", help="also SSD-512 MobileNet for aisage")
    parser.add_argument("--out", help="write the tables to this Markdown file")
    args = parser.parse_args()
    reason = aarch64.unavailable_reason()
    if reason:
        raise SystemExit(reason)
    lines = [f"# The board's side, {time.strftime('%Y-%m-%d')}", ""]
    with tempfile.TemporaryDirectory(prefix="edgecv-board-") as tmp:
        work = Path(tmp)
        (work / "sizes").mkdir()
        lines += installed_sizes(work / "sizes")
        runtime = work / "runtime"
        (wheel,) = (work / "sizes").glob("edgecv-*.whl")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--target",
                str(runtime),
                str(wheel),
            ],
            check=True,
        )
        lines += [
            "",
            "| `aisage` package on the emulated board (qemu-aarch64 7.2, PoCL 3.1) | "
            "import s | load s | first run s | run s | matches MXNet |",
            "|---|---|---|---|---|---|",
        ]
        cases = {"tiny": "tiny_yolo 64x64, box_nms on the CPU"}
        if args.ssd:
            cases["ssd"] = "ssd_512_mobilenet1.0_voc, every launch on the GPU"
        for case, label in cases.items():
            symbol, params, shape, cpu_ops = exported(case, work / "export")
            path = deploy(
                str(symbol),
                work / case / "pkg",
                "aisage",
                params=str(params),
                input_shape=shape,
                cpu_ops=cpu_ops,
                check_on=None,
            )
            x = np.random.RandomState(0).normal(size=shape).astype(np.float32)
            facts, outputs = on_board(runtime, path, x)
            assert not facts["compiler_library"]
            print(label, json.dumps(facts), flush=True)  # before the comparison can fail
            reference = mxnet_forward(symbol, params, x)
            if case == "tiny":
                for got, want in zip(outputs, reference, strict=True):
                    assert_close(got, want, name=label)
                verdict = "yes (assert_close)"
            else:
                loosen, scale = network_loosening(symbol), max(shape[2:])
                kept = match_detections(outputs, reference, loosen, scale)
                verdict = f"yes ({kept} detections matched)"
            times = " | ".join(
                f"{facts[k]:.1f}" for k in ("import_s", "load_s", "first_run_s", "run_s")
            )
            lines.append(f"| {label} | {times} | {verdict} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
