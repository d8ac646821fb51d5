"""The baselines `edgecv bench --vs` names, built in one place: the float32 runtimes of
:mod:`.baselines` and the INT8 ones of :mod:`.int8_baselines` (which build on them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..board.errors import foreign_message
from . import int8_baselines
from .baselines import (
    KNOWN,
    Baseline,
    BaselineUnavailable,
    export_onnx,
    mxnet_baseline,
    onnxruntime_baseline,
    openvino_baseline,
)


def build_baselines(
    names: list[str],
    symbol: Path,
    params: Path | None,
    shape: tuple[int, ...],
    work: Path,
    streams: int = 1,
    calibration: Callable[[], object] | None = None,
) -> tuple[list[Baseline], dict[str, str]]:
    """The baselines ``names`` that load, and the reason for each that does not; set up
    for ``streams`` concurrent callers (module docstring). ``symbol``: the source model,
    an ONNX file (``params`` None: ONNX Runtime and OpenVINO read it as it is) or an
    MXNet symbol file (exported to ONNX for them). ``calibration``: gives the INT8
    baselines' calibration inputs (a :class:`.int8_baselines.CalibrationSet`), called
    once, when the first of them is built."""
    built, failed = [], {}
    onnx_source = params is None and symbol.suffix.lower() == ".onnx"
    # the ONNX file, made once for every runtime that needs it
    exported: list = [(symbol, [])] if onnx_source else []
    calibrated: list = []
    for name in names:
        try:
            if name == "mxnet" and onnx_source:
                raise BaselineUnavailable(
                    "the package was deployed from an ONNX file, which MXNet does not read"
                )
            if name in KNOWN[1:] and not exported:
                exported.append(export_onnx(symbol, params, shape, work))
            if name == "mxnet" and streams > 1:
                raise BaselineUnavailable(
                    "MXNet's Gluon forward pass is not safe from several threads; "
                    "time it without --streams"
                )
            if name.endswith("-int8") and not calibrated:
                if calibration is None:
                    raise BaselineUnavailable("no calibration inputs were given")
                calibrated.append(calibration())
            if name == "mxnet":
                built.append(mxnet_baseline(symbol, params, shape))
            elif name in ("onnxruntime", "openvino"):
                path, notes = exported[0]
                loader = onnxruntime_baseline if name == "onnxruntime" else openvino_baseline
                built.append(loader(path, streams))
                built[-1].notes = notes + built[-1].notes
            elif name == "openvino-int8":
                path, notes = exported[0]
                built.append(int8_baselines.openvino_int8_baseline(path, calibrated[0], streams))
                built[-1].notes = notes + built[-1].notes
            elif name == "onnxruntime-int8":
                path, notes = exported[0]
                built.append(
                    int8_baselines.onnxruntime_int8_baseline(path, calibrated[0], work, streams)
                )
                built[-1].notes = notes + built[-1].notes
            else:
                failed[name] = f"unknown baseline; known: {', '.join(KNOWN)}"
        except BaselineUnavailable as err:
            failed[name] = str(err)
        except Exception as err:  # a baseline's own failure must not end the bench
            failed[name] = f"failed: {type(err).__name__}: {foreign_message(err)[:200]}"
    return built, failed
