"""``edgecv bench PACKAGE``: latency percentiles, load time, memory, the kernels that
take the time, and baselines timed in alternating turns in the same process.

``--video FILE`` times frames end to end over a video file instead (:mod:`.video`).
``--streams N`` times throughput instead: the package loaded with N execution
contexts, N threads calling it at once, beside the baselines set up for N callers
(:mod:`.baselines`) and beside the same package with one context (what the streams
buy), in alternating rounds (:func:`.harness.alternate_concurrent`)."""

from __future__ import annotations

import json
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

from .. import __version__
from ..board import progress
from ..board.arguments import pin_argument
from ..board.errors import EdgecvError, foreign_message
from ..board.outputs import check_output_folder
from ..board.runtime.cpu import pool_threads
from .agreement import agreement
from .baselines import KNOWN
from .harness import TURN, alternate, alternate_concurrent
from .int8_baselines import calibration_set
from .lineup import build_baselines
from .source_model import source_files
from .steps import profile_steps


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def bench_input(model) -> np.ndarray:
    """A real photo (scikit-image's astronaut) preprocessed as the package says; seeded
    noise for models whose input is not a 3-channel image."""
    import skimage.data

    if len(model.input_shape) != 4 or model.input_shape[1] != 3:
        return np.random.RandomState(0).normal(size=model.input_shape).astype(np.float32)
    return model.preprocess(np.ascontiguousarray(skimage.data.astronaut()[:, :, ::-1]))


def cmd_bench(args) -> int:
    from ..board.model import load

    if args.video:  # end to end over a video file: its own runs and report
        from .video import cmd_bench_video

        return cmd_bench_video(args)
    wanted, streams = _check_arguments(args)
    rss_before = _peak_rss_mib()
    start = time.perf_counter()
    model = load(args.package, on=args.on, streams=streams or 1, sha256=args.sha256)
    load_s = time.perf_counter() - start
    model.require_one_input("bench")
    x = bench_input(model)
    ours = model.run(x)
    kernels = profile_steps(model, x, repeat=min(args.repeat, 10))
    rss_after = _peak_rss_mib()  # before any baseline is loaded into this process
    runners = {"edgecv": lambda: model.run(x)}
    callers: dict[str, list] = {"edgecv": [lambda: model.run(x)] * (streams or 1)}
    report = _report(args, model, x, load_s, rss_before, rss_after)
    if streams is not None:
        one = load(args.package, on=args.on, streams=1, sha256=args.sha256)
        callers["edgecv 1 stream"] = [lambda: one.run(x)] * streams
        report["runtimes"]["edgecv 1 stream"] = {"version": __version__, "load_s": load_s}
    with tempfile.TemporaryDirectory(prefix="edgecv-bench-") as tmp:
        if wanted:
            _add_baselines(wanted, args, model, x, ours, Path(tmp), report, runners, callers)
        _time_runtimes(args, runners, callers, report)
    report["kernels"] = [vars(k) for k in kernels]
    _write_report(args, report)
    return 0


def _check_arguments(args) -> tuple[list[str], int | None]:
    """The baselines ``--vs`` names and ``--streams``, refused before anything loads, as
    are result files that could not be written."""
    for path in (args.json, args.plot):
        if path:
            check_output_folder(path)
    if args.plot and not args.plot.endswith(".png"):
        raise EdgecvError(f"--plot {args.plot}: give a .png file")
    wanted = [n.strip() for n in (args.vs or "").split(",") if n.strip()]
    unknown = [n for n in wanted if n not in KNOWN]
    if unknown:
        raise EdgecvError(f"--vs: unknown baseline(s) {unknown}; known: {', '.join(KNOWN)}")
    streams = args.streams
    if streams is not None and streams < 1:
        raise EdgecvError(f"--streams {streams}: give how many callers at once, 1 or more")
    return wanted, streams


def _report(args, model, x: np.ndarray, load_s: float, rss_before: float, rss_after: float):
    """The report's facts of the package and this process, before any timing."""
    streams = args.streams
    return {
        "package": str(args.package),
        "model": model.manifest.model_name,
        "profile": model.manifest.profile_name,
        "device": getattr(model.executor.backend, "label", model.executor.backend.name),
        "input_shape": list(x.shape),
        "threads": pool_threads(),
        "precision": model.manifest.precision.value,
        "load_s": load_s,
        "peak_rss_mib": rss_after,
        "rss_growth_mib": rss_after - rss_before,
        "runtimes": {"edgecv": {"version": __version__, "load_s": load_s}},
        "not_run": {},
        "streams": streams,
    }


