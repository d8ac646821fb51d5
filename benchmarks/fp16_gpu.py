"""FP16 vs FP32 packages for a GPU profile: package size, the static plan's activation
memory and, on Intel's OpenCL runtime (a CPU runtime standing in for DeepLens' GPU),
latency in alternating runs.

    python benchmarks/fp16_gpu.py                              # the seven zoo models
    python benchmarks/fp16_gpu.py mobilenet1.0 --repeat 10 --no-latency

Per model (``--random-weights``: seeded, no pretrained weights are reachable here) one
fp32 and one fp16 package for ``--device`` (deeplens by default), NCHW layouts, no
tuning databases (so both get the same default rules); then

- size: the weights (``params.npz``) and the whole package folder, and the plan's
  activation memory (``build.intermediate_bytes``: every storage slot of the static plan,
  GPU kernels' workspaces included, the peak the executor allocates) and its live lower
  bound;
- latency: median of ``--repeat`` runs on ``--on`` (default ``intel``), the packages taking
  turns (:func:`edgecv.bench.harness.alternate`). A CPU runtime emulates float16 in
  float32 arithmetic with conversions: fp16 may run slower here than on the iGPU it
  stands in for; this is reported, not tuned for;
- agreement: the largest output difference between the two packages relative to the
  fp32 output's scale, on a sample photo.

Not a test: numbers vary with load.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

import edgecv
from edgecv.bench.harness import alternate
from edgecv.deploy import deploy
from edgecv.frontend.mxnet.zoo import zoo_models
from edgecv.pipelines import BuildOptions

ZOO = tuple(zoo_models())  # the seven zoo models of edgecv/data/zoo.json


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def measure(model: str, device: str, on: str, repeat: int, latency: bool, work: Path) -> dict:
    packages, row = {}, {"model": model}
    for precision in ("fp32", "fp16"):
        options = BuildOptions(tuning=None, layout="NCHW", precision=precision)
        packages[precision] = deploy(
            model, work / f"{model}-{precision}", profile=device, pretrained=False, options=options
        )
        build = json.loads((packages[precision] / "manifest.json").read_text())["build"]
        row[precision] = {
            "params_bytes": (packages[precision] / "params.npz").stat().st_size,
            "package_bytes": folder_bytes(packages[precision]),
            "activation_bytes": build["intermediate_bytes"],
            "live_lower_bound": build["live_bytes_lower_bound"],
            # GPU kernels' workspaces: inside activation_bytes (the memory plan places
            # them), summed here as they would take unshared
            "workspace_bytes": build.get("workspace_bytes", 0),
        }
    for key in ("params_bytes", "package_bytes", "activation_bytes"):
        row[f"{key}_ratio"] = round(row["fp16"][key] / row["fp32"][key], 3)
    if latency:
        loaded = {p: edgecv.load(packages[p], on=on) for p in packages}
        shape = loaded["fp32"].input_shape
        x = np.random.RandomState(0).normal(size=shape).astype(np.float32)
        outputs = {p: m.run(x) for p, m in loaded.items()}
        ref = outputs["fp32"][0]
        scale = float(np.abs(ref).max()) or 1.0
        row["fp16_vs_fp32_error"] = float(np.abs(outputs["fp16"][0] - ref).max()) / scale
        times = alternate({p: (lambda m=m: m.run(x)) for p, m in loaded.items()}, repeat)
        row["latency_ms"] = {p: round(t.median * 1e3, 2) for p, t in times.items()}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(ZOO))
    parser.add_argument("--device", default="deeplens")
    parser.add_argument("--on", default="intel", help="OpenCL device for the latency runs")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--no-latency", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgecv-fp16-bench-") as tmp:
        for model in args.models:
            row = measure(model, args.device, args.on, args.repeat, not args.no_latency, Path(tmp))
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("| model | params fp16/fp32 | package | activations | latency fp32 | fp16 |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ms = r.get("latency_ms", {})
        ratios = " | ".join(
            str(r[f"{k}_ratio"]) for k in ("params_bytes", "package_bytes", "activation_bytes")
        )
        print(f"| {r['model']} | {ratios} | {ms.get('fp32', '-')} | {ms.get('fp16', '-')} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
