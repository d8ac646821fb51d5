"""``edgecv deploy MODEL``: the flags of a build, the profile loaded once, the package
written (and archived), its pin printed; ``--explain`` prints :mod:`.explain`'s report.

The compiler side is imported inside :func:`run` only: a board's ``edgecv`` parses these
flags without it."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..board import progress
from ..board.arguments import (
    DEFAULT_LAYOUT_BUDGET_S,
    SHAPE_HELP,
    input_shapes,
    layout_budget,
    parse_shape,
)
from ..board.errors import EdgecvError
from ..board.precision import PRECISIONS, Precision
from ..board.processing import add_arguments as add_processing_arguments
from ..board.processing import from_arguments


def add_parser(sub, common) -> None:
    """Register ``deploy`` on the CLI's subparsers."""
    d = sub.add_parser("deploy", parents=[common], help="compile a model into a package")
    _add_source_arguments(d)
    _add_placement_arguments(d)
    _add_tuning_arguments(d)
    _add_precision_arguments(d)
    add_processing_arguments(d)
    d.set_defaults(func=run)


def _add_source_arguments(d: argparse.ArgumentParser) -> None:
    """The model, its weights and shape, the profile, and where the package goes."""
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


def _add_placement_arguments(d: argparse.ArgumentParser) -> None:
    """Where launches run, the user's operators, the device check, what is explained."""
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


def _add_tuning_arguments(d: argparse.ArgumentParser) -> None:
    """Tuning databases and the graph tuner's layouts."""
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


def _add_precision_arguments(d: argparse.ArgumentParser) -> None:
    """The precision and, for INT8, the calibration."""
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


def run(args: argparse.Namespace) -> int:
    from ..deploy import deploy
    from ..profiles import load_profile

    start = time.perf_counter()
    processing = from_arguments(args)  # a bad sidecar or flag before minutes of building
    if args.kernel_time_limit <= 0:
        raise EdgecvError(f"--kernel-time-limit must be positive, got {args.kernel_time_limit}")
    if args.db:  # the graph tuner writes its measured costs there
        from ..tuning.records import check_database_folder

        check_database_folder(Path(args.db))
    for ops_file in args.ops or []:  # before the graph is read: it names these ops
        from ..op_registry import load_ops

        progress.say(f"registered {', '.join(load_ops(ops_file))} from {ops_file}")
    profile = load_profile(args.device)  # once: the device check, tuning and build read it
    path = deploy(
        args.model,
        output=args.output,
        profile=profile,
        params=args.params,
        input_shape=input_shapes(args.input_shape),
        pretrained=not args.random_weights,
        seed=args.seed,
        progress=progress.say,
        host=args.host,
        options=build_options(args, profile),
        force=args.force,
        processing=processing,
    )
    if args.explain:
        from ..board.package import read_manifest
        from .explain import explain

        explain(read_manifest(path)[1])
    from ..board.package import manifest_sha256

    pin = manifest_sha256(path)
    if args.archive:
        from ..board.package import archive

        path = archive(path, force=args.force)
    print(f"{path}  (deployed in {time.perf_counter() - start:.1f} s)")
    print(f"sha256 (pin with edgecv run --sha256 / edgecv.load(sha256=)): {pin}")
    return 0


def build_options(args: argparse.Namespace, profile):
    """The :class:`~edgecv.pipelines.BuildOptions` of ``deploy``'s flags for ``profile``."""
    from ..pipelines import BuildOptions
    from ..schedules.device_class import tuning_folders

    return BuildOptions(
        cpu_ops=[op.strip() for op in (args.cpu_ops or "").split(",") if op.strip()],
        gpu_only=args.gpu_only,
        check_on=None if args.no_device_check else _check_device(profile, args.on),
        tuning=None if args.no_tuning else tuning_folders(profile, args.db),
        kernel_time_limit_s=args.kernel_time_limit,
        layout=args.layout,
        layout_costs=args.db,
        layout_budget_s=args.layout_budget,
        precision=args.precision,
        calibrate=args.calibrate,
        calibration_size=args.calibration_size,
        calibration_method=args.calibration_method,
    )


def _check_device(profile, on: str | None) -> str:
    """``deploy --on``: the device named, checked to be here (as ``tune --on``); else
    ``auto`` (the profile's own choice)."""
    if not on:
        return "auto"
    from ..schedules.device_class import find_device

    find_device(profile, on)
    return on
