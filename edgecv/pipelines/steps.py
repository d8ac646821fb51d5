"""The steps the pipelines are made of, each a function the pipeline files call in order."""

from __future__ import annotations

import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tvm

from ..board import progress as progress_bars
from ..board.arguments import DEFAULT_LAYOUT_BUDGET_S
from ..board.errors import EdgecvError
from ..board.manifest import TVM_RUNTIME_FILES
from ..board.plan import Plan
from ..board.precision import Precision
from ..codegen.contained import DEFAULT_TIME_LIMIT_S, Compiled, CompileOne, compile_contained
from ..codegen.op_versions import OpVersions
from ..lowering import Lowered
from ..schedules.orders import cpu_order, tuning_database
from ..schedules.stage import ScheduleOrder

Progress = Callable[[str], None]


class KernelBuildError(EdgecvError):
    """A kernel that no schedule rule could compile for the CPU."""


@dataclass
class BuildOptions:
    """What a deploy may change about a build.

    Parameters
    ----------
    cpu_ops : list of str
        Operators to run on the CPU even where the GPU could.
    gpu_only : bool
        Fail instead of falling back to the CPU.
    check_on : str or None
        OpenCL device to compile the program on at deploy time (``auto``: the profile's
        default device when this machine has it; None: no check).
    op_versions : OpVersions
        Which GPU versions of edgecv's operators to build.
    tuning : list of path or None
        Tuning database folders, highest priority first; None builds defaults only.
    kernel_time_limit_s : float
        Longest one schedule candidate of one kernel may take to compile.
    workers : int or None
        Kernels compiled at once (default: the CPU count).
    layout : str
        Data layouts of the convolutions (the graph tuner): ``auto`` (the default:
        chosen from costs measured on the device and cached, NCHW when they cannot be
        had), ``NCHW``, ``packed``.
    layout_costs : path or None
        Where the graph tuner writes the costs it measures (None: the user's folder for
        the device, :func:`edgecv.graph_tuner.devices.user_costs_folder`).
    layout_budget_s : float or None
        Seconds the graph tuner may spend measuring costs not cached yet (the largest
        convolutions and transforms first); the rest are predicted from what it measured
        and measured by later deploys (default :data:`DEFAULT_LAYOUT_BUDGET_S`);
        None: measure everything (``edgecv tune``).
    precision : Precision or str
        ``fp32`` (the default); ``int8``: convolutions and dense layers quantized after
        calibration (CPU profiles; :mod:`edgecv.pipelines.int8`); ``fp16``: float16 on
        GPU profiles (:mod:`edgecv.pipelines.fp16`). A string is parsed here, once
        (:meth:`edgecv.board.precision.Precision.parse`: one error naming the values).
    calibrate : path or None
        int8: a folder of images or a ``.npy`` of preprocessed inputs to calibrate on.
    calibration_size : int or None
        int8: at most this many calibration inputs (None: 100).
    calibration_method : str
        int8: how a tensor's scale follows from its statistics: ``minmax``,
        ``percentile`` (the default), ``entropy`` (:mod:`edgecv.lowering.calibration`).
    calibration : CalibrationInputs or None
        int8: the inputs read from ``calibrate`` (:func:`edgecv.pipelines.int8.read_calibration`);
        the deploy fills it once the model's input shape is known.
    previous_calibration : dict or None
        int8: the ``calibration.json`` of the package this deploy replaces; its
        statistics are reused when taken on the same model and inputs.
    model_quantization : list or None
        int8: a quantized model's own scales and weights (an ONNX QDQ file), used
        instead of calibration (:mod:`edgecv.pipelines.int8_given`).
    """

    cpu_ops: list[str] = field(default_factory=list)
    gpu_only: bool = False
    check_on: str | None = "auto"
    op_versions: OpVersions = field(default_factory=OpVersions)
    tuning: Sequence[str | Path] | None = ()
    kernel_time_limit_s: float = DEFAULT_TIME_LIMIT_S
    workers: int | None = None
    layout: str = "auto"
    layout_costs: str | Path | None = None
    layout_budget_s: float | None = DEFAULT_LAYOUT_BUDGET_S
    precision: Precision = Precision.FP32
    calibrate: str | Path | None = None
    calibration_size: int | None = None
    calibration_method: str = "percentile"
    calibration: object | None = None
    previous_calibration: dict | None = None
    model_quantization: list[dict] | None = None

    def __post_init__(self):
        self.precision = Precision.parse(self.precision)


@dataclass
class Built:
    """What a pipeline hands to the package writer."""

    plan: Plan
    constants: dict[str, np.ndarray]
    write: Callable  # PackageWriter -> {role: relative path} of the kernel files
    facts: dict  # the manifest's ``build`` entries of this pipeline
    timings: dict[str, float]
    kernel_ops: dict[str, list[str]] = field(default_factory=dict)  # fused ops per kernel
    files: dict[str, str] = field(default_factory=dict)  # more package files: path -> text


