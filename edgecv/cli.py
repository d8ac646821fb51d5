"""The ``edgecv`` command line: deploy, run, profiles."""

from __future__ import annotations

import argparse
import logging
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np

from . import progress
from .arguments import (
    DEFAULT_LAYOUT_BUDGET_S,
    SHAPE_HELP,
    input_shapes,
    layout_budget,
    parse_shape,
    pin_argument,
)
from .errors import EdgecvError, ShapeError, foreign_message, missing_extra
from .manifest import Manifest
from .outputs import check_image_path, check_output_folder, save_arrays, save_image
from .precision import PRECISIONS, Precision
from .processing import add_arguments as add_processing_arguments
from .processing import from_arguments


def _deploy_device(args) -> str:
    """``deploy --on``: the device named, checked to be here (as ``tune --on``); else
    ``auto`` (the profile's own choice)."""
    if not args.on:
        return "auto"
    from .profiles import load_profile
    from .schedules.device_class import find_device

    find_device(load_profile(args.device), args.on)
    return args.on


def cmd_deploy(args: argparse.Namespace) -> int:
    from .deploy import deploy
    from .pipelines import BuildOptions

    start = time.perf_counter()
    processing = from_arguments(args)  # a bad sidecar or flag before minutes of building
    if args.kernel_time_limit <= 0:
        raise EdgecvError(f"--kernel-time-limit must be positive, got {args.kernel_time_limit}")
    if args.db:  # the graph tuner writes its measured costs there
        from .tuning.records import check_database_folder

        check_database_folder(Path(args.db))
    for ops_file in args.ops or []:  # before the graph is read: it names these ops
        from .op_registry import load_ops

        progress.say(f"registered {', '.join(load_ops(ops_file))} from {ops_file}")
    options = BuildOptions(
        cpu_ops=[op.strip() for op in (args.cpu_ops or "").split(",") if op.strip()],
        gpu_only=args.gpu_only,
        check_on=None if args.no_device_check else _deploy_device(args),
        tuning=None if args.no_tuning else tuning_folders(args.device, args.db),
        kernel_time_limit_s=args.kernel_time_limit,
        layout=args.layout,
        layout_costs=args.db,
        layout_budget_s=args.layout_budget,
        precision=args.precision,
        calibrate=args.calibrate,
        calibration_size=args.calibration_size,
        calibration_method=args.calibration_method,
    )
    path = deploy(
        args.model,
        output=args.output,
        device=args.device,
        params=args.params,
        input_shape=input_shapes(args.input_shape),
        pretrained=not args.random_weights,
        seed=args.seed,
        progress=progress.say,
        host=args.host,
        options=options,
        force=args.force,
        processing=processing,
    )
    if args.explain:
        from .package import read_manifest

        manifest = read_manifest(path)[1]
        explain_tuning(manifest)
        explain(manifest)
        explain_precision(manifest)
        explain_layouts(manifest)
        explain_schedules(manifest)
    from .package import manifest_sha256

    pin = manifest_sha256(path)
    if args.archive:
        from .package import archive

        path = archive(path, force=args.force)
    print(f"{path}  (deployed in {time.perf_counter() - start:.1f} s)")
    print(f"sha256 (pin with edgecv run --sha256 / edgecv.load(sha256=)): {pin}")
    return 0


def tuning_folders(device: str, user_db: str | None) -> list[str]:
    """Tuning databases for a deploy for the profile named ``device``: see
    :func:`edgecv.schedules.device_class.tuning_folders`."""
    from .profiles import load_profile
    from .schedules.device_class import tuning_folders as folders_of

    return folders_of(load_profile(device), user_db)


def explain_tuning(manifest: Manifest) -> None:
    """Print the tuning databases the build read, highest priority first."""
    folders = manifest.tuning_databases or ["none"]
    print(f"tuning databases: {', '.join(folders)}")


def explain_precision(manifest: Manifest) -> None:
    """Print which launches run in which precision, or what fp16 would save."""
    from .pipelines.fp16 import explain_lines

    for line in explain_lines(manifest):
        print(line)


