"""The graph tuner per zoo model and device: all-NCHW vs all-packed vs the tuner's
choice (``--layout auto``): latency, transforms inserted, predicted vs measured time.

    python benchmarks/graph_tuner.py                                  # 7 models, cpu + deeplens
    python benchmarks/graph_tuner.py mobilenet1.0 resnet50_v1 --profiles cpu --repeat 15

Per model and profile, three packages are deployed (seeded random weights), loaded in
one process and run alternately (median of ``--repeat`` runs after a warm-up). The
tuner's costs are measured once and cached in ``--costs`` (reused by later runs).
"Predicted" is the tuner's sum of convolution-kernel and transform times for each
plan (for the uniform plans: the same costs summed over their layouts); "measured" is
the same sum from a per-launch profile of the package (host timer on the CPU, OpenCL
events on OpenCL). Not a test: the numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

import edgecv
from edgecv.bench.harness import alternate
from edgecv.bench.steps import profile_steps
from edgecv.deploy import deploy
from edgecv.frontend.mxnet.zoo import zoo_models
from edgecv.pipelines import BuildOptions

MODELS = list(zoo_models())  # the seven zoo models of edgecv/data/zoo.json
DEVICE_OF = {"cpu": None, "deeplens": "intel", "aisage": "pocl"}
LAYOUTS = ("NCHW", "packed", "auto")
CONV_OPS = {"conv2d", "conv2d_NCHWc", "depthwise_conv2d_NCHWc", "winograd_conv2d_NCHWc"}


def tuned_ms(model, x, repeat: int = 5) -> float:
    """Measured per-inference time of the kernels the tuner weighs (convolutions and
    layout transforms), from a per-launch profile."""
    total = 0.0
    for kernel in profile_steps(model, x, repeat):
        if CONV_OPS & set(kernel.ops) or any("layout_transform" in op for op in kernel.ops):
            total += kernel.seconds
    return total * 1e3


def run_one(name: str, profile: str, args, tmp: Path) -> dict | None:
    packages, facts, deploy_s = {}, {}, {}
    for layout in LAYOUTS:
        options = BuildOptions(layout=layout, layout_costs=args.costs / profile)
        started = time.perf_counter()
        try:
            packages[layout] = deploy(
                name,
                tmp / f"{name}-{profile}-{layout}",
                profile,
                pretrained=False,
                options=options,
                force=True,
            )
        except edgecv.EdgecvError as err:
            print(f"{name} {profile} {layout}: not deployed: {str(err).splitlines()[0][:120]}")
            return None
        deploy_s[layout] = time.perf_counter() - started
        manifest = json.loads((packages[layout] / "manifest.json").read_text())
        facts[layout] = manifest["build"].get("layouts", {})
    models = {k: edgecv.load(p, on=DEVICE_OF[profile]) for k, p in packages.items()}
    shape = next(iter(models.values())).input_shape
    x = np.random.RandomState(0).uniform(-1, 1, shape).astype(np.float32)
    timed = alternate({k: (lambda m=m: m.run(x)) for k, m in models.items()}, args.repeat, 2)
    latency = {k: t.median * 1e3 for k, t in timed.items()}
    measured = {k: tuned_ms(m, x) for k, m in models.items()}
    auto = facts["auto"]
    uniform = auto.get("uniform_predicted_s", {})
    packing = next((k for k in uniform if k != "NCHW"), None)
    predicted = {
        "NCHW": uniform.get("NCHW"),
        "packed": uniform.get(packing) if packing else None,
        "auto": auto.get("predicted_s"),
    }
    row = {
        "model": name,
        "profile": profile,
        "latency_ms": latency,
        "transforms": {k: facts[k].get("inserted_transforms", 0) for k in LAYOUTS},
        "predicted_ms": {k: v * 1e3 if v else None for k, v in predicted.items()},
        "measured_ms": measured,
        "solver": auto.get("solver", auto.get("reason", "")),
        "auto_layouts": _layout_counts(auto),
        "tuner_s": auto.get("seconds"),
        "deploy_s": deploy_s,
        "costs": auto.get("costs", {}),
    }
    _print_row(row)
    return row


def _layout_counts(auto: dict) -> str:
    counts: dict[str, int] = {}
    for conv in auto.get("convolutions", []):
        counts[conv["layout"]] = counts.get(conv["layout"], 0) + 1
    return " ".join(f"{n}x{k}" for k, n in sorted(counts.items()))


def _fmt(value: float | None) -> str:
    return f"{value:8.1f}" if value is not None else f"{'-':>8}"


def _print_row(row: dict) -> None:
    lat, pred, meas = row["latency_ms"], row["predicted_ms"], row["measured_ms"]
    best_uniform = min(lat["NCHW"], lat["packed"])
    print(
        f"{row['model']:<25}{row['profile']:<9}"
        + "".join(_fmt(lat[k]) for k in LAYOUTS)
        + f"{lat['NCHW'] / lat['auto']:>7.2f}x{best_uniform / lat['auto']:>7.2f}x"
        + "".join(f"{row['transforms'][k]:>5}" for k in ("packed", "auto"))
        + "".join(f"{_fmt(pred[k])}/{_fmt(meas[k]).strip():<7}" for k in LAYOUTS)
        + f"  {row['solver']} {row['auto_layouts']}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="*", default=MODELS)
    parser.add_argument("--profiles", nargs="*", default=["cpu", "deeplens"])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument(
        "--costs", type=Path, default=Path(tempfile.gettempdir()) / "edgecv-gt-costs"
    )
    parser.add_argument("--json", type=Path, help="write every row here")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    print(
        f"{'model':<25}{'profile':<9}{'NCHW':>8}{'packed':>8}{'auto':>8}{'vsNCHW':>8}"
        f"{'vsbest':>8}{'T.pk':>5}{'T.au':>5}   predicted/measured ms (NCHW, packed, auto)"
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgecv-gt-bench-") as tmp:
        for name in args.models:
            for profile in args.profiles:
                row = run_one(name, profile, args, Path(tmp))
                if row is not None:
                    rows.append(row)
                    if args.json:
                        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
