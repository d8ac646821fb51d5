"""First deploy on a fresh machine: time to a package with nothing shipped and an empty
cache, and that package's latency against a build whose layouts were fully measured.

Per model and profile (zoo models with ``--random-weights``: seeded, no pretrained weights
reachable; users' models with the weights they were exported with):

1. ``edgecv deploy`` in a subprocess with an empty ``EDGECV_CACHE_DIR`` (in a folder of
   its own, so no measurement of another row's is read) and
   ``--no-tuning`` (no shipped database or layout costs is read: a machine kind with
   nothing shipped), the default ``--layout-budget``, ``--on`` the device of
   ``PROFILE:DEVICE`` (layout costs are measured where the package is timed); its wall
   time (the goal: 240 s on 2 cores) and where its layout costs came from (measured,
   predicted);
2. the same deploy again with ``--layout-budget none`` on the same cache: the costs the
   first left unmeasured are measured, so its layouts are the fully measured plan;
3. both packages loaded in this process and timed in alternating turns
   (:func:`edgecv.bench.harness.alternate`), half of them in each order: the first
   deploy's package may be at most 1.05x slower. ``plan_differs`` counts the
   convolutions whose layout or algorithm the two plans chose differently, and
   ``same_code`` says whether the two packages are the same bytes but their manifests:
   then the ratio is the measurement's noise (two copies of one sub-millisecond CPU
   package measured 1.11x apart in one process, 2026-11-27).

``--keep DIR`` keeps each row's packages, cache and progress logs (``first.log``,
``full.log``: each line with the seconds since the deploy started).

    python benchmarks/first_deploy.py --models ssd_512_resnet50_v1_voc --devices deeplens:intel
    python benchmarks/first_deploy.py --json rows.json       # the seven zoo models x 3
    python benchmarks/first_deploy.py --models users         # users' models x 3

Users' models (``tiny_yolo``, ``efficient_lite``, ``digits``; ``users`` names all three)
are the Gluon models of ``tests/user_models.py`` and ``tests/digits.py``: exported by
the user with their own weights (the digits classifier trained here first), deployed
from their ``-symbol.json`` with ``--params`` and ``--input-shape``.

Not a test: the times vary with the machine and its load.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import edgecv
from edgecv.bench.harness import alternate
from edgecv.frontend.mxnet.zoo import zoo_models

ZOO = tuple(zoo_models())  # the seven zoo models of edgecv/data/zoo.json
USERS = ("tiny_yolo", "efficient_lite", "digits")
DEVICES = ("cpu", "deeplens:intel", "aisage:portable")
TESTS = Path(__file__).resolve().parent.parent / "tests"


def export_user_model(name: str, folder: Path) -> list[str]:
    """Export one of the tests' users' models; the ``deploy`` arguments that name it."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    from digits import train_digits
    from user_models import efficient_lite, tiny_yolo

    if name == "digits":
        trained = train_digits(folder / name)
        symbol, params, shape = trained.symbol, trained.params, trained.input_shape
    else:
        symbol, params, shape = {"tiny_yolo": tiny_yolo, "efficient_lite": efficient_lite}[name](
            folder / name
        )
    return [str(symbol), "--params", str(params), "--input-shape", ",".join(map(str, shape))]


def deploy(
    model: list[str], profile: str, on: str, out: Path, cache: Path, budget: str | None
) -> dict:
    """One ``edgecv deploy`` in a subprocess (``--on`` the device its package is timed
    on); its wall time and layout facts. Its progress lines go to ``OUT.log``, each with
    the seconds since the start."""
    command = [sys.executable, "-m", "edgecv.cli", "deploy", *model, "--device", profile]
    command += ["--no-tuning", "-o", str(out), "--force"] + (["--on", on] if on else [])
    if budget is not None:
        command += ["--layout-budget", budget]
    env = dict(os.environ, EDGECV_CACHE_DIR=str(cache), EDGECV_PROGRESS="0")
    log = out.with_suffix(".log")
    started = time.perf_counter()
    with (
        subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        ) as child,
        log.open("w") as f,
    ):
        for line in child.stderr:
            f.write(f"{time.perf_counter() - started:7.1f} {line}")
    seconds = time.perf_counter() - started
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{log.read_text()[-2000:]}")
    layouts = json.loads((out / "manifest.json").read_text())["build"].get("layouts", {})
    return {
        "seconds": round(seconds, 1),
        "costs": layouts.get("costs", {}),
        "layout_s": layouts.get("seconds"),
    }