def explain_layouts(manifest: Manifest) -> None:
    """Print each convolution's layout and every transform inserted, with their times."""
    from .graph_tuner.explain import describe

    for line in describe(manifest.layouts):
        print(line)


def explain_schedules(manifest: Manifest) -> None:
    """Print which rule scheduled each kernel, and why earlier rules were passed over;
    kernels of operators registered with ``--ops`` always (the user's own kernels)."""
    from .op_registry import registered_names

    registered = set(registered_names())
    for device, facts in manifest.schedules.items():
        counts = ", ".join(f"{rule} {n}" for rule, n in facts["rules"].items())
        print(f"schedules ({device}): {counts}")
        for name, kernel in facts["kernels"].items():
            mine = registered & set(kernel["ops"])
            if kernel["passed_over"] or kernel["rule"] in (None, "tuned") or mine:
                why = "; ".join(f"{r}: {w}" for r, w in kernel["passed_over"])
                print(
                    f"  {name} ({', '.join(kernel['ops'])}): {kernel['rule']}"
                    + (f"  [{why}]" if why else "")
                )


def explain(manifest: Manifest) -> None:
    """Print where each launch runs and every device copy (``deploy --explain``)."""
    placement = manifest.placement
    if placement is None:
        print(f"placement: every launch on the {manifest.runtime} device")
        return
    counts = placement["launches"]
    print(f"placement: {counts['gpu']} launches on the GPU, {counts['cpu']} on the CPU")
    for node in placement["cpu_nodes"]:
        from .fallback import REASONS

        detail = f" [{node['detail']}]" if node["detail"] else ""
        print(
            f"  cpu  {node['kernel']} ({', '.join(node['ops'])}): {REASONS[node['reason']]}{detail}"
        )
    print(f"copies: {len(placement['copies'])}, {placement['copy_bytes']:,} bytes per inference")
    for c in placement["copies"]:
        shape = "x".join(map(str, c["shape"]))
        print(f"  {c['from']}->{c['to']}  {shape} {c['dtype']}  {c['bytes']:,} bytes")


def cmd_run(args: argparse.Namespace) -> int:
    from .imaging import draw, read_image
    from .model import load

    # Where results go is checked before the model runs, not after.
    if args.save:
        check_image_path(args.save)
    if args.output:
        check_output_folder(args.output)
    model = load(args.package, on=args.on, sha256=args.sha256)
    images = list(args.images)
    if args.sample:
        images.append(sample_image(args.sample))
    if not images and not args.input:
        raise EdgecvError("nothing to run: give image files, --sample NAME or --input X.npy")
    if images:
        model.require_one_input("run IMAGE")
    names = [tensor.name for tensor in model.manifest.inputs]
    if args.input:
        if len(args.input) != len(names):
            raise ShapeError(
                f"{args.package} takes {len(names)} input(s) ({', '.join(names)}); "
                f"--input was given {len(args.input)} time(s)"
            )
        xs = [_load_array(path) for path in args.input]
        outputs, latency = _timed(lambda _: model.run(*xs), None, repeat=args.repeat)
        _report_outputs(model, outputs, args.output)
        print(f"latency: {latency * 1e3:.2f} ms (median of {args.repeat})")
    for image_path in images:
        image = read_image(image_path)
        x = model.preprocess(image)
        outputs, latency = _timed(model.run, x, repeat=args.repeat)
        print(f"{image_path}:")
        kind = model.processing.decoder.kind
        if kind in ("logits", "probabilities"):
            for label, prob in model.decode(outputs, image.shape[:2]):
                print(f"  {prob:7.4f}  {label}")
        elif kind == "tensor":
            shapes = ", ".join("x".join(map(str, o.shape)) for o in outputs)
            print(f"  outputs: {shapes} (no decoder: deploy with --decoder or --preprocess)")
        else:
            found = model.decode(outputs, image.shape[:2], args.threshold)
            shown = found or model.decode(outputs, image.shape[:2], -1.0)[:3]
            if not found:
                floor = "the decoder's" if args.threshold is None else args.threshold
                print(f"  no detections with score >= {floor}; best {len(shown)}:")
            for det in shown:
                box = ", ".join(f"{v:.0f}" for v in det.box)
                print(f"  {det.score:7.4f}  {det.label:<14} [{box}]")
            if args.save:
                out = Path(args.save)
                if len(images) > 1:
                    out = out.with_name(f"{out.stem}-{Path(image_path).stem}{out.suffix}")
                save_image(out, draw(image, found, fps=1.0 / latency))
                print(f"  annotated image: {out}")
        print(f"  latency: {latency * 1e3:.2f} ms (median of {args.repeat})")
        if args.output:
            _report_outputs(model, outputs, args.output)
    return 0


