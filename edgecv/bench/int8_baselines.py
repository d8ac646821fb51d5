"""INT8 baselines: the ONNX export (:func:`.baselines.export_onnx`) quantized after
training by each toolkit's own post-training quantizer, on the same calibration inputs
edgecv's package was calibrated on where they can be found.

- ``openvino-int8``: NNCF's ``nncf.quantize`` (default preset: symmetric weights and
  activations, per-channel weights) on the OpenVINO model read from the export,
  compiled for the CPU as the float32 ``openvino`` baseline is.
- ``onnxruntime-int8``: ``onnxruntime.quantization.quantize_static`` (QDQ format,
  per-channel int8 weights, int8 activations, min/max calibration: its defaults but
  per-channel) on the export after ONNX Runtime's own pre-processing step
  (``quant_pre_process``: BatchNorm folded into the convolutions before quantizing, as
  its documentation recommends), loaded in ONNX Runtime like the float32 baseline.

The calibration inputs (:func:`calibration_set`): an INT8 package keeps only the
statistics of its calibration (``calibration.json``), with where they came from (the
``--calibrate`` folder or ``.npy``, how many inputs, their sha256). Those inputs are
read again from there with the package's preprocessing and the same seeded choice;
when the source is gone (or the package is float32) a seeded set of preprocessed
sample photos stands in. Each baseline's notes say which was used.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..board.errors import foreign_message
from .baselines import Baseline, BaselineUnavailable, _module, _Warnings, openvino_baseline

# Sample photos of the stand-in calibration set: colour photos that ship with
# scikit-image (no download).
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket")
STAND_IN_INPUTS = 16


@dataclass
class CalibrationSet:
    arrays: np.ndarray  # (N, *input shape), float32, preprocessed
    note: str  # which inputs these are, for the report


def calibration_set(model) -> CalibrationSet:
    """The inputs the INT8 baselines are calibrated on (module docstring)."""
    from ..pipelines.int8 import CalibrationError, read_calibration

    recorded = model.manifest.quantization.get("calibration")
    why = "the package is not INT8"
    if recorded:
        source = recorded.get("source")
        try:
            inputs = read_calibration(
                source, model.input_shape, model.manifest.preprocessing, recorded["inputs"]
            )
        except (CalibrationError, KeyError, TypeError) as err:
            why = f"its calibration source {source} cannot be read again ({err})"
        else:
            what = f"{len(inputs.arrays)} input(s) from {source}"
            if inputs.sha256 == recorded.get("sha256"):
                note = f"the package's calibration inputs: {what} (same sha256)"
            else:
                note = (
                    f"{what}, read again from the package's --calibrate source, which has "
                    "changed since (sha256 differs): not quite the package's inputs"
                )
            return CalibrationSet(inputs.arrays, note)
    arrays = stand_in_inputs(model)
    kind = "sample photos" if _takes_images(model.input_shape) else "standard-normal inputs"
    note = f"{len(arrays)} seeded preprocessed {kind} (not the package's: {why})"
    return CalibrationSet(arrays, note)


def _takes_images(shape) -> bool:
    return len(shape) == 4 and shape[1] == 3


def stand_in_inputs(model, count: int = STAND_IN_INPUTS, seed: int = 0) -> np.ndarray:
    """``count`` preprocessed inputs: seeded crops (and mirror images) of scikit-image's
    colour photos; seeded standard-normal noise for inputs that are not images."""
    rng = np.random.RandomState(seed)
    shape = tuple(model.input_shape)
    if not _takes_images(shape):
        return rng.standard_normal((count, *shape)).astype(np.float32)
    import skimage.data

    photos = [np.ascontiguousarray(getattr(skimage.data, n)()[:, :, ::-1]) for n in PHOTOS]
    arrays = []
    for i in range(count):
        photo = photos[i % len(photos)]
        h, w = photo.shape[:2]
        side = rng.uniform(0.6, 1.0)
        ch, cw = int(h * side), int(w * side)
        top, left = rng.randint(0, h - ch + 1), rng.randint(0, w - cw + 1)
        crop = photo[top : top + ch, left : left + cw]
        if rng.rand() < 0.5:
            crop = crop[:, ::-1]
        arrays.append(model.preprocess(np.ascontiguousarray(crop)))
    return np.stack(arrays).astype(np.float32)


def openvino_int8_baseline(onnx_path: Path, calibration: CalibrationSet, streams: int = 1):
    """The export quantized by NNCF (default preset) on ``calibration``, on OpenVINO's CPU
    plugin set up as the float32 baseline is (:func:`.baselines.openvino_baseline`)."""
    ov = _module("openvino", "pip install 'edgecv[bench]'")
    nncf = _module("nncf", "pip install 'edgecv[bench]'")
    start = time.perf_counter()
    try:
        model = ov.Core().read_model(str(onnx_path))
    except Exception as err:
        msg = f"cannot read the ONNX export: {foreign_message(err)[:200]}"
        raise BaselineUnavailable(msg) from None
    items = list(calibration.arrays)
    try:
        quantized = nncf.quantize(model, nncf.Dataset(items), subset_size=len(items))
    except Exception as err:
        msg = f"NNCF could not quantize the model: {foreign_message(err)[:200]}"
        raise BaselineUnavailable(msg) from None
    quantize_s = time.perf_counter() - start
    baseline = openvino_baseline(quantized, streams, name="openvino-int8")
    baseline.load_s += quantize_s
    baseline.notes[:0] = [
        f"NNCF {nncf.__version__} post-training quantization, default preset, calibrated "
        f"in {quantize_s:.1f} s on {calibration.note}",
    ]
    return baseline


def _onnx_names_for_ort_quantization(onnx) -> list[str]:
    """ONNX Runtime's quantization tools name ``TensorProto.INT4`` and ``UINT4`` in a
    table built when they are imported; the onnx that MXNet's exporter needs (< 1.15)
    predates them (1.16), and the import fails. Both are given their ONNX values (22,
    21) when missing: 4-bit types this baseline never makes. Returns a note if so."""
    missing = [n for n in ("UINT4", "INT4") if not hasattr(onnx.TensorProto, n)]
    for n in missing:
        setattr(onnx.TensorProto, n, {"UINT4": 21, "INT4": 22}[n])
    if not missing:
        return []
    return [
        f"onnx {onnx.__version__} lacks TensorProto.{'/'.join(missing)}, which ONNX Runtime's "
        "quantization tools name on import: given their ONNX values (4-bit types, unused)"
    ]


def onnxruntime_int8_baseline(
    onnx_path: Path, calibration: CalibrationSet, work: Path, streams: int = 1
) -> Baseline:
    """The export quantized by ``quantize_static`` (QDQ, per-channel int8 weights) on
    ``calibration``, in ONNX Runtime set up as the float32 baseline is."""
    _module("onnxruntime", "pip install 'edgecv[bench]'")
    onnx = _module("onnx", "pip install 'edgecv[bench]'")
    notes = _onnx_names_for_ort_quantization(onnx)
    try:
        from onnxruntime import quantization as q
    except Exception as err:
        msg = f"cannot import onnxruntime.quantization: {foreign_message(err)[:200]}"
        raise BaselineUnavailable(msg) from None

    from .baselines import onnxruntime_baseline

    start = time.perf_counter()
    # MXNet's exporter lists every initializer as a graph input too, which keeps ONNX
    # Runtime from treating the weights as constants (no BatchNorm folded): not here
    model = onnx.load(str(onnx_path))
    weights = {t.name for t in model.graph.initializer}
    kept = [i for i in model.graph.input if i.name not in weights]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    source = work / "model-int8-source.onnx"
    onnx.save(model, str(source))
    name = kept[0].name

    class Reader(q.CalibrationDataReader):
        def __init__(self):
            self.items = iter([{name: x} for x in calibration.arrays])

        def get_next(self):
            return next(self.items, None)

    prepared = work / "model-int8-prepared.onnx"
    out = work / "model-int8.onnx"
    root = logging.getLogger()
    handlers, collected = root.handlers, _Warnings()
    root.handlers = [collected]  # the quantizer's warnings into the notes, not onto stderr
    try:
        try:  # ORT's recommended step before quantizing: shapes, BatchNorm folded
            q.quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
            source = prepared
        except Exception as err:
            why = foreign_message(err)[:160]
            notes.append(f"quant_pre_process failed, quantized the export as it is: {why}")
        q.quantize_static(
            str(source), str(out), Reader(), quant_format=q.QuantFormat.QDQ, per_channel=True
        )
    except Exception as err:
        msg = f"quantize_static failed: {foreign_message(err)[:200]}"
        raise BaselineUnavailable(msg) from None
    finally:
        root.handlers = handlers
    notes += [f"quantize_static warned: {m[:200]}" for m in dict.fromkeys(collected.messages)]
    quantize_s = time.perf_counter() - start
    baseline = onnxruntime_baseline(out, streams, name="onnxruntime-int8")
    baseline.load_s += quantize_s
    baseline.notes[:0] = [
        "quantize_static: QDQ, per-channel int8 weights, int8 activations, min/max "
        f"calibration in {quantize_s:.1f} s on {calibration.note}",
        *notes,
    ]
    return baseline


__all__ = [
    "CalibrationSet",
    "calibration_set",
    "onnxruntime_int8_baseline",
    "openvino_int8_baseline",
    "stand_in_inputs",
]
