"""``edgecv deploy``: model source -> imported graph -> plan + kernels -> package."""

from __future__ import annotations

import logging
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import tvm

from . import __version__
from .build.pipeline import build_cpu, lower
from .errors import EdgecvError, ProfileError, foreign_message
from .frontend import zoo
from .frontend.importer import from_mxnet
from .frontend.mxnet_graph import load_params, load_symbol
from .package import PackageWriter, check_destination
from .profiles import AVAILABLE_RUNTIMES, Profile, load_profile
from .source import resolve_source, source_record

log = logging.getLogger(__name__)


def deploy(
    model: str,
    output: str | Path | None = None,
    device: str = "cpu",
    params: str | None = None,
    input_shape: tuple[int, ...] | None = None,
    pretrained: bool = True,
    seed: int = 0,
    progress: Callable[[str], None] = lambda message: None,
    cpu_ops: Sequence[str] = (),
    gpu_only: bool = False,
    host: str | None = None,
    check_on: str | None = "auto",
    force: bool = False,
) -> Path:
    """Compile ``model`` for the device profile ``device`` and write a package.

    Parameters
    ----------
    model : str
        A zoo name or alias (``ssd_mobilenet``) or a path to ``*-symbol.json``.
    output : path, optional
        The package folder; ``./<model>-<device>`` by default.
    device : str
        A device profile name (see ``edgecv profiles``).
    params : str, optional
        Weights: export-style ``.params`` for a symbol file, ``save_parameters`` style
        for a zoo model.
    input_shape : tuple, optional
        NCHW input shape; the model's usual size by default.
    progress : callable
        Receives one line per stage (the CLI prints them).
    cpu_ops : list of str
        Operators (``box_nms``, ``argsort``, ...) to run on the CPU even where the GPU
        could run them.
    gpu_only : bool
        Refuse to fall back: fail with the list of launches that cannot run on the GPU.
    host : str, optional
        ``native`` compiles the CPU part for this machine instead of the profile's host
        CPU (to run a device package here).
    check_on : str or None
        An OpenCL device to compile the GPU program on at deploy time (``auto``: the
        package's default device, when this machine has it); kernels its compiler
        rejects move to the CPU with a warning. ``None`` skips the check.
    force : bool
        Replace an existing edgecv package at ``output``. Anything at ``output`` that is
        not an edgecv package is never replaced (:func:`~edgecv.package.check_destination`).

    Returns
    -------
    Path
        The package folder.
    """
    if output is not None:
        check_destination(output, force)  # before minutes of compiling, not after
    profile = load_profile(device)
    _check_buildable(profile)
    if host == "native":
        profile = profile.with_native_host()
    elif host is not None:
        raise ProfileError(f"--host accepts `native` only, not `{host}`")
    _check_profile(profile)
    started = time.perf_counter()
    timings: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="edgecv-export-") as tmp:
        progress(f"resolving {model}")
        t = time.perf_counter()
        source = resolve_source(model, Path(tmp), params, input_shape, pretrained, seed, progress)
        if output is None:
            check_destination(f"{source.name}-{profile.name}", force)
        timings["export_s"] = time.perf_counter() - t
        progress(f"importing {source.symbol_path.name} ({source.weights} weights)")
        t = time.perf_counter()
        graph = load_symbol(source.symbol_path)
        weights = load_params(source.params_path) if source.params_path else {}
        imported = from_mxnet(graph, weights, {"data": source.input_shape})
        timings["import_s"] = time.perf_counter() - t
    progress("lowering (Relax passes, fusion, memory plan)")
    lowered = lower(imported.mod)
    timings.update(lowered.timings)
    progress(f"compiling {len(lowered.kernels.functions)} kernels for {profile.name}")
    t = time.perf_counter()
    options = GpuOptions(list(cpu_ops), gpu_only, check_on)
    write_kernels, kernel_facts = _build_kernels(lowered, profile, progress, options)
    timings["build_s"] = time.perf_counter() - t

    output = Path(output) if output else Path(f"{source.name}-{profile.name}")
    writer = PackageWriter(output, force=force)
    try:
        kernel_files = _write_kernels(write_kernels, writer)
        plan = kernel_facts.pop("plan", lowered.plan)
        writer.write_text("plan.json", plan.to_json())
        writer.write_arrays("params.npz", lowered.constants)
        manifest = {
            "model": {
                "name": source.name,
                "task": source.task,
                "weights": source.weights,
                "symbol": source.symbol_path.name,
                "source": source_record(source, model, params, seed),
            },
            "profile": profile.raw,
            "inputs": [
                {
                    "name": n,
                    "shape": list(imported.input_shapes[n]),
                    "dtype": imported.input_dtypes[n],
                }
                for n in imported.input_names
            ],
            "outputs": [
                {"name": n, "shape": list(s), "dtype": d}
                for n, s, d in zip(
                    imported.output_names,
                    imported.output_shapes,
                    imported.output_dtypes,
                    strict=True,
                )
            ],
            "preprocessing": {
                "color": "RGB",
                "scale": 1.0 / 255.0,
                "mean": list(zoo.MEAN_RGB),
                "std": list(zoo.STD_RGB),
                "resize": "stretch",
            },
            "classes": source.classes,
            "versions": {"edgecv": __version__, "tvm": tvm.__version__},
            "build": {
                "kernels": kernel_files,
                **kernel_facts,
                "launches": len(plan.steps),
                "kernel_ops": lowered.kernel_ops,  # fused MXNet-level ops per kernel
                "intermediate_bytes": sum(plan.storage_sizes),
                "live_bytes_lower_bound": plan.live_bytes_lower_bound(),
                "constant_bytes": int(sum(a.nbytes for a in lowered.constants.values())),
                "timings_s": {k: round(v, 3) for k, v in timings.items()},
                "total_s": round(time.perf_counter() - started, 3),
            },
        }
        path = writer.commit(manifest)
    except BaseException:
        writer.abort()
        raise
    progress(f"wrote {path} ({len(plan.steps)} launches)")
    return path


