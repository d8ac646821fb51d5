"""Coverage of the GluonCV model zoo: which models import, compile, match MXNet, and how fast.

For every name of ``gluoncv.model_zoo.get_model_list()`` (video/action models are
skipped: out of scope, see ``edgecv/data/zoo_families.json``) the model is built
offline with seeded random weights (``pretrained=False``, ``pretrained_base=False``
where accepted), exported, imported with edgecv and, with ``--deploy PROFILE``,
deployed, run on a photo and compared with MXNet's own forward pass (tolerances from
:mod:`edgecv.testing`). Each model runs in its own subprocess, so a hang or a crash
costs that model its ``--timeout`` and nothing else.

    python benchmarks/zoo_coverage.py --import-only                 # the whole zoo
    python benchmarks/zoo_coverage.py --deploy cpu --families ssd,pose --limit 2
    python benchmarks/zoo_coverage.py --deploy aisage --on pocl --models mobilenet1.0

A GPU profile's package is built with its CPU part for this machine (``--host native``)
and run on the OpenCL device ``--on`` names (PoCL stands in for aisage's Mali).

Writes ``<out>.csv`` (one row per model) and ``<out>.md`` (the per-family summary,
then the failures). ``--import-only`` keeps each exported graph (symbol and parameter
shapes, not values) under ``--cache``, so a second run only imports; with
``--compare-with DIR`` each graph is also imported with the edgecv package found in
``DIR`` (an older checkout: a before/after comparison on the same graphs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from zoo_coverage_tables import STAGES, write_tables
from zoo_probe import PROBES, apply_probe_verdict

ROOT = Path(__file__).resolve().parent.parent


def _first_line(err: BaseException) -> str:
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    first = lines[0] if lines else ""
    # the unsupported-ops message goes on to list every supported op: not table material
    return f"{type(err).__name__}: {first.split(' Supported MXNet ops:')[0]}"[:300]


# -- worker side: one model, one stage group, in its own process ------------------------


def _export(name: str, cache: Path, import_only: bool, seed: int) -> dict:
    """Export ``name`` (or reuse the cache); returns the meta record."""
    import warnings

    from edgecv.frontend.mxnet import zoo

    meta_path = cache / name / "meta.json"
    if import_only and meta_path.is_file():
        return json.loads(meta_path.read_text())
    if import_only:
        meta = _export_graph_only(name, cache / name, seed)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the loud random-weights warning, once per model
            exported = zoo.export(name, cache / name, pretrained=False, seed=seed)
        meta = {
            "symbol": str(exported.symbol_path),
            "params": str(exported.params_path),
            "inputs": {k: list(v) for k, v in exported.input_shapes.items()},
        }
    meta_path.write_text(json.dumps(meta))
    return meta


def _export_graph_only(name: str, out: Path, seed: int) -> dict:
    """The graph and its parameters' shapes, not their values: what decides whether a
    model imports, without writing the zoo's tens of GB of parameters. Built as
    :func:`edgecv.frontend.mxnet.zoo.export` builds it (one imperative forward first)."""
    from edgecv._mxnet import import_mxnet
    from edgecv.frontend.mxnet import zoo

    mx = import_mxnet()
    model = zoo.resolve(name)
    net = zoo.build_net(model)
    shapes = zoo.input_shapes_of(model, net, None)
    mx.random.seed(seed)
    net.initialize(mx.init.Uniform(0.05), force_reinit=True)
    net(*[mx.nd.zeros(s) for s in shapes.values()])
    net.hybridize()
    net(*[mx.nd.zeros(s) for s in shapes.values()])
    out.mkdir(parents=True, exist_ok=True)
    symbol = out / f"{name}-symbol.json"
    symbol.write_text(net._cached_graph[1].tojson())  # what HybridBlock.export writes
    params = {
        p.name: [list(p.shape), str(np.dtype(p.dtype))] for p in net.collect_params().values()
    }
    return {
        "symbol": str(symbol),
        "params": None,
        "inputs": {k: list(v) for k, v in zoo.graph_input_names(shapes).items()},
        "param_shapes": params,
    }


def _import(meta: dict):
    from edgecv.frontend.mxnet.importer import from_mxnet
    from edgecv.frontend.mxnet.mxnet_graph import load_params, load_symbol

    graph = load_symbol(meta["symbol"])
    if meta.get("params"):
        params = load_params(meta["params"])
    else:
        rng = np.random.RandomState(0)
        params = {
            k: rng.uniform(0.5, 1.5, s).astype(d) for k, (s, d) in meta["param_shapes"].items()
        }
    shapes = {k: tuple(v) for k, v in meta["inputs"].items()}
    return from_mxnet(graph, params, shapes)


def _deploy_and_compare(
    meta: dict, profile: str, record: dict, seed: int, on: str | None = None, layout=None
) -> None:
    import numpy as np

    import edgecv
    from edgecv.deploy import deploy
    from edgecv.frontend.mxnet.random_weights import example_input
    from edgecv.pipelines import BuildOptions
    from edgecv.testing import compare_with_mxnet

    shapes = {name: tuple(s) for name, s in meta["inputs"].items()}
    shape = next(iter(shapes.values()))
    with tempfile.TemporaryDirectory(prefix="zoo-coverage-") as tmp:
        t = time.perf_counter()
        path = deploy(
            meta["symbol"],
            Path(tmp) / "pkg",
            profile=profile,
            params=meta["params"],
            input_shape=shapes if len(shapes) > 1 else shape,
            pretrained=False,
            host=None if profile == "cpu" else "native",  # its CPU part runs here
            options=BuildOptions(layout=layout) if layout else None,
        )
        record["compile_s"] = round(time.perf_counter() - t, 1)
        record["compile"] = "ok"
        model = edgecv.load(path, on=on)
        xs = [example_input(s, seed + i) for i, s in enumerate(shapes.values())]
        ours = model.run(*xs)
        times = []
        for _ in range(5):
            t = time.perf_counter()
            model.run(*xs)
            times.append(time.perf_counter() - t)
        record["latency_ms"] = round(1000 * float(np.median(times)), 2)
    inputs = dict(zip(shapes, xs, strict=True))
    compared = compare_with_mxnet(ours, meta["symbol"], meta["params"], inputs)
    record["loosen"] = round(compared["loosen"], 1)
    if compared.get("cut_tie_rows"):
        record["cut_tie_rows"] = compared["cut_tie_rows"]  # compared by score only
    record["parity"] = "ok"


def worker(args: argparse.Namespace) -> None:
    """Export, import (and deploy) one model; the record is rewritten after each stage,
    so the parent sees how far a model got even when the process is killed."""
    out = Path(args.record)
    record: dict = {}

    def save():
        out.write_text(json.dumps(record))

    stage = "build"
    try:
        t = time.perf_counter()
        meta = _export(args.worker, Path(args.cache), args.import_only, args.seed)
        record.update(build="ok", build_s=round(time.perf_counter() - t, 1), meta=meta)
        save()
        stage = "import"
        t = time.perf_counter()
        _import(meta)
        record.update({"import": "ok", "import_s": round(time.perf_counter() - t, 1)})
        save()
        if args.deploy:
            stage = "compile"
            _deploy_and_compare(meta, args.deploy, record, args.seed, args.on, args.layout)
            save()
    except BaseException as err:  # report every failure kind as this model's row
        if stage == "compile" and record.get("compile") == "ok":
            stage = "parity"  # it compiled and ran: the comparison failed
        record[stage] = "fail"
        record["error"] = _first_line(err)
        save()
        raise SystemExit(1) from None


def baseline_worker(args: argparse.Namespace) -> None:
    """Import every cached graph named in ``args.baseline`` with the edgecv on the path
    (an older checkout); results are appended one JSON line per model."""
    names = json.loads(Path(args.baseline).read_text())
    with open(args.record, "a") as out:
        for name in names:
            meta = json.loads((Path(args.cache) / name / "meta.json").read_text())
            try:
                _import(meta)
                result = {"model": name, "import_before": "ok"}
            except Exception as err:
                result = {"model": name, "import_before": "fail", "error_before": _first_line(err)}
            out.write(json.dumps(result) + "\n")
            out.flush()


def compare_with(rows: list[dict], args) -> None:
    """Fill ``import_before`` of every built row: one process, the old edgecv's import."""
    built = [r["model"] for r in rows if r.get("build") == "ok"]
    with tempfile.TemporaryDirectory(prefix="zoo-cov-") as tmp:
        names, results = Path(tmp) / "names.json", Path(tmp) / "results.jsonl"
        names.write_text(json.dumps(built))
        env = dict(os.environ, PYTHONPATH=args.compare_with)
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--baseline",
            str(names),
            "--record",
            str(results),
            "--cache",
            str(args.cache),
        ]
        subprocess.run(cmd, env=env, timeout=args.timeout * max(1, len(built)), check=False)
        done = {}
        if results.is_file():
            done = {r["model"]: r for r in map(json.loads, results.read_text().splitlines())}
    for row in rows:
        if row["model"] in done:
            row.update(done[row["model"]])
        elif row.get("build") == "ok":
            row.update(import_before="fail", error_before="the baseline import process died")


