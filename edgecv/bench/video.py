"""``edgecv bench PACKAGE --video FILE``: frames per second and latency end to end over a
real video file, decode included, beside the model alone with the same streams.

Three runs take turns over the whole file (a pass each, A, B, C, A, B, C, ... so a
change of the machine's load hits each alike): the pipeline of :mod:`edgecv.board.video`
with ``--streams`` inferences in flight; the sequential loop (decode, preprocess, infer,
postprocess one frame after another); and the model alone, ``--streams`` callers
running the file's frames, preprocessed beforehand, as fast as it takes them; with
``--vs openvino`` a fourth, OpenVINO's async infer requests on the same frames
(:mod:`.openvino_video`). Each
run's frames/s is the median pass's; latencies are every frame's (the pipeline's and the
loop's from the start of a frame's decode to the end of its postprocess, the model's a
call's).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np

from ..board import progress
from ..board.errors import EdgecvError
from ..board.frames import open_source
from ..board.outputs import check_output_folder
from ..board.video import video
from .harness import alternate_concurrent

RUNS = ("pipelined", "sequential", "model alone")
OPENVINO = "openvino async"


def check_video_arguments(args) -> int:
    """What ``--video`` cannot take, refused before anything loads; the streams."""
    if not Path(args.video).is_file():
        raise EdgecvError(f"--video {args.video} does not exist; give a video file")
    if args.plot:
        raise EdgecvError("--plot with --video: not drawn for a video yet; use --json")
    wanted = [n.strip() for n in (args.vs or "").split(",") if n.strip()]
    if wanted not in ([], ["openvino"]):
        raise EdgecvError(
            f"--vs {args.vs} with --video: only openvino (its async infer requests) runs "
            "over a video; run the others without --video"
        )
    if args.json:
        check_output_folder(args.json)
    streams = args.streams or 1
    if streams < 1:
        raise EdgecvError(f"--streams {streams}: give how many inferences in flight, 1 or more")
    return streams


def cmd_bench_video(args) -> int:
    from ..board.model import load

    streams = check_video_arguments(args)
    model = load(args.package, on=args.on, streams=streams, sha256=args.sha256)
    model.require_one_input("bench")
    frames = list(open_source(args.video).frames())
    if not frames:
        raise EdgecvError(f"--video {args.video}: OpenCV read no frame of it")
    tensors = [model.preprocess(frame) for frame in frames]
    for x in tensors[: max(args.warmup, 1)]:
        model.run(x)
    passes = max(1, -(-args.repeat // len(frames)))
    with tempfile.TemporaryDirectory(prefix="edgecv-bench-") as tmp:
        openvino, vs = None, {}
        if args.vs:
            openvino, vs = _openvino(args, model, tensors, streams, Path(tmp))
        runs = [*RUNS, OPENVINO] if openvino else list(RUNS)
        progress.say(
            f"timing {', '.join(runs)} over {len(frames)} frames of {args.video}: {passes} "
            "passes each, in turns"
        )
        report = measure(model, args.video, tensors, streams, passes, openvino)
    report.update(vs)
    report.update(
        {
            "package": str(args.package),
            "model": model.manifest.model_name,
            "device": getattr(model.executor.backend, "label", model.executor.backend.name),
            "frame_size": [int(frames[0].shape[1]), int(frames[0].shape[0])],
        }
    )
    print_video_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    return 0


def _openvino(args, model, tensors: list[np.ndarray], streams: int, work: Path):
    """(OpenVINO's async runner, the report's ``openvino`` facts), or (None, the reason
    it did not run) when it cannot be built from the package's source model."""
    from .agreement import agreement
    from .lineup import build_baselines
    from .openvino_video import OpenVINOVideo
    from .source_model import source_files

    try:
        symbol, params = source_files(model.manifest, args.source, work)
    except EdgecvError as err:
        return None, {"not_run": {"openvino": str(err)}}
    progress.say("loading the openvino baseline")
    built, failed = build_baselines(
        ["openvino"], symbol, params, tuple(tensors[0].shape), work, streams
    )
    if not built:
        return None, {"not_run": failed}
    baseline = built[0]
    runner = OpenVINOVideo(baseline.compiled, streams, model)
    detection = model.manifest.task == "detection"
    facts = {
        "version": baseline.version,
        "requests": streams,
        "notes": baseline.notes,
        "agreement": agreement(model.run(tensors[0]), baseline.run(tensors[0]), detection),
    }
    return runner, {"openvino": facts}