def _check_profile(profile: Profile) -> None:
    """A profile whose target TVM rejects is the profile's fault: say so, before compiling."""
    try:
        profile.tvm_target()
        profile.host_target()
        profile.intel_subgroup_size  # noqa: B018  (validates gpu.subgroup_size)
    except Exception as err:  # TVM raises ValueError/TVMError on bad target fields
        raise ProfileError(
            f"device profile `{profile.name}` is malformed: {foreign_message(err)}; fix its "
            "target/host/gpu fields (see device_profiles/*.json)"
        ) from None


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


@dataclass
class GpuOptions:
    cpu_ops: list[str] = field(default_factory=list)
    gpu_only: bool = False
    check_on: str | None = "auto"


def _build_kernels(
    lowered, profile: Profile, progress: Callable[[str], None], options: GpuOptions
) -> tuple[Callable[[PackageWriter], dict[str, str]], dict]:
    """Compile the kernels for the profile's runtime.

    Returns how to write them into the package, and facts for the manifest's ``build``
    (with ``plan`` when placement changed the plan).
    """
    if profile.runtime in ("opencl", "cuda"):
        return _build_gpu_kernels(lowered, profile, progress, options)
    library = build_cpu(lowered.kernels, profile.tvm_target())

    def write_cpu(writer: PackageWriter) -> dict[str, str]:
        library.export_library(str(writer.path("kernels/cpu.so")))
        return {"cpu": "kernels/cpu.so"}

    return write_cpu, {}


def _subset(kernels: tvm.IRModule, names: set[str]) -> tvm.IRModule:
    return tvm.IRModule({gv: f for gv, f in kernels.functions.items() if gv.name_hint in names})


def _build_device_code(profile: Profile, kernels: tvm.IRModule, progress):
    target = profile.tvm_target()
    if profile.runtime == "opencl":
        from .build.opencl import build_opencl

        return build_opencl(kernels, target, profile.intel_subgroup_size)
    from .build.cuda import build_cuda

    progress(f"generating CUDA and compiling it with nvcc for {target.attrs['arch']}")
    return build_cuda(kernels, target)


