"""The paper's Table 5 on our devices: default vs tuned latency per model and device.

For each model and profile, two packages are deployed from the same weights: one with
the default schedules only (``--no-tuning``) and one reading the tuning databases
(the shipped database of the profile's device class, or ``--db``). Both run in this
process in alternating runs (``edgecv.bench.harness``); the table gives the medians,
the ratio, how many kernels took a tuned record, and the tuning time the logs of
``benchmarks/tune_shipped.sh`` recorded. ``cpu`` rows add MXNet, ONNX Runtime and
OpenVINO FP32 (the baselines of ``edgecv bench --vs``) to the same alternation. Each
device's rows are measured in a process of their own.

    python benchmarks/tuning_table5.py --models mobilenet1.0,squeezenet1.0 \
        --devices cpu,deeplens:intel,aisage:pocl --times /tmp/edgecv-tune-logs/times.txt
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from edgecv.bench.command import bench_input, source_files
from edgecv.bench.harness import alternate
from edgecv.bench.lineup import build_baselines
from edgecv.board.model import load
from edgecv.deploy import deploy
from edgecv.pipelines import BuildOptions
from edgecv.profiles import load_profile
from edgecv.schedules.device_class import tuning_folders


def tuning_minutes(times: Path | None) -> dict[tuple[str, str], float]:
    """(model, device) -> minutes, from tune_shipped.sh's ``times.txt`` (summed over runs)."""
    found: dict[tuple[str, str], float] = {}
    if times is None or not times.is_file():
        return found
    for line in times.read_text().splitlines():
        m = re.match(r"\S+ done (\S+) (\S+) exit \d+ (\d+) s", line)
        if m:
            key = (m.group(1), m.group(2))
            found[key] = found.get(key, 0.0) + int(m.group(3)) / 60
    return found


def tuned_kernels(package: Path) -> tuple[int, int]:
    schedules = json.loads((package / "manifest.json").read_text())["build"]["schedules"]
    kernels = [k for facts in schedules.values() for k in facts["kernels"].values()]
    return sum(k["rule"] == "tuned" for k in kernels), len(kernels)


def row(
    model: str,
    device: str,
    on: str | None,
    db: str | None,
    repeat: int,
    work: Path,
    baselines: list[str],
) -> dict:
    folders = tuning_folders(load_profile(device), db)
    common = dict(profile=device, pretrained=False, host="native", force=True)
    # checked and layouts measured on the device the rows run on, as `tune --on` tuned
    # them: layouts measured on another device are another plan, with other kernels
    check = on or "auto"
    default = deploy(
        model,
        work / f"{model}-{device}-default",
        options=BuildOptions(tuning=None, check_on=check),
        **common,
    )
    tuned = deploy(
        model,
        work / f"{model}-{device}-tuned",
        options=BuildOptions(tuning=folders, check_on=check),
        **common,
    )
    a, b = load(default, on=on), load(tuned, on=on)
    x = bench_input(a)
    runners = {"default": lambda: a.run(x), "tuned": lambda: b.run(x)}
    if baselines and device == "cpu":
        symbol, params = source_files(a.manifest, None, work)
        built, failed = build_baselines(baselines, symbol, params, tuple(x.shape), work)
        for base in built:
            runners[base.name] = lambda base=base: base.run(x)
    timed = alternate(runners, repeat, warmup=3)
    out = {name: t.median * 1e3 for name, t in timed.items()}
    out["tuned_kernels"], out["kernels"] = tuned_kernels(tuned)
    return out


def measure(args, spec: str) -> list[dict]:
    """The rows of one device, in this process."""
    minutes = tuning_minutes(args.times)
    baselines = [b for b in args.baselines.split(",") if b]
    device, _, on = spec.partition(":")
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgecv-table5-") as tmp:
        for model in args.models.split(","):
            r = row(model, device, on or None, args.db, args.repeat, Path(tmp), baselines)
            r.update(model=model, device=spec, tuning_min=minutes.get((model, device)))
            rows.append(r)
            print(json.dumps(r), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mobilenet1.0,resnet50_v1,squeezenet1.0")
    parser.add_argument(
        "--devices",
        default="cpu,deeplens:intel,aisage:pocl",
        help="profile[:opencl device], comma-separated",
    )
    parser.add_argument("--db", help="a database folder layered over the shipped ones")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--baselines", default="mxnet,onnxruntime,openvino")
    parser.add_argument("--times", type=Path, help="tune_shipped.sh's times.txt")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    specs = args.devices.split(",")
    rows = []
    if len(specs) == 1:
        rows = measure(args, specs[0])
    else:
        # One process per device: an OpenCL runtime's worker threads, once started, slow
        # the CPU packages timed after them in the same process (squeezenet1.0's cpu
        # package 4.2 ms there, 2.7 in a process of its own, 2 cores).
        passed = [
            "--models",
            args.models,
            "--repeat",
            str(args.repeat),
            "--baselines",
            args.baselines,
        ]
        passed += ["--db", args.db] if args.db else []
        passed += ["--times", str(args.times)] if args.times else []
        for spec in specs:
            with tempfile.TemporaryDirectory(prefix="edgecv-table5-") as tmp:
                out = Path(tmp) / "rows.json"
                command = [sys.executable, __file__, "--devices", spec, "--json", str(out)]
                subprocess.run(command + passed, check=True)
                rows += json.loads(out.read_text())
    print(
        "\n| model | device | default ms | tuned ms | speedup | tuned kernels | tuning min "
        "| MXNet ms | ORT ms | OpenVINO f32 ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        extra = " | ".join(
            f"{r[k]:.2f}" if k in r else "-" for k in ("mxnet", "onnxruntime", "openvino")
        )
        spent = f"{r['tuning_min']:.0f}" if r["tuning_min"] else "-"
        print(
            f"| {r['model']} | {r['device']} | {r['default']:.2f} | {r['tuned']:.2f} | "
            f"{r['default'] / r['tuned']:.2f}x | {r['tuned_kernels']}/{r['kernels']} | "
            f"{spent} | {extra} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
