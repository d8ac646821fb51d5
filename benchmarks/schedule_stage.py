"""Deploy time and latency of every zoo model for `cpu`, `deeplens` (on Intel's CPU
OpenCL runtime) and `aisage` (on PoCL), with the OpenCL / CPU latency ratio.

    python benchmarks/schedule_stage.py                        # the seven zoo models
    python benchmarks/schedule_stage.py mobilenet1.0 --repeat 5 --profiles cpu deeplens
    python benchmarks/schedule_stage.py yolo3_mobilenet1.0_coco --top 8 --keep /tmp/pkgs

Each model is deployed once per profile (seeded random weights), its packages loaded in
one process and run alternately (median of ``--repeat`` runs after a warm-up), the
`cpu` package first. The rule counts of each package's schedules are printed too, so a
kernel that needed the safe rule shows; ``--top N`` adds each OpenCL package's N
slowest kernels (OpenCL event profiling), ``--keep DIR`` keeps the packages. Not a
test: numbers depend on the machine.
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
from edgecv.bench.harness import alternating_medians
from edgecv.bench.steps import profile_steps
from edgecv.deploy import deploy
from edgecv.frontend.mxnet.zoo import zoo_models

MODELS = list(zoo_models())  # the seven models with aliases (edgecv/data/zoo.json)
DEVICE_OF = {"cpu": None, "deeplens": "intel", "aisage": "pocl"}


def rules_of(path: Path) -> str:
    schedules = json.loads((path / "manifest.json").read_text())["build"].get("schedules", {})
    return "; ".join(
        f"{device}: "
        + ", ".join(f"{rule.split('.')[-1]} {n}" for rule, n in facts["rules"].items())
        for device, facts in schedules.items()
    )


def print_top_kernels(model, x: np.ndarray, top: int) -> None:
    """The ``top`` slowest kernels of one inference, with the rule that scheduled each."""
    schedules = model.manifest.schedules.get("gpu", {}).get("kernels", {})
    kernels = profile_steps(model, x, repeat=3)
    total = sum(k.seconds for k in kernels) or 1.0
    for k in kernels[:top]:
        rule = schedules.get(k.kernel, {}).get("rule") or "-"
        print(
            f"    {k.seconds * 1e3:8.2f} ms {100 * k.seconds / total:5.1f}% {k.device:<4} "
            f"x{k.launches:<3} {k.kernel[:44]:<44} {rule}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="*", default=MODELS)
    parser.add_argument("--profiles", nargs="*", default=list(DEVICE_OF))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--top", type=int, default=0, help="slowest OpenCL kernels to list")
    parser.add_argument("--keep", type=Path, help="deploy into this folder and keep")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    print(f"{'model':<26}{'profile':<10}{'deploy s':>9}{'latency ms':>12}{'x cpu':>8}  rules")
    with tempfile.TemporaryDirectory(prefix="edgecv-bench-") as tmp:
        tmp = args.keep or tmp
        for name in args.models:
            packages, deploy_s, models = {}, {}, {}
            for profile in args.profiles:
                started = time.perf_counter()
                try:
                    packages[profile] = deploy(
                        name, Path(tmp) / f"{name}-{profile}", profile, pretrained=False
                    )
                except edgecv.EdgecvError as err:
                    print(f"{name:<26}{profile:<10}  not deployed: {str(err).splitlines()[0][:90]}")
                    continue
                deploy_s[profile] = time.perf_counter() - started
                models[profile] = edgecv.load(packages[profile], on=DEVICE_OF[profile])
            if not models:
                continue
            first = next(iter(models.values()))
            x = np.random.RandomState(0).uniform(-1, 1, first.input_shape).astype(np.float32)
            runs = [lambda m=m, x=x: m.run(x) for m in models.values()]
            times = dict(zip(models, alternating_medians(runs, args.repeat), strict=True))
            for profile, seconds in times.items():
                ratio = f"{seconds / times['cpu']:>7.1f}x" if "cpu" in times else f"{'-':>8}"
                print(
                    f"{name:<26}{profile:<10}{deploy_s[profile]:>9.1f}{seconds * 1e3:>12.1f}"
                    f"{ratio}  {rules_of(packages[profile])}",
                    flush=True,
                )
                if args.top and profile != "cpu":
                    print_top_kernels(models[profile], x, args.top)


if __name__ == "__main__":
    main()