SAMPLES = ("astronaut", "chelsea", "coffee", "motorcycle_left", "rocket")


def sample_image(name: str) -> str:
    """Write scikit-image's bundled photo ``name`` to a temporary JPEG; return its path."""
    import tempfile

    import cv2
    import skimage.data

    rgb = getattr(skimage.data, name)()
    if rgb.ndim == 2:
        rgb = np.stack([rgb] * 3, axis=-1)
    path = Path(tempfile.gettempdir()) / f"edgecv-sample-{name}.jpg"
    cv2.imwrite(str(path), np.ascontiguousarray(rgb[:, :, :3][:, :, ::-1]))
    return str(path)


def _load_array(path: str) -> np.ndarray:
    try:
        x = np.load(path)
    except (OSError, ValueError) as err:
        raise EdgecvError(f"cannot read --input {path}: {err}") from None
    if not isinstance(x, np.ndarray):
        raise ShapeError(f"--input {path} must hold one array (.npy), not an archive")
    return x


def _timed(fn, x, repeat: int):
    outputs = fn(x)
    times = []
    for _ in range(max(repeat, 1)):
        t = time.perf_counter()
        outputs = fn(x)
        times.append(time.perf_counter() - t)
    return outputs, float(np.median(times))


def _report_outputs(model, outputs: list[np.ndarray], path: str | None) -> None:
    for i, out in enumerate(outputs):
        print(f"output{i} {model.manifest.outputs[i].name}: shape {out.shape} {out.dtype}")
    if path:
        written = save_arrays(path, {f"output{i}": o for i, o in enumerate(outputs)})
        print(f"wrote {written}")