def same_code(a: Path, b: Path) -> bool:
    """Whether two packages hold the same files, byte for byte, but their manifests
    (which differ in build times): then their latency ratio is the measurement's noise."""
    files = sorted(str(f.relative_to(a)) for f in a.rglob("*") if f.is_file())
    if files != sorted(str(f.relative_to(b)) for f in b.rglob("*") if f.is_file()):
        return False
    compared = [f for f in files if Path(f).name != "manifest.json"]
    _, differ, errors = filecmp.cmpfiles(a, b, compared, shallow=False)
    return not differ and not errors


def plan_of(package: Path) -> dict[str, tuple[str, int | None]]:
    """Each convolution's (layout, Winograd tile side or None) in a package's plan."""
    layouts = json.loads((package / "manifest.json").read_text())["build"]["layouts"]
    sides = {c: w["side"] for w in layouts.get("winograd", []) for c in w["convolutions"]}
    return {c["name"]: (c["layout"], sides.get(c["name"])) for c in layouts["convolutions"]}


def measure(model: str, device: str, repeat: int, work: Path) -> dict:
    profile, _, on = device.partition(":")
    # A fresh machine per model and profile: the user's databases and layout costs
    # live beside the kernel cache (``$EDGECV_CACHE_DIR/../tuning``), so each row gets
    # its own parent folder; a shared one would hand one model's measurements to the next.
    home = work / f"{model}-{profile}"
    if home.exists():
        raise SystemExit(f"{home} exists: a first deploy needs an empty cache (a new --keep)")
    home.mkdir(parents=True)
    cache = home / "kernels"
    first_pkg, full_pkg = home / "first", home / "full"
    if model in USERS:
        named = export_user_model(model, home / "exported")
    else:
        named = [model, "--random-weights"]
    row = {"model": model, "device": device}
    row["first"] = deploy(named, profile, on, first_pkg, cache, None)
    row["full"] = deploy(named, profile, on, full_pkg, cache, "none")
    loaded = {
        "first": edgecv.load(first_pkg, on=on or None),
        "full": edgecv.load(full_pkg, on=on or None),
    }
    first_plan, full_plan = plan_of(first_pkg), plan_of(full_pkg)
    row["plan_differs"] = sum(first_plan[c] != full_plan.get(c) for c in first_plan)
    row["same_code"] = same_code(first_pkg, full_pkg)
    shape = loaded["first"].input_shape
    x = np.random.RandomState(0).normal(size=shape).astype(np.float32)
    runs = {k: (lambda m=m: m.run(x)) for k, m in loaded.items()}
    # half the turns in each order: whichever runs right after the other in a turn
    # measured up to 4% apart with the same plan (2026-11-27)
    forward = alternate(runs, (repeat + 1) // 2, turn=1)
    backward = alternate(dict(reversed(runs.items())), repeat // 2 or 1, turn=1)
    medians = {k: float(np.median(np.r_[forward[k].seconds, backward[k].seconds])) for k in runs}
    row["latency_ms"] = {k: round(t * 1e3, 3) for k, t in medians.items()}
    row["first_vs_full"] = round(medians["first"] / medians["full"], 3)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(ZOO))
    parser.add_argument("--devices", default=",".join(DEVICES))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", type=Path, help="append each row here as a JSON line")
    parser.add_argument(
        "--keep", type=Path, help="work here and keep it: packages, caches, progress logs"
    )
    args = parser.parse_args()
    models = args.models.replace("users", ",".join(USERS)).split(",")
    with tempfile.TemporaryDirectory(prefix="edgecv-first-deploy-") as tmp:
        work = args.keep or Path(tmp)
        for device in args.devices.split(","):
            for model in models:
                try:
                    row = measure(model, device, args.repeat, work)
                except RuntimeError as err:
                    row = {"model": model, "device": device, "error": str(err)[-500:]}
                print(json.dumps(row), flush=True)
                if args.json:
                    with args.json.open("a") as f:
                        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
