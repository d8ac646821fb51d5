"""``edgecv deploy``: model source -> imported graph -> plan + kernels -> package."""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import tvm

from . import __version__
from .build.pipeline import build_cpu, lower
from .errors import EdgecvError, ModelNotFoundError, ProfileError
from .frontend import zoo
from .frontend.importer import from_mxnet
from .frontend.mxnet_graph import load_params, load_symbol
from .package import PackageWriter
from .profiles import AVAILABLE_RUNTIMES, Profile, load_profile

log = logging.getLogger(__name__)


def resolve_source(
    model: str,
    work_dir: Path,
    params: str | None = None,
    input_shape: tuple[int, ...] | None = None,
    pretrained: bool = True,
    seed: int = 0,
) -> zoo.ExportedModel:
    """A zoo name/alias is exported to ``work_dir``; a ``*-symbol.json`` path is used as is."""
    if model.endswith(".json"):
        symbol = Path(model)
        if not symbol.is_file():
            raise ModelNotFoundError(f"symbol file {symbol} does not exist")
        if params is None:
            guess = Path(str(symbol).removesuffix("-symbol.json") + "-0000.params")
            if not guess.is_file():
                raise ModelNotFoundError(
                    f"no params given for {symbol} and {guess.name} is not beside it; pass --params"
                )
            params = str(guess)
        name = symbol.name.removesuffix(".json").removesuffix("-symbol")
        shape = tuple(input_shape) if input_shape else (1, 3, 224, 224)
        task = "detection" if _looks_like_detector(symbol) else "classification"
        return zoo.ExportedModel(name, task, symbol, Path(params), shape, [], "params-file")
    return zoo.export(
        model,
        work_dir,
        params_file=params,
        input_shape=input_shape,
        pretrained=pretrained,
        seed=seed,
    )


def _looks_like_detector(symbol: Path) -> bool:
    text = symbol.read_text()
    return "_contrib_box_nms" in text or "_contrib_MultiBoxDetection" in text


def deploy(
    model: str,
    output: str | Path | None = None,
    device: str = "cpu",
    params: str | None = None,
    input_shape: tuple[int, ...] | None = None,
    pretrained: bool = True,
    seed: int = 0,
    progress: Callable[[str], None] = lambda message: None,
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

    Returns
    -------
    Path
        The package folder.
    """
    profile = load_profile(device)
    _check_buildable(profile)
    started = time.perf_counter()
    timings: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="edgecv-export-") as tmp:
        progress(f"resolving {model}")
        t = time.perf_counter()
        source = resolve_source(model, Path(tmp), params, input_shape, pretrained, seed)
        timings["export_s"] = time.perf_counter() - t
        progress(f"importing {source.symbol_path.name} ({source.weights} weights)")
        t = time.perf_counter()
        graph = load_symbol(source.symbol_path)
        weights = load_params(source.params_path)
        imported = from_mxnet(graph, weights, {"data": source.input_shape})
        timings["import_s"] = time.perf_counter() - t
    progress("lowering (Relax passes, fusion, memory plan)")
    lowered = lower(imported.mod)
    timings.update(lowered.timings)
    progress(f"compiling {len(lowered.kernels.functions)} kernels for {profile.name}")
    t = time.perf_counter()
    write_kernels, kernel_facts = _build_kernels(lowered, profile, progress)
    timings["build_s"] = time.perf_counter() - t

    output = Path(output) if output else Path(f"{source.name}-{profile.name}")
    writer = PackageWriter(output)
    try:
        kernel_files = write_kernels(writer)
        writer.write_text("plan.json", lowered.plan.to_json())
        writer.write_arrays("params.npz", lowered.constants)
        plan = lowered.plan
        manifest = {
            "model": {
                "name": source.name,
                "task": source.task,
                "weights": source.weights,
                "symbol": source.symbol_path.name,
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


def _build_kernels(
    lowered, profile: Profile, progress: Callable[[str], None]
) -> tuple[Callable[[PackageWriter], dict[str, str]], dict]:
    """Compile the kernels for the profile's runtime.

    Returns how to write them into the package, and facts for the manifest's ``build``.
    """
    if profile.runtime in ("opencl", "cuda"):
        return _build_gpu_kernels(lowered, profile, progress)
    library = build_cpu(lowered.kernels, profile.tvm_target())

    def write_cpu(writer: PackageWriter) -> dict[str, str]:
        library.export_library(str(writer.path("kernels/cpu.so")))
        return {"cpu": "kernels/cpu.so"}

    return write_cpu, {}


def _build_gpu_kernels(lowered, profile: Profile, progress: Callable[[str], None]):
    from .build.gpu import launches_to_json

    target = profile.tvm_target()
    if profile.runtime == "opencl":
        from .build.opencl import build_opencl

        kernels = build_opencl(lowered.kernels, target)
        facts = {"requires": kernels.requires}
    else:
        from .build.cuda import build_cuda

        progress(f"generating CUDA and compiling it with nvcc for {target.attrs['arch']}")
        kernels = build_cuda(lowered.kernels, target)
        facts = {
            "cuda": {
                "arch": kernels.arch,
                "binaries": [k for k in ("cubin", "ptx") if getattr(kernels, k) is not None],
                "compile_on_device": kernels.cubin is None,
                "why_source_only": kernels.not_compiled_because,
            }
        }
        if kernels.cubin is None:
            progress(
                f"shipping CUDA source only: {kernels.not_compiled_because}; the device "
                "compiles it with its own nvcc on first run (then cached)"
            )
    if kernels.unsupported:
        listed = "; ".join(f"`{k}`: {why}" for k, why in sorted(kernels.unsupported.items()))
        raise EdgecvError(
            f"{len(kernels.unsupported)} kernel(s) cannot run on {profile.runtime} yet "
            f"({listed}). Deploy this model with --device cpu until CPU fallback lands."
        )
    kind = profile.runtime

    def write(writer: PackageWriter) -> dict[str, str]:
        ext = "cl" if kind == "opencl" else "cu"
        files = {kind: f"kernels/{kind}.{ext}", f"{kind}_launches": f"kernels/{kind}_launches.json"}
        writer.write_text(files[kind], kernels.source)
        writer.write_text(files[f"{kind}_launches"], launches_to_json(kernels.launches))
        if kind == "cuda":
            if kernels.cubin is not None:
                files["cuda_cubin"] = f"kernels/cuda_{kernels.arch}.cubin"
                writer.path(files["cuda_cubin"]).write_bytes(kernels.cubin)
            if kernels.ptx is not None:
                files["cuda_ptx"] = f"kernels/cuda_{kernels.arch}.ptx"
                writer.write_text(files["cuda_ptx"], kernels.ptx)
        return files

    return write, facts


def _check_buildable(profile: Profile) -> None:
    if profile.runtime not in AVAILABLE_RUNTIMES:
        raise ProfileError(
            f"profile `{profile.name}` runs on the `{profile.runtime}` backend, which this version "
            f"of edgecv does not have yet (available: {', '.join(AVAILABLE_RUNTIMES)}); deploy "
            "with --device cpu"
        )


__all__ = ["EdgecvError", "deploy", "resolve_source"]