def measure(
    model, path: str, tensors: list[np.ndarray], streams: int, passes: int, openvino=None
) -> dict:
    """The runs over the file, ``passes`` turns each: the report's numbers."""
    names = [*RUNS, OPENVINO] if openvino else list(RUNS)
    rates: dict[str, list[float]] = {name: [] for name in names}
    latencies: dict[str, list[float]] = {name: [] for name in names}
    stats: dict[str, dict] = {}
    for _ in range(passes):
        for name, pipelined in (("pipelined", True), ("sequential", False)):
            start = time.perf_counter()
            with video(model, path, streams, pipelined=pipelined) as playing:
                count = sum(1 for _ in playing)
            rates[name].append(count / (time.perf_counter() - start))
            latencies[name].extend(playing.stats.latencies)
            stats[name] = playing.stats.summary()
        alone = _model_alone(model, tensors, streams)
        rates["model alone"].append(float(alone.per_round[0]))
        latencies["model alone"].extend(alone.latencies)
        if openvino is not None:
            openvino.latencies.clear()
            rates[OPENVINO].append(openvino.run_pass(path))
            latencies[OPENVINO].extend(openvino.latencies)
    runs = {}
    for name in names:
        seconds = np.asarray(latencies[name])
        runs[name] = {
            "frames_per_s": float(np.median(rates[name])),
            "frames_per_s_min": float(np.min(rates[name])),
            **{f"p{q}_ms": float(np.percentile(seconds, q)) * 1e3 for q in (50, 90, 99)},
        }
        if name in stats:  # the last pass's stage means and drops
            means = ("decode_ms", "preprocess_ms", "infer_ms", "postprocess_ms", "dropped")
            runs[name].update({key: stats[name][key] for key in means})
    fps = {name: runs[name]["frames_per_s"] for name in names}
    ratios = {"pipelined_over_openvino": fps["pipelined"] / fps[OPENVINO]} if openvino else {}
    return {
        **ratios,
        "video": str(path),
        "frames": len(tensors),
        "streams": streams,
        "passes": passes,
        "runs": runs,
        "pipelined_over_model": fps["pipelined"] / fps["model alone"],
        "pipelined_over_sequential": fps["pipelined"] / fps["sequential"],
    }


def _model_alone(model, tensors: list[np.ndarray], streams: int):
    """One round of ``streams`` callers running the file's frames between them."""
    calls = -(-len(tensors) // streams)

    def caller(offset: int):
        position = [offset]

        def call():
            model.run(tensors[position[0] % len(tensors)])
            position[0] += streams

        return call

    callers = [caller(i) for i in range(streams)]
    return alternate_concurrent({"model": callers}, 1, calls)["model"]


def print_video_report(report: dict) -> None:
    width, height = report["frame_size"]
    print(
        f"{report['model']} on {report['device']}: {report['video']}, {report['frames']} "
        f"frames of {width}x{height}, {report['passes']} passes each, "
        f"streams {report['streams']}"
    )
    print(f"  {'':<15}{'frames/s':>10}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}")
    for name, run in report["runs"].items():
        print(
            f"  {name:<15}{run['frames_per_s']:>10.1f}{run['p50_ms']:>9.2f}"
            f"{run['p90_ms']:>9.2f}{run['p99_ms']:>9.2f}"
        )
    print(
        f"  pipelined / model alone: {report['pipelined_over_model']:.2f}x "
        "(decode, pre- and postprocessing included)"
    )
    print(f"  pipelined / sequential: {report['pipelined_over_sequential']:.2f}x")
    if "pipelined_over_openvino" in report:
        facts = report["openvino"]
        agree = facts["agreement"]
        print(
            f"  pipelined / openvino async: {report['pipelined_over_openvino']:.2f}x (OpenVINO "
            f"{facts['version']}, {facts['requests']} infer requests; its outputs against "
            f"edgecv's: {agree.get('max_rel_diff', agree.get('error'))})"
        )
        for note in facts["notes"]:
            print(f"  note: {note}")
    for name, reason in report.get("not_run", {}).items():
        print(f"  {name}: not run: {reason}")
    p = report["runs"]["pipelined"]
    print(
        f"  pipelined stages (mean ms): decode {p['decode_ms']:.2f}, preprocess "
        f"{p['preprocess_ms']:.2f}, infer {p['infer_ms']:.2f}, postprocess "
        f"{p['postprocess_ms']:.2f}; {p['dropped']} dropped"
    )