# -- parent side ------------------------------------------------------------------------


def _run_model(name: str, args, record_path: Path) -> str | None:
    """Run the worker of ``name`` in a subprocess; a timeout or crash message, or None."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        name,
        "--record",
        str(record_path),
        "--cache",
        str(args.cache),
        "--seed",
        str(args.seed),
    ]
    if args.import_only:
        cmd.append("--import-only")
    if args.deploy:
        cmd += ["--deploy", args.deploy]
    if args.on:
        cmd += ["--on", args.on]
    if args.layout:
        cmd += ["--layout", args.layout]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return f"timeout after {args.timeout} s"
    if proc.returncode not in (0, 1):
        tail = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-1:] or [""]
        return f"crashed (exit {proc.returncode}): {tail[0][:200]}"
    return None


def sweep_one(name: str, family: str, args) -> dict:
    with tempfile.TemporaryDirectory(prefix="zoo-cov-") as tmp:
        record_path = Path(tmp) / "record.json"
        if not args.import_only:
            args.cache = Path(tmp) / "export"  # a deployed model's parameters are needed
        problem = _run_model(name, args, record_path)
        record = json.loads(record_path.read_text()) if record_path.is_file() else {}
        if problem is not None:
            failed = next((s for s in STAGES if s not in record), "build")
            record[failed] = "fail"
            record["error"] = problem
    record.pop("meta", None)
    return {"model": name, "family": family, **record}


def _earlier_rows(out: Path) -> list[dict]:
    """The rows of an earlier run's CSV (a long sweep continues across sessions)."""
    import csv

    path = out.with_suffix(".csv")
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return [{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", help="comma-separated families (ssd,rcnn,...)")
    parser.add_argument("--models", help="comma-separated model names")
    parser.add_argument("--limit", type=int, help="at most this many models per family")
    parser.add_argument("--import-only", action="store_true", help="stop after the import")
    parser.add_argument("--deploy", metavar="PROFILE", help="deploy, run, compare (e.g. cpu)")
    parser.add_argument("--on", help="OpenCL device of a GPU profile's packages (intel, pocl)")
    parser.add_argument(
        "--layout", choices=("auto", "NCHW", "packed"), help="deploy's --layout (default: auto)"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per model stage")
    parser.add_argument("--out", type=Path, default=Path("zoo_coverage"))
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "zoo-cache")
    parser.add_argument(
        "--compare-with", metavar="DIR", help="also import with the edgecv package in DIR"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--probes",
        type=Path,
        default=PROBES,
        help="zoo_probe.py's verdicts: a mismatch the probe proved a tie counts as parity=tie",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the rows of an earlier run's <out>.csv and sweep only the models it lacks",
    )
    parser.add_argument(
        "--retry-failed",
        action="store_true",
        help="with --resume: sweep again the models that failed at any stage",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--baseline", help=argparse.SUPPRESS)
    parser.add_argument("--record", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.baseline:
        return baseline_worker(args)
    if not args.import_only and not args.deploy:
        parser.error("give --import-only or --deploy PROFILE")
    sys.path.insert(0, str(ROOT))
    from edgecv.frontend.mxnet import zoo

    names = args.models.split(",") if args.models else zoo.gluoncv_names()
    wanted = set(args.families.split(",")) if args.families else None
    per_family: dict[str, int] = {}
    rows = _earlier_rows(args.out) if args.resume else []
    if args.retry_failed:
        rows = [r for r in rows if r.get("build") == "skipped" or r.get("parity") in ("ok", "tie")]
    done = {r["model"] for r in rows}
    for name in names:
        if name in done:
            continue
        rule = zoo.family_of(name)
        if wanted and rule.family not in wanted:
            continue
        if rule.skip:
            rows.append(
                {"model": name, "family": rule.family, "build": "skipped", "error": rule.skip}
            )
            continue
        if args.limit and per_family.get(rule.family, 0) >= args.limit:
            continue
        per_family[rule.family] = per_family.get(rule.family, 0) + 1
        t = time.perf_counter()
        row = sweep_one(name, rule.family, args)
        if args.deploy:
            apply_probe_verdict(row, args.probes, args.seed, args.deploy)
        rows.append(row)
        status = " ".join(f"{s}={row[s]}" for s in STAGES if s in row)
        print(
            f"{name:50s} {status} ({time.perf_counter() - t:.0f} s) {row.get('error', '')}",
            flush=True,
        )
        write_tables(rows, args.out, args.import_only)
    if args.compare_with:
        compare_with(rows, args)
    write_tables(rows, args.out, args.import_only)
    print(f"wrote {args.out.with_suffix('.csv')} and {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