def cmd_profiles(args: argparse.Namespace) -> int:
    from .profiles import list_profiles

    for p in list_profiles():
        status = "ready" if p.available else f"needs the {p.runtime} backend (not in this version)"
        print(f"{p.name:<12} {p.runtime:<7} {status:<45} {p.description}")
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    from .runtime.cuda import cuda_devices
    from .runtime.opencl_devices import opencl_devices

    devices = opencl_devices()
    print(f"OpenCL devices: {len(devices)}")
    for dev in devices:
        subgroups = "intel subgroups" if dev.intel_subgroups else "no subgroups"
        memory = f"{dev.global_memory_bytes / 2**30:.1f} GiB"
        local = f"local {dev.local_memory_bytes // 1024} KiB"
        print(
            f"  {dev.label}\n      {dev.version}; {subgroups}; {dev.compute_units} compute units; "
            f"{memory}; {local}; max work-group {dev.max_work_group_size}"
        )
    cuda = cuda_devices()
    print(f"CUDA devices: {len(cuda)}")
    for dev in cuda:
        print(f"  {dev.label}; {dev.global_memory_bytes / 2**30:.1f} GiB")
    if not cuda:
        print("  (no CUDA driver or GPU here: CUDA packages deploy, but run only on a GPU)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgecv", description="Deploy GluonCV/MXNet vision models to edge GPUs and CPUs."
    )
    verbose = "log progress; print the traceback of a failure (for a bug report)"
    parser.add_argument("-v", "--verbose", action="store_true", help=verbose)
    # -v is accepted after the command too (`edgecv deploy ... -v`)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=verbose
    )
    sub = parser.add_subparsers(dest="command", required=True)

    d = sub.add_parser("deploy", parents=[common], help="compile a model into a package")
    d.add_argument(
        "model", help="zoo name/alias (ssd_mobilenet, resnet50, ...), *-symbol.json or *.onnx"
    )
    d.add_argument("--params", help="weights file (.params)")
    d.add_argument("--device", default="cpu", help="device profile (see `edgecv profiles`)")
    d.add_argument("--input-shape", type=parse_shape, action="append", help=SHAPE_HELP)
    d.add_argument("-o", "--output", help="package folder (default ./MODEL-DEVICE)")
    d.add_argument(
        "--random-weights",
        action="store_true",
        help="skip the pretrained-weight download; use seeded random weights",
    )
    d.add_argument("--seed", type=int, default=0, help="seed of random weights")
    d.add_argument("--archive", action="store_true", help="also pack the folder as .tar.gz")
    d.add_argument(
        "--force",
        action="store_true",
        help="replace an existing edgecv package at -o (anything else there is never touched)",
    )
    d.add_argument(
        "--cpu-ops", metavar="OPS", help="comma-separated operators to run on the CPU (box_nms)"
    )
    d.add_argument(
        "--ops",
        metavar="FILE",
        action="append",
        help="a Python file registering operators with edgecv.register_op (repeatable; "
        "docs/adding-an-operator.md)",
    )
    d.add_argument(
        "--gpu-only", action="store_true", help="fail instead of running any launch on the CPU"
    )
    d.add_argument(
        "--explain",
        action="store_true",
        help="print the tuning databases read, the placement (CPU launches, copies), the "
        "layouts and the schedule of each kernel",
    )
    d.add_argument(
        "--host",
        choices=["native"],
        help="compile CPU fallback for this machine, not the profile's host",
    )
    d.add_argument(
        "--no-device-check",
        action="store_true",
        help="do not compile the OpenCL program on a local device at deploy time",
    )
    d.add_argument(
        "--on",
        metavar="DEVICE",
        help="the local OpenCL device to check the program on and time layout candidates "
        "on: part of its platform/device name (intel, pocl; default: the profile's)",
    )
    d.add_argument(
        "--kernel-time-limit",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="longest one schedule of one kernel may take to compile before the next "
        "rule is tried (default 60)",
    )
    d.add_argument("--no-tuning", action="store_true", help="build with the default schedules only")
    d.add_argument(
        "--db", metavar="DIR", help="your tuning database folder (layered over the shipped one)"
    )
    d.add_argument(
        "--layout",
        choices=("NCHW", "auto", "packed"),  # edgecv.graph_tuner.LAYOUT_MODES
        default="auto",
        help="convolution data layouts: auto (default: the graph tuner picks NCHW or "
        "packed per convolution from kernel and transform times measured on the device "
        "and cached; NCHW when they cannot be had), NCHW, packed (NCHW[x]c wherever "
        "possible)",
    )
    d.add_argument(
        "--layout-budget",
        type=layout_budget,
        default=DEFAULT_LAYOUT_BUDGET_S,
        metavar="SECONDS",
        help="longest the graph tuner may measure costs it has not cached, the biggest "
        "convolutions of each kind first, the rest predicted and measured by later "
        f"deploys (default {DEFAULT_LAYOUT_BUDGET_S:g}; none: measure everything)",
    )
    d.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=Precision.FP32.value,
        help="fp32 (default); int8: convolutions and dense layers quantized after "
        "calibration on --calibrate (CPU profiles; docs/int8.md); fp16: float16 weights "
        "and activations, reductions and vision operators in float32 (GPU profiles; "
        "docs/fp16.md)",
    )
    d.add_argument(
        "--calibrate",
        metavar="DIR_OR_NPY",
        help="int8: a folder of images like those the model will see (read with the "
        "package's preprocessing), or a .npy of preprocessed inputs (N x input shape)",
    )
    d.add_argument(
        "--calibration-size",
        type=int,
        metavar="N",
        help="int8: calibrate on at most N inputs (default 100; a seeded sample of more)",
    )
    d.add_argument(
        "--calibration-method",
        choices=("minmax", "percentile", "entropy"),  # edgecv.lowering.calibration.METHODS
        default="percentile",
        help="int8: how each tensor's scale follows from its statistics (default "
        "percentile: the 99.99th percentile of |x|)",
    )
    add_processing_arguments(d)
    d.set_defaults(func=cmd_deploy)

    r = sub.add_parser("run", parents=[common], help="run a package on images or a tensor")
    r.add_argument("package", help="package folder or .tar.gz")
    r.add_argument("images", nargs="*", help="image files")
    r.add_argument(
        "--input",
        action="append",
        help="raw input tensor (.npy), no "
        "preprocessing; once per input, in order, for a model with several",
    )
    r.add_argument(
        "--sample", choices=SAMPLES, help="also run on a real photo shipped inside scikit-image"
    )
    r.add_argument("--output", help="write all outputs to this .npz (output0, output1, ...)")
    r.add_argument("--save", help="write the annotated image here (detectors)")
    r.add_argument(
        "--threshold",
        type=float,
        help="detection score threshold (default 0.5; the decoder's 0.25 for Ultralytics)",
    )
    r.add_argument("--repeat", type=int, default=5, help="timed runs after one warm-up")
    r.add_argument("--on", help="OpenCL device: part of its platform/device name (intel, pocl)")
    pin_argument(r)
    r.set_defaults(func=cmd_run)

    from .bench.command import add_parser as add_bench

    add_bench(sub, common)
    from .demo import add_parser as add_demo

    add_demo(sub, common)
    try:
        from .tuning.command import add_parser as add_tune
    except ImportError as err:  # a board's device runtime: no compiler side to tune with
        refusal = missing_extra(err, "`edgecv tune`")
        if refusal is None:
            raise
        t = sub.add_parser("tune", parents=[common], help="tune kernels (needs edgecv[compiler])")
        t.add_argument("arguments", nargs=argparse.REMAINDER)
        t.set_defaults(func=_refuse(refusal))
    else:
        add_tune(sub, common)

    v = sub.add_parser("devices", parents=[common], help="list OpenCL and CUDA devices here")
    v.set_defaults(func=cmd_devices)

    p = sub.add_parser("profiles", parents=[common], help="list device profiles")
    p.set_defaults(func=cmd_profiles)
    return parser


