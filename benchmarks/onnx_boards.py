"""A sample of each torchvision and Ultralytics family through the ONNX frontend on the
GPU profiles: ``deeplens`` run here on Intel's CPU OpenCL runtime (the Intel Graphics
stand-in, with subgroups), ``aisage`` built on this x86-64 machine and run on the
emulated aarch64 board (``tests/emulation``: qemu-user, Debian's PoCL for arm64 as the
Mali stand-in, edgecv installed from its wheel without the compiler).

Each sample is a graph committed under ``tests/onnx_models`` (weights filled from seed 0
by ``seeded.filled``, as the tests fill them), compared with ONNX Runtime's CPU forward
of the same file: classifiers by :func:`edgecv.testing.compare_with_onnxruntime` (its
tolerances and loosening), detectors row by row (``tests/test_onnx_detectors.py``'s
``assert_detections_match``: count, order and labels exact, ties as sets). Each row also
says where the launches ran (``opencl`` / ``cpu`` counts from the manifest).

    python benchmarks/onnx_boards.py --profiles deeplens,aisage
    python benchmarks/onnx_boards.py --profiles aisage --models squeezenet1_1,tiny_fcos

One subprocess per sample and profile (a crash or a hang costs that row its
``--timeout``); rows are appended to ``<out>.csv`` as they finish, so a stopped run
resumes, and ``<out>.md`` is the table. Needs ``bash tests/emulation/prepare_aarch64.sh``
once for ``aisage``.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from onnx_coverage import _last_line, worker_row

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
GRAPHS = TESTS / "onnx_models"
# family -> committed graph (relative to tests/onnx_models) and its input size
SAMPLES = {
    "squeezenet1_1": ("SqueezeNet", "squeezenet1_1.onnx"),
    "mobilenet_v3_small": ("MobileNetV3", "mobilenet_v3_small.onnx"),
    "resnet18": ("ResNet", "resnet18.onnx"),
    "efficientnet_b0": ("EfficientNet", "efficientnet_b0.onnx"),
    "regnet_y_400mf": ("RegNet", "regnet_y_400mf.onnx"),
    "shufflenet_v2_x1_0": ("ShuffleNetV2", "shufflenet_v2_x1_0.onnx"),
    "convnext_tiny": ("ConvNeXt", "convnext_tiny.onnx"),
    "ssdlite320_mobilenet_v3_large": ("SSDlite", "detection/ssdlite320_mobilenet_v3_large.onnx"),
    "tiny_retinanet": ("RetinaNet", "detection/tiny_retinanet.onnx"),
    "tiny_fcos": ("FCOS", "detection/tiny_fcos.onnx"),
    "tiny_faster_rcnn": ("Faster R-CNN", "detection/tiny_faster_rcnn.onnx"),
    "yolov8n_320": ("YOLOv8 (raw head)", "ultralytics/yolov8n_320.onnx"),
}
FIELDS = ["model", "family", "profile", "status", "deploy_s", "launches", "compared", "error"]

# Runs on the emulated board: load the package, run it on x, save the outputs.
BOARD = """
import sys, numpy as np, edgecv
package, x_path = sys.argv[1:3]
outputs = edgecv.load(package).run(np.load(x_path))
np.savez(x_path + ".out.npz", *outputs)
"""


def check_one(name: str, profile: str, work: str, runtime: str) -> dict:
    """In the worker process: fill, deploy, run where the profile runs, compare."""
    import numpy as np

    sys.path[:0] = [str(GRAPHS), str(TESTS)]
    import onnx
    import seeded
    from test_onnx_detectors import _onnxruntime, assert_detections_match

    import edgecv
    from edgecv.deploy import deploy
    from edgecv.pipelines.steps import BuildOptions

    path = seeded.filled(GRAPHS / SAMPLES[name][1], work)
    # a row sort's or NMS's GPU kernel compiles for minutes beside other work: the
    # default limit would send it to the CPU, which is not what this measures
    options = BuildOptions(kernel_time_limit_s=1200)
    start = time.perf_counter()
    package = deploy(path, Path(work) / "package", profile, options=options)
    row = {"deploy_s": round(time.perf_counter() - start, 1)}
    manifest = json.loads((package / "manifest.json").read_text())
    launches = manifest["build"].get("placement", {}).get("launches", {})
    row["launches"] = " ".join(f"{k} {v}" for k, v in sorted(launches.items()))
    (spec,) = [tuple(value["shape"]) for value in manifest["inputs"]]
    outputs_names = [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]
    detector = "boxes" in outputs_names
    rng = np.random.RandomState(0)
    # a detector sees an image in [0, 1] (its presets' scaling); a classifier a normal input
    x = rng.rand(*spec) if detector else rng.standard_normal(spec)
    x = x.astype(np.float32)
    ours = _run_on_board(package, x, work, runtime) if profile == "aisage" else None
    if not detector:
        from edgecv.testing import compare_with_onnxruntime

        found = compare_with_onnxruntime(package, path, [x], outputs=ours)
        row["compared"] = f"max error {found['max_error']:.2g}"
        return row
    ours = ours if ours is not None else edgecv.load(package).run(x)
    ref = _onnxruntime(path, x)
    order = [outputs_names.index(n) for n in ("boxes", "scores", "labels")]
    found = assert_detections_match([ours[i] for i in order], [ref[i] for i in order], path,
                                    max(spec[-2:]))  # fmt: skip
    row["compared"] = f"{found['count']} rows, boxes {found['boxes']:.2g} px"
    return row


def _run_on_board(package: Path, x, work: str, runtime: str) -> list:
    """The package run on the emulated aarch64 board by the device runtime at ``runtime``."""
    import numpy as np

    sys.path.insert(0, str(TESTS))
    from emulation import aarch64

    x_path = Path(work) / "x.npy"
    np.save(x_path, x)
    done = aarch64.run_python(
        ["-c", BOARD, str(package), str(x_path)],
        binds=[Path(work), Path(runtime)],
        env={"PYTHONPATH": runtime},
        timeout=3000,
    )
    if done.returncode != 0:
        raise RuntimeError(f"on the board: {_last_line(done.stderr)}")
    with np.load(f"{x_path}.out.npz") as npz:
        return [npz[f"arr_{i}"] for i in range(len(npz.files))]


def device_runtime(folder: Path) -> Path:
    """edgecv installed from its wheel for the board, as tests/emulation installs it."""
    target = folder / "device-runtime"
    if not target.is_dir():
        # in a process of its own: this folder's graph_tuner.py would hide the tests' package
        code = (
            "import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path\n"
            "from test_wheel import build_wheel; print(build_wheel(Path(sys.argv[2])))"
        )
        built = subprocess.run(
            [sys.executable, "-c", code, str(TESTS), str(folder / "wheel")],
            check=True, capture_output=True, text=True, cwd=ROOT,
        )  # fmt: skip
        wheel = built.stdout.strip().splitlines()[-1]
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target"]
        subprocess.run([*pip, str(target), wheel], check=True, capture_output=True)
    return target


def _run_one(name: str, profile: str, args, runtime: Path) -> dict:
    row = {"model": name, "family": SAMPLES[name][0], "profile": profile}
    with tempfile.TemporaryDirectory(dir=args.work) as work:
        code = (
            "import json, sys; sys.path.insert(0, sys.argv[1]); import onnx_boards as b\n"
            "print('ROW ' + json.dumps(b.check_one(*sys.argv[2:])))"
        )
        command = [sys.executable, "-c", code, str(Path(__file__).parent)]
        command += [name, profile, work, str(runtime)]
        return worker_row(row, command, args.timeout, "failed")


def write_table(csv_path: Path, out: Path) -> None:
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    lines = [f"# ONNX samples on the GPU profiles ({csv_path.name})", ""]
    lines += ["| model | family | profile | status | deploy s | launches | compared | error |"]
    lines += ["|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [r[f].replace("|", "\\|") for f in FIELDS]
        lines.append("| " + " | ".join(cells) + " |")
    out.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", default="deeplens,aisage")
    parser.add_argument("--models", help="comma-separated names (default: all samples)")
    parser.add_argument("--out", type=Path, help="results without suffix")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per row")
    args = parser.parse_args()
    names = args.models.split(",") if args.models else list(SAMPLES)
    unknown = [n for n in names if n not in SAMPLES]
    if unknown:
        parser.error(f"no sample named {', '.join(unknown)}; samples: {', '.join(SAMPLES)}")
    day = time.strftime("%Y-%m-%d")
    out = args.out or ROOT / "benchmarks" / "results" / f"onnx_boards-{day}"
    csv_path = out.with_suffix(".csv")
    done = set()
    if csv_path.is_file():
        with open(csv_path, newline="") as f:
            done = {(r["model"], r["profile"]) for r in csv.DictReader(f)}
    else:
        with open(csv_path, "w", newline="") as f:
            csv.DictWriter(f, FIELDS).writeheader()
    runtime = device_runtime(args.work / "onnx-boards") if "aisage" in args.profiles else ""
    todo = [(n, p) for p in args.profiles.split(",") for n in names if (n, p) not in done]
    for i, (name, profile) in enumerate(todo, 1):
        row = _run_one(name, profile, args, runtime)
        print(f"[{i}/{len(todo)}] {name} {profile}: {row['status']} {row.get('error', '')}",
              flush=True)  # fmt: skip
        with open(csv_path, "a", newline="") as f:
            csv.DictWriter(f, FIELDS).writerow({k: row.get(k, "") for k in FIELDS})
        write_table(csv_path, out.with_suffix(".md"))


if __name__ == "__main__":
    main()
