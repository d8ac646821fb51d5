"""Baseline runtimes built from a package's source model (MXNet symbol + params).

Each builder returns a :class:`Baseline` or raises :class:`BaselineUnavailable` with
the reason (not installed, export failed, load failed): ``edgecv bench`` lists those
and goes on. ONNX Runtime and OpenVINO run the package's source ONNX file, or for an
MXNet source the ONNX file MXNet's own exporter writes (``mx.onnx.export_model``, which
reads ``onnx.mapping``, given back for onnx 1.15 and newer by
:func:`_onnx_mapping_for_mxnet`). OpenVINO runs in FP32: on CPUs with AVX-512 BF16 it
would pick bf16 by default, which is not the comparison we want.

With ``streams`` > 1 (``edgecv bench --streams N``, N concurrent callers) each is set
up the way its own documentation says to serve them: OpenVINO with
``PERFORMANCE_HINT=THROUGHPUT`` (it picks its streams) and an infer request per
caller; ONNX Runtime's one session, whose ``run`` is safe from several threads, with
the cores split between the callers (``intra_op_num_threads`` = cores / N, as edgecv
splits them between its streams). MXNet's Gluon forward pass is not safe to call
from several threads, so it is not timed there.
"""

from __future__ import annotations

import importlib
import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._mxnet import import_mxnet
from ..board.errors import EdgecvError, foreign_message
from ..board.runtime.cpu import pool_threads

# openvino-int8, onnxruntime-int8: the export quantized by NNCF / quantize_static
# (:mod:`.int8_baselines`)
KNOWN = ("mxnet", "onnxruntime", "openvino", "openvino-int8", "onnxruntime-int8")


class BaselineUnavailable(EdgecvError):
    """A baseline runtime that is not installed or cannot run this model."""


@dataclass
class Baseline:
    name: str
    version: str
    run: Callable[[np.ndarray], list[np.ndarray]]
    load_s: float
    notes: list[str] = field(default_factory=list)  # what its model lacks (export warnings)
    # a run function for one more concurrent caller (OpenVINO: its own infer request);
    # None: ``run`` itself is safe from several threads
    new_caller: Callable[[], Callable[[np.ndarray], list[np.ndarray]]] | None = None
    # OpenVINO's compiled model, for its own async infer requests (`bench --video`)
    compiled: object | None = None

    def callers(self, count: int) -> list[Callable[[np.ndarray], list[np.ndarray]]]:
        """A run function for each of ``count`` concurrent callers."""
        return [self.new_caller() if self.new_caller else self.run for _ in range(count)]


def _module(name: str, hint: str):
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise BaselineUnavailable(f"not installed ({err.name}); {hint}") from None


def mxnet_baseline(symbol: Path, params: Path, shape: tuple[int, ...]) -> Baseline:
    mx = import_mxnet()
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = mx.gluon.SymbolBlock.imports(str(symbol), ["data"], str(params))
    net.hybridize(static_alloc=True, static_shape=True)

    def run(x: np.ndarray) -> list[np.ndarray]:
        out = net(mx.nd.array(x))
        return [o.asnumpy() for o in (out if isinstance(out, (list, tuple)) else [out])]

    run(np.zeros(shape, np.float32))  # builds the cached graph: part of loading
    return Baseline("mxnet", mx.__version__, run, time.perf_counter() - start)