def _refuse(error: EdgecvError):
    def refuse(args: argparse.Namespace) -> int:
        raise error

    return refuse


def _format_warning(message, category, filename, lineno, line=None) -> str:
    text = " ".join(str(message).split())
    return f"edgecv: warning: {text}\n"


def main(argv: list[str] | None = None) -> int:
    """The ``edgecv`` command: every failure ends in one ``edgecv: error:`` line and a
    non-zero exit (2: bad input or environment; 1: a bug in edgecv); ``-v`` adds the
    traceback, for a bug report."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="[edgecv] %(message)s"
    )
    warnings.filterwarnings("ignore", module="mxnet")
    if not args.verbose:  # a user reads the warning, not the line of edgecv that raised it
        warnings.formatwarning = _format_warning
    try:
        try:
            return args.func(args)
        except ImportError as err:  # an optional part this install lacks (a board's)
            refusal = missing_extra(err, f"`edgecv {args.command}`")
            if refusal is None:
                raise
            raise refusal from None
    except EdgecvError as err:
        if args.verbose:
            traceback.print_exc()
        print(f"edgecv: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("edgecv: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # not the user's fault: one line, the traceback with -v
        if args.verbose:
            traceback.print_exc()
        print(
            f"edgecv: error: internal error ({type(err).__name__}: {foreign_message(err)}); "
            "run again with -v for the traceback and report it",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
