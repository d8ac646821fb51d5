"""``edgecv deploy``: model source -> imported graph -> plan + kernels -> package."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import tvm

from . import __version__
from .board.errors import EdgecvError, ProfileError, foreign_message
from .board.manifest import Manifest, Tensor
from .board.package import PackageWriter, check_destination, package_manifest
from .board.precision import Precision
from .board.processing import Processing, preset, to_manifest
from .frontend.imported import ImportedModel
from .frontend.mxnet import zoo
from .lowering.memory_plan import memory_facts
from .pipelines import BuildOptions, Built, int8_given, pipeline_for
from .pipelines import fp16 as fp16_step
from .pipelines import int8 as int8_step
from .profiles import AVAILABLE_RUNTIMES, Profile, check_profile, load_profile
from .schedules.device_class import tuning_folders
from .schedules.orders import tuning_database
from .source import MXNetSource, OnnxSource, resolve_source

log = logging.getLogger(__name__)

# How the package's images become its input tensor (GluonCV's ImageNet normalization),
# written into the manifest; INT8 calibration images are read the same way.
PREPROCESSING = {
    "color": "RGB",
    "scale": 1.0 / 255.0,
    "mean": list(zoo.MEAN_RGB),
    "std": list(zoo.STD_RGB),
    "resize": "stretch",
}


def deploy(
    model: str | Path,
    output: str | Path | None = None,
    profile: str | Path | Profile | None = None,
    params: str | Path | None = None,
    input_shape: tuple[int, ...] | dict[str, tuple[int, ...]] | None = None,
    pretrained: bool = True,
    seed: int = 0,
    progress: Callable[[str], None] = lambda message: None,
    host: str | None = None,
    options: BuildOptions | None = None,
    cpu_ops: Sequence[str] = (),
    gpu_only: bool = False,
    check_on: str | None = "auto",
    force: bool = False,
    precision: str | Precision = Precision.FP32,
    calibrate: str | Path | None = None,
    calibration_size: int | None = None,
    processing: Processing | None = None,
    device: str | None = None,
) -> Path:
    """Compile ``model`` for the device profile ``profile`` and write a package.

    Parameters
    ----------
    model : str or Path
        A zoo name or alias (``ssd_mobilenet``), a path to ``*-symbol.json``, or a path
        to an ``.onnx`` file (its weights inside it or in external data files beside it).
    output : path, optional
        The package folder; ``./<model>-<profile>`` by default.
    profile : str, path or Profile
        The device profile: its name (see ``edgecv profiles``; ``cpu`` by default), its
        JSON file, or a :class:`~edgecv.profiles.Profile` already loaded (as ``edgecv
        deploy`` passes the one it read for the device check and the tuning databases).
    params : str or Path, optional
        Weights: export-style ``.params`` for a symbol file, ``save_parameters`` style
        for a zoo model.
    input_shape : tuple or dict, optional
        NCHW input shape; the model's usual size by default (an ONNX file's declared
        shape, which this must give where it is symbolic). A model with several inputs
        takes one shape per input name (``{"data0": ..., "data1": ...}``).
    progress : callable
        Receives one line per stage (the CLI prints them).
    host : str, optional
        ``native`` compiles the CPU part for this machine instead of the profile's host
        CPU (to run a device package here).
    options : BuildOptions, optional
        What the build may change: ``--cpu-ops``, ``--gpu-only``, the device check, the
        GPU versions of edgecv's operators, tuning databases, the time limit per kernel
        (see :class:`edgecv.pipelines.BuildOptions`). Without it, the build reads the
        tuning databases ``edgecv deploy`` reads (the user's folder of the device
        class, then the shipped one).
    cpu_ops, gpu_only, check_on, precision, calibrate, calibration_size
        Shorthands for the same fields of ``options`` when ``options`` is not given
        (``precision="int8", calibrate="images/"``: an INT8 package calibrated on the
        images of that folder; see ``docs/int8.md``).
    force : bool
        Replace an existing edgecv package at ``output``. Anything at ``output`` that is
        not an edgecv package is never replaced (:func:`~edgecv.board.package.check_destination`).
    processing : Processing, optional
        How images become the input and outputs become results (a preset, sidecar or
        flags: :func:`edgecv.board.processing.resolve`); by default a zoo model's ImageNet one
        and GluonCV's outputs, an ONNX classifier's torchvision preset.
    device : str, optional
        The old name of ``profile`` (it names a profile, not a device): still accepted
        in this release with a ``DeprecationWarning``, removed in the next.

    Returns
    -------
    Path
        The package folder.
    """
    model = os.fspath(model)  # a pathlib.Path from Python callers
    params = None if params is None else os.fspath(params)
    if output is not None:
        check_destination(output, force)  # before minutes of compiling, not after
    profile = _profile_to_build(_renamed_device(profile, device), host)
    if options is None:
        options = _default_options(
            profile, cpu_ops, gpu_only, check_on, precision, calibrate, calibration_size
        )
    int8_step.check_request(options, profile)  # before minutes of exporting
    fp16_step.check_request(options, profile, progress)
    started = time.perf_counter()
    timings: dict[str, float] = {}
    where = functools.partial(_destination, output, profile.name, force)
    source, imported, destination = _import(
        model, params, input_shape, pretrained, seed, progress, timings, where
    )
    processing, sections = _processing_of(source, processing)
    if imported.quantization is not None:  # a QDQ model: int8 with the file's scales
        options = int8_given.with_model_scales(options, imported.quantization, profile)
    elif options.precision is Precision.INT8:
        options = _with_calibration(options, imported, destination, sections["preprocessing"])
    built = pipeline_for(profile.runtime).build(imported.mod, profile, options, progress)
    timings.update(built.timings)
    model = _Model(source, imported, destination, processing, sections)
    return _write_package(model, force, progress, profile, options, built, timings, started)


def _default_options(
    profile: Profile, cpu_ops, gpu_only, check_on, precision, calibrate, calibration_size
) -> BuildOptions:
    """A Python caller's options without ``options=``: the shorthands, and the tuning
    databases ``edgecv deploy`` reads (the user's folder of the device class, then the
    shipped one)."""
    return BuildOptions(
        list(cpu_ops),
        gpu_only,
        check_on,
        tuning=tuning_folders(profile, None),
        precision=precision,
        calibrate=calibrate,
        calibration_size=calibration_size,
    )


def _import(
    model: str, params, input_shape, pretrained, seed, progress, timings: dict, destination_of
):
    """The model's source resolved (a zoo model exported, a file read) and imported into
    a Relax module: (source, imported, the package folder ``destination_of`` its name),
    the time of each step added to ``timings``."""
    with tempfile.TemporaryDirectory(prefix="edgecv-export-") as tmp:
        progress(f"resolving {model}")
        t = time.perf_counter()
        source = resolve_source(model, Path(tmp), params, input_shape, pretrained, seed, progress)
        destination = destination_of(source.name)  # checked before minutes of importing
        timings["export_s"] = time.perf_counter() - t
        progress(f"importing {source.file.name} ({source.weights} weights)")
        t = time.perf_counter()
        imported = source.import_model()
        timings["import_s"] = time.perf_counter() - t
    return source, imported, destination


def _destination(output: str | Path | None, profile: str, force: bool, model: str) -> Path:
    """``output`` (checked before the build began), else ``./<model>-<profile>``, checked
    to be free or an edgecv package that ``force`` replaces."""
    if output is not None:
        return Path(output)
    check_destination(f"{model}-{profile}", force)
    return Path(f"{model}-{profile}")


def _processing_of(source, processing: Processing | None) -> tuple[Processing | None, dict]:
    """The processing the package records (an ONNX classifier's default: torchvision's)
    and its manifest sections (GluonCV's ImageNet preprocessing when there is none)."""
    if (
        processing is None
        and source.record.get("kind") == "onnx"
        and source.task == "classification"
    ):
        processing = preset("torchvision")  # what torchvision's classifiers take
    sections = (
        {"preprocessing": dict(PREPROCESSING)} if processing is None else to_manifest(processing)
    )
    return processing, sections


@dataclasses.dataclass
class _Model:
    """What a deploy knows of the model besides the build: its source, its imported
    graph, the package folder, how images become its input and outputs results."""

    source: MXNetSource | OnnxSource
    imported: ImportedModel
    destination: Path
    processing: Processing | None
    sections: dict  # the manifest's preprocessing (decoder, classes) sections


def _write_package(
    model: _Model,
    force: bool,
    progress: Callable[[str], None],
    profile: Profile,
    options: BuildOptions,
    built: Built,
    timings: dict[str, float],
    started: float,
) -> Path:
    """The built kernels, plan, constants and manifest written into the model's package
    folder, all or nothing (:class:`~edgecv.board.package.PackageWriter`)."""
    source, imported, destination = model.source, model.imported, model.destination
    processing, sections = model.processing, model.sections
    # the folders the build read records from (missing ones are skipped): the same
    # database object the build used, read once per process
    database = tuning_database(options.tuning)
    plan = built.plan

    writer = PackageWriter(destination, force=force)
    try:
        kernel_files = _write_kernels(built.write, writer)
        for relative, text in built.files.items():
            writer.write_text(relative, text)
        writer.write_text("plan.json", plan.to_json())
        writer.write_arrays("params.npz", built.constants)
        manifest = Manifest.new(
            model={
                "name": source.name,
                "task": source.task if processing is None else processing.decoder.task,
                "weights": source.weights,
                "symbol": source.file.name,
                "source": source.record,
            },
            profile=profile.raw,
            inputs=[
                Tensor(n, tuple(imported.input_shapes[n]), imported.input_dtypes[n])
                for n in imported.input_names
            ],
            outputs=[
                Tensor(n, tuple(s), d)
                for n, s, d in zip(
                    imported.output_names,
                    imported.output_shapes,
                    imported.output_dtypes,
                    strict=True,
                )
            ],
            classes=source.classes,
            sections=sections,  # preprocessing, decoder, and classes the source does not carry
            build={
                "kernels": kernel_files,
                "precision": options.precision.value,
                **built.facts,
                "launches": sum(not step.elided for step in plan.steps),
                "kernel_ops": built.kernel_ops,  # fused MXNet-level ops per kernel
                "tuning_databases": [str(f) for f in database.folders] if database else [],
                **memory_facts(plan),
                "constant_bytes": int(sum(a.nbytes for a in built.constants.values())),
                "timings_s": {k: round(v, 3) for k, v in timings.items()},
                "total_s": round(time.perf_counter() - started, 3),
            },
            versions={"edgecv": __version__, "tvm": tvm.__version__},
        )
        path = writer.commit(manifest)
    except BaseException:
        writer.abort()
        raise
    progress(f"wrote {path} ({manifest.launches} launches)")
    return path


def _with_calibration(
    options: BuildOptions, imported, destination: Path, preprocessing: dict
) -> BuildOptions:
    """``options`` with the calibration inputs read (now that the input shape is known)
    and the statistics of the package at ``destination``, if one is there to replace."""
    if len(imported.input_names) != 1:
        raise int8_step.CalibrationError(
            f"--precision int8 calibrates models with one input; this one has "
            f"{len(imported.input_names)} ({', '.join(imported.input_names)})"
        )
    name = imported.input_names[0]
    if imported.input_dtypes[name] != "float32":
        raise int8_step.CalibrationError(
            f"--precision int8 calibrates float32 inputs; input {name} is "
            f"{imported.input_dtypes[name]}"
        )
    inputs = int8_step.read_calibration(
        options.calibrate, imported.input_shapes[name], preprocessing, options.calibration_size
    )
    previous = None
    if package_manifest(destination) is not None:
        previous = int8_step.read_previous(destination)
    return dataclasses.replace(options, calibration=inputs, previous_calibration=previous)


def _write_kernels(write_kernels, writer: PackageWriter) -> dict[str, str]:
    """Kernel libraries that fail to link or write (no compiler, disk full) are reported
    as such, not as a traceback from TVM's export_library."""
    try:
        return write_kernels(writer)
    except EdgecvError:
        raise
    except Exception as err:
        raise EdgecvError(
            f"cannot write the compiled kernels into {writer.destination}: "
            f"{foreign_message(err)}; check that a C compiler (cc/g++) is installed and the "
            "disk has space"
        ) from None


def _renamed_device(profile, device: str | None):
    """``deploy(device=)``, the old name of ``profile=``: accepted with a warning."""
    if device is None:
        return "cpu" if profile is None else profile
    warnings.warn(
        "deploy(device=) is now deploy(profile=) (it names a device profile); device= "
        "goes in the next release",
        DeprecationWarning,
        stacklevel=3,
    )
    if profile is not None:
        raise ProfileError("deploy() takes profile= or its old name device=, not both")
    return device


def _profile_to_build(profile: str | Path | Profile, host: str | None) -> Profile:
    """The profile (loaded unless it is one already), refused when this version cannot
    build for it, with ``host="native"`` the CPU part for this machine."""
    if not isinstance(profile, Profile):
        profile = load_profile(profile)
    _check_buildable(profile)
    if host == "native":
        profile = profile.with_native_host()
    elif host is not None:
        raise ProfileError(f"--host accepts `native` only, not `{host}`")
    check_profile(profile)  # the native host may differ from the loaded one
    return profile


def _check_buildable(profile: Profile) -> None:
    if profile.runtime not in AVAILABLE_RUNTIMES:
        raise ProfileError(
            f"profile `{profile.name}` runs on the `{profile.runtime}` backend, which this version "
            f"of edgecv does not have yet (available: {', '.join(AVAILABLE_RUNTIMES)}); deploy "
            "with --device cpu"
        )


__all__ = ["BuildOptions", "EdgecvError", "deploy", "resolve_source"]
