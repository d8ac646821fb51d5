"""Re-export the torchvision detectors the ONNX detection tests deploy, committed without
their weights (:func:`seeded.strip`) so each file is kilobytes.

Run with a Python that has torch and torchvision (never a dependency of edgecv or its
tests)::

    /work/torchenv/bin/python tests/onnx_models/export_detection.py [NAME ...]

Each detector is built without weights (``weights=None, weights_backbone=None``) and
exported by the TorchScript-based exporter (``dynamo=False``, opset 17), the path
torchvision's own ONNX tests take for its detectors: a fixed input size, batch 1, and
the post-processing (score threshold, top-k candidates, batched NMS by coordinate
offsets, the best ``detections_per_img``) traced into the graph with data-dependent
shapes, which edgecv replaces with fixed-size outputs
(:mod:`edgecv.frontend.onnx.torchvision_detection`). The score threshold is raised
from torchvision's default where seeded random weights would pass every candidate, so
the tests see fewer detections than the cap.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import onnx
import torch
import torchvision

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from seeded import strip  # noqa: E402

# name -> (input size, keyword arguments of the model's builder). RetinaNet and FCOS
# (builders taking min_size=max_size=320) export the same way; edgecv does not recognize
# their post-processing yet (candidates per feature level, boxes decoded after the top-k).
MODELS = {
    "ssdlite320_mobilenet_v3_large": (320, {"score_thresh": 0.03}),
    "ssd300_vgg16": (300, {"score_thresh": 0.05}),
}


def export(name: str, size: int, kwargs: dict, out: Path) -> Path:
    torch.manual_seed(0)
    net = torchvision.models.get_model(name, weights=None, weights_backbone=None, **kwargs)
    x = torch.rand(1, 3, size, size)
    with tempfile.TemporaryDirectory() as tmp:
        full = Path(tmp) / f"{name}.onnx"
        torch.onnx.export(
            net.eval(),
            (x,),
            str(full),
            input_names=["image"],
            output_names=["boxes", "scores", "labels"],
            opset_version=17,
            dynamo=False,
        )
        model = onnx.load(str(full))
    path = out / f"{name}.onnx"
    onnx.save(strip(model), str(path))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=list(MODELS), help="models to export")
    # beside, not among, the classifiers test_onnx_deploy.py deploys (onnx_models/*.onnx)
    parser.add_argument("--out", type=Path, default=HERE / "detection", help="folder")
    args = parser.parse_args()
    for name in args.names:
        size, kwargs = MODELS[name]
        path = export(name, size, kwargs, args.out)
        print(f"{path.name}: {path.stat().st_size / 1024:.1f} KiB")


if __name__ == "__main__":
    main()
