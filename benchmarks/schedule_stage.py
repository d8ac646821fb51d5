"""Deploy time and latency of every zoo model for `cpu`, `deeplens` (on Intel's CPU
OpenCL runtime) and `aisage` (on PoCL), with the OpenCL / CPU latency ratio.

    python benchmarks/schedule_stage.py                        # the seven zoo models
    python benchmarks/schedule_stage.py mobilenet1.0 --repeat 5 --profiles cpu deeplens

Each model is deployed once per profile (seeded random weights), its packages loaded in
one process and run alternately (median of ``--repeat`` runs after a warm-up), the
`cpu` package first. The rule counts of each package's schedules are printed too, so a
kernel that needed the safe rule shows. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from fallback_overhead import alternating_medians

import edgecv
from edgecv.deploy import deploy
from edgecv.frontend.zoo import zoo_models

MODELS = list(zoo_models())  # the seven models with aliases (edgecv/data/zoo.json)
DEVICE_OF = {"cpu": None, "deeplens": "intel", "aisage": "pocl"}


def rules_of(path: Path) -> str:
    schedules = json.loads((path / "manifest.json").read_text())["build"].get("schedules", {})
    return "; ".join(
        f"{device}: "
        + ", ".join(f"{rule.split('.')[-1]} {n}" for rule, n in facts["rules"].items())
        for device, facts in schedules.items()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="*", default=MODELS)
    parser.add_argument("--profiles", nargs="*", default=list(DEVICE_OF))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    print(f"{'model':<26}{'profile':<10}{'deploy s':>9}{'latency ms':>12}{'x cpu':>8}  rules")
    with tempfile.TemporaryDirectory(prefix="edgecv-bench-") as tmp:
        for name in args.models:
            packages, deploy_s, models = {}, {}, {}
            for profile in args.profiles:
                started = time.perf_counter()
                try:
                    packages[profile] = deploy(name, Path(tmp) / f"{name}-{profile}", profile,
                                               pretrained=False)  # fmt: skip
                except edgecv.EdgecvError as err:
                    print(f"{name:<26}{profile:<10}  not deployed: {str(err).splitlines()[0][:90]}")
                    continue
                deploy_s[profile] = time.perf_counter() - started
                models[profile] = edgecv.load(packages[profile], on=DEVICE_OF[profile])
            if not models:
                continue
            first = next(iter(models.values()))
            x = np.random.RandomState(0).uniform(-1, 1, first.input_shape).astype(np.float32)
            times = dict(zip(models, alternating_medians(list(models.values()), x, args.repeat),
                             strict=True))  # fmt: skip
            for profile, seconds in times.items():
                ratio = f"{seconds / times['cpu']:>7.1f}x" if "cpu" in times else f"{'-':>8}"
                print(f"{name:<26}{profile:<10}{deploy_s[profile]:>9.1f}{seconds * 1e3:>12.1f}"
                      f"{ratio}  {rules_of(packages[profile])}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