def _build_gpu_kernels(lowered, profile: Profile, progress, options: GpuOptions):
    from .build.gpu import launches_to_json
    from .fallback import insert_copies, place

    device_code = _build_device_code(profile, lowered.kernels, progress)
    failed: dict[str, str] = {}
    while True:
        placement = place(
            lowered.plan,
            lowered.kernel_ops,
            profile.raw.get("gpu_ops", "all"),
            no_gpu_kernel=device_code.unsupported,
            gpu_build_failed=failed,
            cpu_ops=options.cpu_ops,
            gpu_only=options.gpu_only,
        )
        steps = lowered.plan.steps
        gpu_names = {s.kernel for s, d in zip(steps, placement.devices, strict=True) if d == "gpu"}
        cpu_names = {s.kernel for s, d in zip(steps, placement.devices, strict=True) if d == "cpu"}
        if gpu_names != set(device_code.launches):  # generate code for the GPU part only
            device_code = _build_device_code(profile, _subset(lowered.kernels, gpu_names), progress)
        newly_failed = _check_on_device(profile, device_code, options.check_on, progress)
        if not newly_failed:
            break
        failed.update(newly_failed)
    for node in placement.cpu_nodes:
        if node.reason == "gpu-build-failed":
            warnings.warn(
                f"{node.kernel} failed to compile on the device; it runs on the CPU",
                stacklevel=3,
            )
    plan, copies = insert_copies(lowered.plan, placement)
    progress(
        f"placement: {placement.on('gpu')} launches on the GPU, {placement.on('cpu')} on the "
        f"CPU, {len(copies)} device copies ({sum(c.nbytes for c in copies):,} bytes per run)"
    )
    cpu_library = None
    if cpu_names:
        host = profile.host_target()
        progress(f"compiling {len(cpu_names)} CPU fallback kernels for {host.attrs.get('mcpu')}")
        cpu_library = build_cpu(_subset(lowered.kernels, cpu_names), host)
    facts: dict = {"plan": plan, "placement": _placement_facts(plan, placement, copies)}
    if profile.runtime == "opencl":
        facts["requires"] = device_code.requires
    else:
        facts["cuda"] = {
            "arch": device_code.arch,
            "binaries": [k for k in ("cubin", "ptx") if getattr(device_code, k) is not None],
            "compile_on_device": device_code.cubin is None,
            "why_source_only": device_code.not_compiled_because,
        }
        if device_code.cubin is None:
            progress(
                f"shipping CUDA source only: {device_code.not_compiled_because}; the device "
                "compiles it with its own nvcc on first run (then cached)"
            )
    kind = profile.runtime

    def write(writer: PackageWriter) -> dict[str, str]:
        ext = "cl" if kind == "opencl" else "cu"
        files = {kind: f"kernels/{kind}.{ext}", f"{kind}_launches": f"kernels/{kind}_launches.json"}
        writer.write_text(files[kind], device_code.source)
        writer.write_text(files[f"{kind}_launches"], launches_to_json(device_code.launches))
        if kind == "cuda":
            if device_code.cubin is not None:
                files["cuda_cubin"] = f"kernels/cuda_{device_code.arch}.cubin"
                writer.path(files["cuda_cubin"]).write_bytes(device_code.cubin)
            if device_code.ptx is not None:
                files["cuda_ptx"] = f"kernels/cuda_{device_code.arch}.ptx"
                writer.write_text(files["cuda_ptx"], device_code.ptx)
        if cpu_library is not None:
            files["cpu"] = "kernels/cpu.so"
            try:
                cpu_library.export_library(str(writer.path(files["cpu"])))
            except Exception as err:
                raise EdgecvError(
                    f"cannot link the CPU fallback kernels for the profile's host "
                    f"({profile.host.get('mtriple', 'this machine')}): {str(err)[-300:]}. "
                    "Install a cross compiler for it, or pass --host native to run the "
                    "package on this machine"
                ) from None
        return files

    return write, facts


def _placement_facts(plan, placement, copies) -> dict:
    return {
        "launches": {"gpu": placement.on("gpu"), "cpu": placement.on("cpu")},
        "cpu_nodes": [
            {"kernel": n.kernel, "ops": n.ops, "reason": n.reason, "detail": n.detail}
            for n in placement.cpu_nodes
        ],
        "copies": [
            {
                "shape": list(c.shape),
                "dtype": c.dtype,
                "bytes": c.nbytes,
                "from": c.from_device,
                "to": c.to_device,
            }
            for c in copies
        ],  # fmt: skip
        "copy_bytes": sum(c.nbytes for c in copies),
        "intermediate_bytes": {
            device: sum(
                size
                for size, d in zip(plan.storage_sizes, plan.storage_devices, strict=True)
                if d == device
            )
            for device in ("gpu", "cpu")
        },
    }


def _check_on_device(profile: Profile, device_code, check_on, progress) -> dict[str, str]:
    """Compile the OpenCL program on a local device; return the kernels it rejects."""
    if profile.runtime != "opencl" or check_on is None or not device_code.launches:
        return {}
    from .runtime.opencl import ProgramBuildError, compile_on_device

    query = _default_opencl_device(profile.raw) if check_on == "auto" else check_on
    try:
        compile_on_device(query, device_code.source, device_code.requires)
    except ProgramBuildError as err:
        failing = err.kernels
        if not failing:
            raise
        kernels = {
            name
            for name, launches in device_code.launches.items()
            if any(launch.kernel in failing for launch in launches)
        }
        progress(f"{len(kernels)} kernel(s) failed to compile on `{query}`: moving to the CPU")
        return {name: str(err).splitlines()[0] for name in kernels}
    except EdgecvError as err:  # no such device here: nothing to check against
        progress(f"not compiled on a local device ({str(err).splitlines()[0][:120]})")
    return {}


def _default_opencl_device(profile_raw: dict) -> str:
    gpu = profile_raw.get("gpu", {})
    return "intel" if gpu.get("intel_subgroups") is True else ""


def _check_buildable(profile: Profile) -> None:
    if profile.runtime not in AVAILABLE_RUNTIMES:
        raise ProfileError(
            f"profile `{profile.name}` runs on the `{profile.runtime}` backend, which this version "
            f"of edgecv does not have yet (available: {', '.join(AVAILABLE_RUNTIMES)}); deploy "
            "with --device cpu"
        )


__all__ = ["EdgecvError", "deploy", "resolve_source"]
