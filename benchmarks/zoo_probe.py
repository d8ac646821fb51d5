"""The divergence probe on zoo models, with the zoo sweep's weights and input: where a
model that does not match MXNet first departs, and whether the difference is a tie.

For each model: export it as ``zoo_coverage.py`` does (``pretrained=False``, seeded
random weights), take the sweep's input (``example_input(shape, seed)``), and run
:func:`edgecv.testing.probe_divergence` over the model's stages. A backbone's
convolutions, BatchNorms and adds are compared at their residual blocks' outputs (the
activation after each add); everything else (the RPN, the heads, proposals, ROIAlign,
decoding, NMS) node by node. Writes, per model, ``<out>/<model>-seed<N>-<profile>.txt``
(the probe's table) and ``.json`` (the verdict ``zoo_coverage.py`` reads):

- ``"departs"``: a stage differs by more than ``factor`` times MXNet's own one-step
  drift, or changes kept rows MXNet's drift leaves alone: an edgecv bug to fix;
- ``"tie"``: no stage departs: every numeric stage is within the factor of MXNet's drift
  and every kept-row difference is one MXNet's own drift also makes.

    python benchmarks/zoo_probe.py mask_rcnn_fpn_syncbn_resnet18_v1b_coco --seed 0
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBES = ROOT / "benchmarks" / "results" / "probes"

# a backbone's dense operators, compared only where a residual block ends
_BACKBONE_OPS = {"BatchNorm", "Convolution", "elemwise_add"}
# nodes named with these belong to the detection heads: compared node by node
_HEAD_WORDS = ("rpn", "dense", "mask", "head")


def verdict_path(out: Path, model: str, seed: int, profile: str) -> Path:
    return out / f"{model}-seed{seed}-{profile}.json"


def apply_probe_verdict(row: dict, probes: Path, seed: int, profile: str) -> None:
    """A model whose outputs did not match MXNet, and that ``zoo_probe.py`` probed with
    the same seed on the same profile, gets the probe's verdict: ``parity=tie`` when no
    stage departs beyond MXNet's own drift (the mismatch is a tie or a threshold MXNet's
    rounding also crosses), with the verdict file in ``probe``; a departing probe leaves
    ``parity=fail`` and names its first departing stage."""
    if row.get("parity") != "fail":
        return
    path = verdict_path(probes, row["model"], seed, profile)
    if not path.is_file():
        return
    verdict = json.loads(path.read_text())
    row["probe"] = str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    if verdict["verdict"] == "tie":
        row["parity"] = "tie"
    else:
        row["error"] = f"probe: first departure at {verdict['first_departure']}; " + str(
            row.get("error", "")
        )


def probe_stages(symbol: Path) -> list[str]:
    """The node names the probe compares (see the module's docstring)."""
    nodes = json.loads(symbol.read_text())["nodes"]
    stages = []
    for node in nodes:
        op, name = node["op"], node["name"]
        head = any(word in name for word in _HEAD_WORDS)
        if op == "null" or (op in _BACKBONE_OPS and not head):
            continue
        if op == "Activation" and not head:
            if nodes[node["inputs"][0][0]]["op"] != "elemwise_add":
                continue  # inside a residual block
        stages.append(name)
    return stages


def _commit() -> str:
    run = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True)
    return run.stdout.decode().strip() or "unknown"


def probe_model(name: str, seed: int, profile: str, layout: str, out: Path, work: Path) -> dict:
    from edgecv.frontend.mxnet import zoo
    from edgecv.frontend.mxnet.random_weights import example_input
    from edgecv.pipelines import BuildOptions
    from edgecv.testing import probe_divergence

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the random-weights warning
        exported = zoo.export(name, work / name, pretrained=False, seed=seed)
    shapes = list(exported.input_shapes.items())
    inputs = {k: example_input(tuple(s), seed + i) for i, (k, s) in enumerate(shapes)}
    stages = probe_stages(exported.symbol_path)
    print(f"[probe] {name}: {len(stages)} stages", flush=True)
    start = time.perf_counter()
    report = probe_divergence(
        exported.symbol_path,
        exported.params_path,
        inputs,
        profile=profile,
        stages=stages,
        options=BuildOptions(layout=layout),
        workdir=work / name / "probe",
    )
    seconds = time.perf_counter() - start
    first = report.first
    row_sets = [
        {
            "stage": s.name,
            "op": s.op,
            "mxnet_drift_too": bool(s.drift_sets_differ),
            "detail": s.detail,
        }
        for s in report.stages
        if s.sets_differ
    ]
    verdict = {
        "model": name,
        "seed": seed,
        "profile": profile,
        "layout": layout,
        "verdict": "departs" if first else "tie",
        "first_departure": first.name if first else None,
        "stages": len(report.stages),
        "largest_ratio": max(s.ratio for s in report.stages),
        "factor": report.factor,
        "row_set_differences": row_sets,
        "seconds": round(seconds, 1),
        "commit": _commit(),
        "date": date.today().isoformat(),
        "machine": platform.processor() or platform.machine(),
    }
    out.mkdir(parents=True, exist_ok=True)
    path = verdict_path(out, name, seed, profile)
    header = (
        f"# benchmarks/zoo_probe.py {name} --seed {seed} --profile {profile} --layout {layout}"
        f" ({verdict['commit']}, {verdict['date']}, {seconds:.0f} s)\n"
    )
    path.with_suffix(".txt").write_text(header + report.table(limit=None) + "\n")
    path.write_text(json.dumps(verdict, indent=1) + "\n")
    print(f"[probe] {name}: {verdict['verdict']} ({seconds:.0f} s) -> {path}", flush=True)
    return verdict


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--seed", type=int, default=0, help="the sweep's seed (weights, input)")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--layout", default="NCHW", help="conv layouts (NCHW: no layout search)")
    parser.add_argument("--out", type=Path, default=PROBES)
    args = parser.parse_args()
    departs = 0
    with tempfile.TemporaryDirectory(prefix="zoo-probe-") as tmp:
        for name in args.models:
            verdict = probe_model(name, args.seed, args.profile, args.layout, args.out, Path(tmp))
            departs += verdict["verdict"] == "departs"
    return 1 if departs else 0


if __name__ == "__main__":
    sys.exit(main())
