"""Coverage of torchvision's models through the ONNX frontend: which export, deploy and
match ONNX Runtime, and how long the deploy took.

For every classifier of ``torchvision.models`` and detector of
``torchvision.models.detection`` (or ``--models``), each in its own subprocesses so a
hang or a crash costs that model its ``--timeout`` and nothing else:

1. export: ``tests/onnx_models/export.py`` (classifiers, 224x224, the torch.export-based
   exporter) or ``export_detection.py`` (detectors, 320x320, the TorchScript-based one),
   run by ``--torch-python`` (a Python with torch and torchvision, never a dependency of
   edgecv), weights stripped; kept in ``--cache``, so a second run skips it;
2. weights filled from seed 0 as the tests fill them (``tests/onnx_models/seeded.py``:
   every layer's output of order 1, so a comparison relative to 1 means something);
3. ``deploy`` for ``--deploy PROFILE`` and a comparison with ONNX Runtime's CPU forward
   of the same file: classifiers by :func:`edgecv.testing.compare_with_onnxruntime`,
   detectors row by row (:func:`edgecv.testing.match_detections`, the padding rows
   left out, the counts equal).

    python benchmarks/onnx_coverage.py --torch-python /path/to/torch/python --deploy cpu
    python benchmarks/onnx_coverage.py --torch-python ... --models resnet18,ssd300_vgg16
    python benchmarks/onnx_coverage.py --torch-python ... --layout-budget 5 --timeout 900

Models run smallest first (torchvision's recorded parameter counts), so a sweep stopped
early has covered the most; ``--layout-budget`` gives the graph tuner fewer seconds to
measure layouts (the question is deploy-and-match, not speed).

Writes ``<out>.csv`` (one row per model, appended as each finishes: a long sweep can be
stopped and resumed, models already in the file are skipped) and ``<out>.md`` (counts
per kind and status, then each model's row).
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

ROOT = Path(__file__).resolve().parent.parent
EXPORTS = ROOT / "tests" / "onnx_models"
FIELDS = ["model", "kind", "status", "deploy_s", "max_error", "detections", "error"]
DETECTION_OUTPUTS = ("boxes", "scores", "labels")  # export_detection.output_names
STATUSES = ("match", "no detections", "mismatch", "deploy failed", "export failed", "timeout")


def _models(torch_python: str) -> dict[str, str]:
    """Every torchvision classifier and detector name -> its kind, smallest first (by the
    parameter count torchvision's weight tables record, read without downloading any), so
    a sweep stopped early has covered the most models."""
    code = (
        "import json, torchvision.models as m\n"
        "def size(name):\n"
        "    try:\n"
        "        return m.get_model_weights(name).DEFAULT.meta.get('num_params', 0)\n"
        "    except Exception:\n"
        "        return 0\n"
        "kinds = [m.list_models(module=m), m.list_models(module=m.detection)]\n"
        "print(json.dumps([[(n, size(n)) for n in names] for names in kinds]))"
    )
    out = subprocess.run([torch_python, "-c", code], capture_output=True, text=True, check=True)
    classifiers, detectors = json.loads(out.stdout.strip().splitlines()[-1])
    sized = [(p, n, "classification") for n, p in classifiers]
    sized += [(p, n, "detection") for n, p in detectors]
    return {name: kind for _, name, kind in sorted(sized)}


def _export(name: str, kind: str, torch_python: str, cache: Path, timeout: float) -> Path:
    path = cache / f"{name}.onnx"
    if not path.is_file():
        script = "export.py" if kind == "classification" else "export_detection.py"
        command = [torch_python, str(EXPORTS / script), name, "--out", str(cache)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0 or not path.is_file():
            raise RuntimeError(_last_line(done.stderr) or "the export wrote no file")
    return path


def _last_line(text: str) -> str:
    """The last line of a failed stage's stderr that says something: TVM prints
    warnings on the way out (a BlockBuilder destroyed) after the error."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    said = [line for line in lines if "Warning" not in line and "warn(" not in line]
    return (said or lines or [""])[-1][:300]


def check_one(stripped: str, kind: str, profile: str, work: str, budget: str) -> dict:
    """In the worker process: fill, deploy, compare; the CSV row's measured fields."""
    import numpy as np

    sys.path.insert(0, str(EXPORTS))
    import seeded

    import edgecv
    from edgecv.deploy import deploy
    from edgecv.pipelines.steps import BuildOptions
    from edgecv.testing import compare_with_onnxruntime, match_detections

    path = seeded.filled(stripped, work)
    options = BuildOptions(layout_budget_s=float(budget)) if budget != "default" else None
    start = time.perf_counter()
    package = deploy(
        path, Path(work) / "package", profile, options=options, input_shape=_batch_one(path)
    )
    row = {"deploy_s": round(time.perf_counter() - start, 1)}
    if kind == "classification":
        row["max_error"] = compare_with_onnxruntime(package, path)["max_error"]
        return row
    import onnxruntime as ort

    model = edgecv.load(package)
    (spec,) = model.manifest.inputs
    x = np.random.RandomState(0).rand(*spec.shape).astype(np.float32)  # an image in [0, 1]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    # by name: the two-stage detectors return boxes, labels, scores; the others boxes,
    # scores, labels (both sides in the graph's order)
    order = [[o.name for o in session.get_outputs()].index(n) for n in DETECTION_OUTPUTS]
    ref = session.run(None, {session.get_inputs()[0].name: x})
    ref_boxes, ref_scores, ref_labels = (ref[i] for i in order)
    ours = model.run(x)
    boxes, scores, labels = (ours[i] for i in order)
    count = int((scores >= 0).sum())
    if count != len(ref_scores):
        raise AssertionError(f"{count} detections, ONNX Runtime has {len(ref_scores)}")

    if count == 0:  # nothing above the thresholds on either side: nothing was compared
        row["detections"] = 0
        row["status"] = "no detections"
        return row

    def rows(ids, values, corners):
        return [ids[None, :count, None], values[None, :count, None], corners[None, :count]]

    size = float(max(spec.shape[-2:]))
    match_detections(
        rows(labels.astype(np.float32), scores, boxes),
        rows(ref_labels.astype(np.float32), ref_scores, ref_boxes),
        box_scale=size,
    )
    row["detections"] = count
    return row


def _batch_one(path) -> dict | None:
    """The graph's inputs (:func:`edgecv.frontend.onnx.graph_inputs.graph_inputs`) with
    each symbolic dimension 1 (an exporter's dynamic batch), or None when all are fixed."""
    import onnx

    from edgecv.frontend.onnx.graph_inputs import graph_inputs

    inputs = graph_inputs(onnx.load(str(path), load_external_data=False))
    if all(value.static for value in inputs):
        return None
    return {v.name: tuple(d if isinstance(d, int) else 1 for d in v.dims) for v in inputs}


def _run_one(name: str, kind: str, args, cache: Path) -> dict:
    row = {"model": name, "kind": kind}
    try:
        stripped = _export(name, kind, args.torch_python, cache, args.timeout)
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        return {**row, "status": "export failed", "error": str(err)[:300]}
    with tempfile.TemporaryDirectory() as work:
        code = (
            "import json, sys; sys.path.insert(0, sys.argv[1]); import onnx_coverage as c\n"
            "print('ROW ' + json.dumps(c.check_one(*sys.argv[2:])))"
        )
        command = [sys.executable, "-c", code, str(Path(__file__).parent)]
        command += [str(stripped), kind, args.deploy, work, str(args.layout_budget)]
        return worker_row(row, command, args.timeout, "deploy failed")


def worker_row(row: dict, command: list[str], timeout: float, failed: str) -> dict:
    """``row`` completed by a worker process that prints ``ROW {json}``: a match, or the
    worker's own status, or ``timeout``, ``mismatch`` (an AssertionError) or ``failed``
    with the last line of its error."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**row, "status": "timeout", "error": f"over {timeout:.0f} s"}
    found = [line for line in done.stdout.splitlines() if line.startswith("ROW ")]
    if done.returncode == 0 and found:
        return {**row, "status": "match", **json.loads(found[-1][4:])}  # or as the worker says
    status = "mismatch" if "AssertionError" in done.stderr else failed
    return {**row, "status": status, "error": _last_line(done.stderr)}


def write_table(csv_path: Path, out: Path) -> None:
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    lines = [f"# torchvision through the ONNX frontend ({csv_path.name})", ""]
    lines += ["| kind | models | " + " | ".join(STATUSES) + " |"]
    lines += ["|---" * (len(STATUSES) + 2) + "|"]
    for kind in ("classification", "detection"):
        mine = [r for r in rows if r["kind"] == kind]
        counts = [sum(r["status"] == s for r in mine) for s in STATUSES]
        lines.append(f"| {kind} | {len(mine)} | " + " | ".join(map(str, counts)) + " |")
    lines += ["", "| model | kind | status | deploy s | max error | detections | error |"]
    lines += ["|---|---|---|---|---|---|---|"]
    for r in rows:
        error = r["error"].replace("|", "\\|")
        cells = [r["model"], r["kind"], r["status"], r["deploy_s"], r["max_error"]]
        lines.append("| " + " | ".join([*cells, r["detections"], error]) + " |")
    out.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch-python", required=True, help="a Python with torchvision")
    parser.add_argument("--deploy", default="cpu", metavar="PROFILE")
    parser.add_argument("--models", help="comma-separated names (default: all)")
    parser.add_argument("--out", type=Path, help="results without suffix")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "onnx-cov")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per stage")
    parser.add_argument(
        "--layout-budget",
        default="default",
        help="the graph tuner's measuring budget in seconds (default: deploy's); a small "
        "one shortens a sweep whose question is deploy-and-match, not speed",
    )
    args = parser.parse_args()
    everything = _models(args.torch_python)
    names = args.models.split(",") if args.models else list(everything)
    unknown = [n for n in names if n not in everything]
    if unknown:
        parser.error(f"not torchvision models: {', '.join(unknown)}")
    out = args.out or ROOT / "benchmarks" / "results" / f"onnx_coverage-{args.deploy}"
    csv_path = out.with_suffix(".csv")
    done = set()
    if csv_path.is_file():
        with open(csv_path, newline="") as f:
            done = {r["model"] for r in csv.DictReader(f)}
    else:
        with open(csv_path, "w", newline="") as f:
            csv.DictWriter(f, FIELDS).writeheader()
    args.cache.mkdir(parents=True, exist_ok=True)
    todo = [n for n in names if n not in done]
    for i, name in enumerate(todo, 1):
        row = _run_one(name, everything[name], args, args.cache)
        print(f"[{i}/{len(todo)}] {name}: {row['status']} {row.get('error', '')}", flush=True)
        with open(csv_path, "a", newline="") as f:
            csv.DictWriter(f, FIELDS, restval="").writerow(row)
        write_table(csv_path, out.with_suffix(".md"))


if __name__ == "__main__":
    main()