def compile_kernels(
    kernels: tvm.IRModule,
    order: ScheduleOrder,
    compile_one: CompileOne,
    lowered: Lowered,
    options: BuildOptions,
    progress: Progress,
    device: str,
) -> tuple[dict[str, Compiled], tempfile.TemporaryDirectory]:
    """Schedule and compile ``kernels`` (contained, time-limited, on every core); warn
    once per kernel that needed a later rule than its first applicable one."""
    work = tempfile.TemporaryDirectory(prefix=f"edgecv-{device}-")
    functions = {gv.name_hint: f for gv, f in kernels.functions.items()}
    done = [0]
    bar = progress_bars.bar(len(functions), f"scheduling + compiling ({device})", "kernel")

    def on_done(name: str, compiled: Compiled) -> None:
        done[0] += 1
        bar.update(1)
        choice = compiled.choice
        if choice.passed_over:
            reasons = "; ".join(f"{rule}: {why}" for rule, why in choice.passed_over)
            ops = ", ".join(lowered.kernel_ops.get(name, [name]))
            outcome = f"scheduled by {choice.rule}" if choice.rule else "no rule compiled it"
            warnings.warn(f"{device} kernel {name} ({ops}): {outcome} ({reasons})", stacklevel=2)

    with bar:
        compiled = compile_contained(
            functions,
            order,
            compile_one,
            Path(work.name),
            time_limit_s=options.kernel_time_limit_s,
            workers=options.workers,
            on_done=on_done,
        )
    rules: dict[str, int] = {}
    for c in compiled.values():
        rules[str(c.choice.rule)] = rules.get(str(c.choice.rule), 0) + 1
    progress(
        f"{device}: {len(compiled)} kernels, "
        + ", ".join(f"{n} by {rule}" for rule, n in sorted(rules.items(), key=lambda kv: -kv[1]))
    )
    return compiled, work


def schedule_facts(compiled: dict[str, Compiled], kernel_ops: dict[str, list[str]]) -> dict:
    """The manifest's record of which rule scheduled each kernel, and a count per rule."""
    kernels = {
        name: {"ops": kernel_ops.get(name, [name]), **c.choice.to_json()}
        for name, c in compiled.items()
    }
    counts: dict[str, int] = {}
    for entry in kernels.values():
        counts[str(entry["rule"])] = counts.get(str(entry["rule"]), 0) + 1
    return {"rules": dict(sorted(counts.items())), "kernels": kernels}


def subset(kernels: tvm.IRModule, names: set[str]) -> tvm.IRModule:
    return tvm.IRModule({gv: f for gv, f in kernels.functions.items() if gv.name_hint in names})


def compile_cpu_kernels(
    kernels: tvm.IRModule,
    target: tvm.target.Target,
    lowered: Lowered,
    options: BuildOptions,
    progress: Progress,
) -> tuple[Callable, dict]:
    """Schedule and compile CPU kernels; returns how to link them into the package (with
    TVM's runtime library for their host) and the facts: the schedules, and the host
    the code runs on (``host``). A kernel no rule compiles is an error naming it."""
    from ..codegen.host import calls_tvm_library, host_of, tvm_runtime_for
    from ..codegen.llvm import compile_object, link_objects

    host = host_of(target)
    runtime_libraries = tvm_runtime_for(host, progress)  # before minutes of compiling
    order = cpu_order(target, tuning_database(options.tuning))
    started = time.perf_counter()
    compiled, work = compile_kernels(
        kernels, order, compile_object(target), lowered, options, progress, "cpu"
    )
    failed = [name for name, c in compiled.items() if c.choice.rule is None]
    if failed:
        work.cleanup()
        details = "; ".join(
            f"{name} ({', '.join(lowered.kernel_ops.get(name, [name]))}): "
            + " / ".join(f"{r}: {w}" for r, w in compiled[name].choice.passed_over)
            for name in failed
        )
        raise KernelBuildError(
            f"{len(failed)} kernel(s) could not be compiled for the CPU even by the safe "
            f"rule: {details[:1500]}. Please report this model; --kernel-time-limit raises "
            "the time limit per kernel"
        )
    objects = [compiled[name].facts["object"] for name in compiled]
    seconds = time.perf_counter() - started
    # the runtime always; its extra library when a kernel calls TVM's library functions
    keys = ("tvm_runtime", "tvm_runtime_extra")[: 1 + calls_tvm_library(objects)]

    def write(writer) -> dict[str, str]:
        try:
            link_objects(objects, writer.path("kernels/cpu.so"), host)
        finally:
            work.cleanup()
        files = {"cpu": "kernels/cpu.so"}
        for key, relative in zip(keys, TVM_RUNTIME_FILES[: len(keys)], strict=True):
            library = runtime_libraries[Path(relative).name]
            writer.path(relative).write_bytes(library.read_bytes())
            files[key] = relative
        return files

    facts = schedule_facts(compiled, lowered.kernel_ops)
    facts["compile_s"] = round(seconds, 3)
    facts["host"] = host.to_json()
    return write, facts