def _add_baselines(wanted, args, model, x, ours, work: Path, report, runners, callers) -> None:
    """The baselines ``--vs`` names, built from the package's source model, each checked
    against edgecv's outputs and added to the runtimes timed; one that cannot be built
    or run is listed under ``not_run`` with the reason."""
    streams = args.streams
    try:
        symbol, params = source_files(model.manifest, args.source, work)
    except EdgecvError as err:
        report["not_run"] = {name: str(err) for name in wanted}
        return
    progress.say(f"loading baselines: {', '.join(wanted)}")
    built, failed = build_baselines(
        wanted,
        symbol,
        params,
        tuple(x.shape),
        work,
        streams or 1,
        calibration=lambda: calibration_set(model),
    )
    report["not_run"] = failed
    detection = model.manifest.task == "detection"
    for b in built:
        try:  # one that loads but cannot run the input is listed, not fatal
            agree = agreement(ours, b.run(x), detection)
        except Exception as err:
            why = f"{type(err).__name__}: {foreign_message(err, 200)}"
            report["not_run"][b.name] = f"failed on the input: {why}"
            continue
        runners[b.name] = lambda b=b: b.run(x)
        callers[b.name] = [lambda f=f: f(x) for f in b.callers(streams or 1)]
        report["runtimes"][b.name] = {
            "version": b.version,
            "load_s": b.load_s,
            "agreement": agree,
            "notes": b.notes,
        }


def _time_runtimes(args, runners: dict, callers: dict, report: dict) -> None:
    """Latency in alternating turns, or with ``--streams`` throughput of N callers at
    once in alternating rounds; each runtime's numbers into the report."""
    streams = args.streams
    if streams is None:
        progress.say(f"timing {', '.join(runners)}: {args.repeat} runs each, in alternating turns")
        for name, t in alternate(runners, args.repeat, args.warmup).items():
            report["runtimes"][name].update(t.summary_ms())
        return
    rounds = -(-args.repeat // TURN)
    progress.say(
        f"timing {', '.join(callers)} with {streams} callers at once: {rounds} rounds "
        f"of {TURN} calls a caller each, in alternating rounds"
    )
    for fn in (f for fns in callers.values() for f in fns[:1]):
        for _ in range(args.warmup):
            fn()
    for name, t in alternate_concurrent(callers, rounds, TURN).items():
        report["runtimes"][name].update(t.summary())


def _write_report(args, report: dict) -> None:
    """The report printed, and written as JSON (``--json``) and a chart (``--plot``)."""
    from .report import plot, print_report, print_throughput_report

    if args.streams is None:
        print_report(report, top=args.top)
    else:
        print_throughput_report(report, top=args.top)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    if args.plot:
        plot(report, args.plot)
        print(f"wrote {args.plot}")


def add_parser(sub, common) -> None:
    """Register ``bench`` on the CLI's subparsers."""
    b = sub.add_parser("bench", parents=[common], help="time a package, against baselines")
    b.add_argument("package", help="package folder or .tar.gz")
    pin_argument(b)
    b.add_argument("--on", help="OpenCL device: part of its platform/device name")
    b.add_argument("--repeat", type=int, default=50, help="timed runs of each runtime")
    b.add_argument("--warmup", type=int, default=3, help="untimed runs of each first")
    b.add_argument("--vs", help=f"baselines, comma-separated: {','.join(KNOWN)}")
    b.add_argument(
        "--source", help="the source model's .onnx file, or its *-symbol.json (params beside it)"
    )
    b.add_argument("--json", help="write every number to this JSON file")
    b.add_argument("--plot", help="write a latency chart to this .png (needs matplotlib)")
    b.add_argument("--top", type=int, default=10, help="kernels listed in the profile")
    b.add_argument(
        "--streams",
        type=int,
        help="time throughput with N callers at once: the package loaded with N streams, "
        "OpenVINO's THROUGHPUT hint, ONNX Runtime with N callers",
    )
    b.add_argument(
        "--video",
        metavar="FILE",
        help="frames/s and latency end to end over this video file (decode included), "
        "pipelined and sequential, beside the model alone with the same --streams",
    )
    b.set_defaults(func=cmd_bench)
