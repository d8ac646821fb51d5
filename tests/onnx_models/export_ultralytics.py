"""Re-export the Ultralytics detectors the tests deploy: YOLOv8n and YOLO11n built from
their model files (no weights downloaded), exported by Ultralytics' own ONNX exporter as a
user would (``model.export(format="onnx")``: onnxslim's simplification on, as by default),
without NMS (the raw ``[1, 4 + 80, N]`` head) and with ``nms=True`` (the end-to-end
``[1, 300, 6]`` head), then committed without their weights (:func:`seeded.strip`).

Run with a Python that has torch and ``ultralytics`` (never a dependency of edgecv or of
its tests; ``.ci/run`` does not install them)::

    /work/torchenv/bin/python tests/onnx_models/export_ultralytics.py [NAME ...]

Random weights keep no box: Ultralytics starts its class-score biases at
``log(5 / 80 / (640 / stride)^2)`` (about -11, a prior for trained models), so every
score is below the exporter's confidence threshold (0.25) and an NMS head would return
zeros only. The export sets those biases to :data:`CLASS_BIAS` instead; the seeded fill
keeps a constant vector as it is, so on a standard normal input the NMS head keeps tens
of boxes (what the tests check it against ONNX Runtime on).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import onnx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from seeded import strip  # noqa: E402

OUT = HERE / "ultralytics"
OPSET = 17
CLASS_BIAS = -4.0
# file stem -> (model file, image size, with NMS)
MODELS = {
    "yolov8n_320": ("yolov8n.yaml", 320, False),
    "yolov8n_320_nms": ("yolov8n.yaml", 320, True),
    "yolov8n": ("yolov8n.yaml", 640, False),
    "yolov8n_nms": ("yolov8n.yaml", 640, True),
    "yolo11n": ("yolo11n.yaml", 640, False),
    "yolo11n_nms": ("yolo11n.yaml", 640, True),
}


def export(stem: str, yaml: str, size: int, nms: bool) -> Path:
    from ultralytics import YOLO

    model = YOLO(yaml)  # built from the model file, weights from torch's seeded init
    head = model.model.model[-1]
    for branch in head.cv3:
        branch[-1].bias.data[: head.nc] = CLASS_BIAS
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # the exporter writes into the working folder
        try:
            written = model.export(
                format="onnx", imgsz=size, opset=OPSET, nms=nms, simplify=True, dynamic=False
            )
            full = onnx.load(written)
        finally:
            os.chdir(here)
    OUT.mkdir(exist_ok=True)
    path = OUT / f"{stem}.onnx"
    onnx.save(_constants_kept(strip(_copy(full)), full), str(path))
    return path


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _constants_kept(stripped: onnx.ModelProto, full: onnx.ModelProto) -> onnx.ModelProto:
    """``stripped`` with the initializers no convolution reads as they were: the head's
    anchor points and strides are a grid, not weights, and a seeded fill would scatter the
    boxes (and flip those of a negative stride)."""
    weights = {
        n.input[i]
        for n in full.graph.node
        if n.op_type == "Conv"
        for i in (1, 2)[: len(n.input) - 1]
    }
    original = {t.name: t for t in full.graph.initializer}
    for tensor in stripped.graph.initializer:
        if tensor.name not in weights:
            tensor.CopyFrom(original[tensor.name])
    return stripped


def main() -> None:
    os.environ.setdefault("YOLO_OFFLINE", "1")  # nothing reaches the network
    os.environ.setdefault("YOLO_CONFIG_DIR", tempfile.mkdtemp())
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=list(MODELS), help="models to export")
    args = parser.parse_args()
    import torch

    for stem in args.names:
        torch.manual_seed(0)
        path = export(stem, *MODELS[stem])
        print(f"{path.name}: {path.stat().st_size / 1024:.1f} KiB")


if __name__ == "__main__":
    main()
