"""``edgecv deploy``: model source -> imported graph -> plan + kernels -> package."""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import tvm

from . import __version__
from .errors import EdgecvError, ModelNotFoundError, ProfileError
from .frontend import zoo
from .frontend.importer import from_mxnet
from .frontend.mxnet_graph import load_params, load_symbol
from .package import PackageWriter
from .pipelines import BuildOptions, pipeline_for
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
    host: str | None = None,
    options: BuildOptions | None = None,
    cpu_ops: Sequence[str] = (),
    gpu_only: bool = False,
    check_on: str | None = "auto",
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
    host : str, optional
        ``native`` compiles the CPU part for this machine instead of the profile's host
        CPU (to run a device package here).
    options : BuildOptions, optional
        What the build may change: ``--cpu-ops``, ``--gpu-only``, the device check, the
        GPU versions of edgecv's operators, tuning databases, the time limit per kernel
        (see :class:`edgecv.pipelines.BuildOptions`).
    cpu_ops, gpu_only, check_on
        Shorthands for the same fields of ``options`` when ``options`` is not given.

    Returns
    -------
    Path
        The package folder.
    """
    profile = load_profile(device)
    _check_buildable(profile)
    if host == "native":
        profile = profile.with_native_host()
    elif host is not None:
        raise ProfileError(f"--host accepts `native` only, not `{host}`")
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
    options = options or BuildOptions(list(cpu_ops), gpu_only, check_on)
    built = pipeline_for(profile.runtime).build(imported.mod, profile, options, progress)
    timings.update(built.timings)
    plan = built.plan

    output = Path(output) if output else Path(f"{source.name}-{profile.name}")
    writer = PackageWriter(output)
    try:
        kernel_files = built.write(writer)
        writer.write_text("plan.json", plan.to_json())
        writer.write_arrays("params.npz", built.constants)
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
                **built.facts,
                "launches": len(plan.steps),
                "intermediate_bytes": sum(plan.storage_sizes),
                "live_bytes_lower_bound": plan.live_bytes_lower_bound(),
                "constant_bytes": int(sum(a.nbytes for a in built.constants.values())),
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


def _check_buildable(profile: Profile) -> None:
    if profile.runtime not in AVAILABLE_RUNTIMES:
        raise ProfileError(
            f"profile `{profile.name}` runs on the `{profile.runtime}` backend, which this version "
            f"of edgecv does not have yet (available: {', '.join(AVAILABLE_RUNTIMES)}); deploy "
            "with --device cpu"
        )


__all__ = ["BuildOptions", "EdgecvError", "deploy", "resolve_source"]