class _Warnings(logging.Handler):
    """Collects the warnings a library logs (MXNet's exporter logs to the root logger)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(" ".join(record.getMessage().split()))


def _onnx_mapping_for_mxnet() -> None:
    """Give onnx back the ``onnx.mapping`` module MXNet 1.9.1's exporter reads.

    onnx 1.15 removed it; edgecv pins one newer onnx for everything (its ONNX frontend
    reads PyTorch 2.x exports, whose opsets onnx 1.14 does not know), and the exporter
    reads only these two dtype tables from it, rebuilt here from ``onnx.helper``.
    """
    import sys
    import types

    import onnx

    if hasattr(onnx, "mapping"):
        return
    names = "float16 float32 float64 int8 int16 int32 int64 uint8 uint16 uint32 uint64 bool"
    to_tensor = {
        np.dtype(n): onnx.helper.np_dtype_to_tensor_dtype(np.dtype(n)) for n in names.split()
    }
    mapping = types.ModuleType("onnx.mapping")
    mapping.NP_TYPE_TO_TENSOR_TYPE = to_tensor
    mapping.TENSOR_TYPE_TO_NP_TYPE = {t: d for d, t in to_tensor.items()}
    sys.modules["onnx.mapping"] = onnx.mapping = mapping


def export_onnx(
    symbol: Path, params: Path, shape: tuple[int, ...], out: Path
) -> tuple[Path, list[str]]:
    """The model as ONNX, written by MXNet's exporter, and the exporter's warnings (where
    the ONNX model does not do what MXNet does, e.g. box_nms across classes)."""
    _module("onnx", "pip install 'edgecv[compiler]'")
    _onnx_mapping_for_mxnet()
    mx = import_mxnet()
    path = out / "model.onnx"
    root = logging.getLogger()
    handlers, collected = root.handlers, _Warnings()
    root.handlers = [collected]  # into the report, not onto stderr as edgecv's own lines
    try:
        # Given file names, the exporter reads `<symbol prefix>-0000.params` and needs
        # `arg:` names; given objects, it exports exactly the files the package came from.
        graph = mx.sym.load(str(symbol))
        arrays = {n.split(":", 1)[-1]: a for n, a in mx.nd.load(str(params)).items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mx.onnx.export_model(graph, arrays, [shape], [np.float32], onnx_file_path=str(path))
    except Exception as err:
        raise BaselineUnavailable(
            f"MXNet's ONNX export failed: {foreign_message(err)[:200]}"
        ) from None
    finally:
        root.handlers = handlers
    notes = [f"MXNet's ONNX export warned: {m[:240]}" for m in dict.fromkeys(collected.messages)]
    return path, notes


def onnxruntime_baseline(onnx_path: Path, streams: int = 1, name: str = "onnxruntime") -> Baseline:
    ort = _module("onnxruntime", "pip install 'edgecv[bench]'")
    start = time.perf_counter()
    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, pool_threads() // streams)
    options.log_severity_level = 3  # not one warning per initializer of an MXNet export
    try:
        session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    except Exception as err:
        msg = f"cannot load the ONNX export: {foreign_message(err)[:200]}"
        raise BaselineUnavailable(msg) from None
    input_name = session.get_inputs()[0].name

    def run(x: np.ndarray) -> list[np.ndarray]:
        return list(session.run(None, {input_name: x}))

    baseline = Baseline(name, ort.__version__, run, time.perf_counter() - start)
    if streams > 1:
        baseline.notes.append(
            f"{streams} callers share one session, {options.intra_op_num_threads} "
            "intra-op thread(s) each run"
        )
    return baseline


def _open_opencl_runtimes_first() -> None:
    """Load the OpenCL runtimes before OpenVINO: its wheel bundles an older TBB, and once
    that is in the process Intel's CPU OpenCL runtime no longer loads (an undefined TBB
    symbol; the ICD loader skips it quietly), so an OpenCL package benchmarked or
    deployed after an OpenVINO baseline would not find its device. Loaded first, the
    runtime's newer TBB serves both."""
    from ..board.runtime.opencl_devices import opencl_devices

    opencl_devices()


def openvino_baseline(onnx_path, streams: int = 1, name: str = "openvino") -> Baseline:
    """``onnx_path``: the ONNX file, or an ``openvino.Model`` (NNCF's quantized one)."""
    _open_opencl_runtimes_first()
    ov = _module("openvino", "pip install 'edgecv[bench]'")
    start = time.perf_counter()
    config = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": pool_threads()}
    if streams > 1:
        config["PERFORMANCE_HINT"] = "THROUGHPUT"
    try:
        model = str(onnx_path) if isinstance(onnx_path, (str, Path)) else onnx_path
        compiled = ov.Core().compile_model(model, "CPU", config)
    except Exception as err:
        msg = f"cannot load the ONNX export: {foreign_message(err)[:200]}"
        raise BaselineUnavailable(msg) from None
    outputs = compiled.outputs

    def new_caller() -> Callable[[np.ndarray], list[np.ndarray]]:
        request = compiled.create_infer_request()

        def run(x: np.ndarray) -> list[np.ndarray]:
            result = request.infer([x])
            return [np.array(result[o]) for o in outputs]

        return run

    version = ov.get_version().split("-")[0]
    baseline = Baseline(name, version, new_caller(), time.perf_counter() - start)
    baseline.new_caller, baseline.compiled = new_caller, compiled
    if streams > 1:
        chosen = compiled.get_property("NUM_STREAMS")
        requests = compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")
        baseline.notes.append(
            f"PERFORMANCE_HINT=THROUGHPUT chose {chosen} stream(s), optimal infer requests "
            f"{requests}; {streams} callers, an infer request each"
        )
    return baseline
