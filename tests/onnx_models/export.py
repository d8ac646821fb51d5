"""Re-export the ONNX graphs the tests deploy: real torchvision architectures, committed
without their weights so each file is kilobytes.

Run with a Python that has torch and torchvision (never a dependency of edgecv or its
tests; ``.ci/run`` does not install them)::

    /work/torchenv/bin/python tests/onnx_models/export.py [NAME ...]

Each model is built with torchvision's random initialization (no download), exported by
``torch.onnx.export`` as a user would (the torch.export-based exporter, opset 18 or newer,
weights in an external data file), and then every float initializer of more than
:data:`seeded.KEPT_ELEMENTS` elements is emptied: its name, dims and dtype stay, its data
goes, and its doc string keeps the mean and standard deviation of the values it had
(:func:`seeded.strip`). The tests fill each one from a seed with those statistics
(:func:`seeded.filled`) before deploying, and ONNX Runtime reads the same filled file.
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

# name -> input size; the batch dimension is exported symbolic where marked
MODELS = {
    "resnet50": (224, True),
    "mobilenet_v3_large": (224, False),
    "mobilenet_v3_small": (224, False),
    "resnet18": (224, False),
    "efficientnet_b0": (224, False),
    "regnet_y_400mf": (224, False),
    "squeezenet1_1": (224, False),
    "shufflenet_v2_x1_0": (224, False),
    "convnext_tiny": (224, False),
}


def export(name: str, size: int, symbolic_batch: bool, out: Path) -> Path:
    torch.manual_seed(0)
    net = torchvision.models.get_model(name, weights=None).eval()
    x = torch.randn(1, 3, size, size)
    with tempfile.TemporaryDirectory() as tmp:
        full = Path(tmp) / f"{name}.onnx"  # weights in the external file beside it
        batch = {"x": {0: torch.export.Dim("batch")}} if symbolic_batch else None
        # torch.export-based, the default exporter since PyTorch 2.9 (as users export)
        torch.onnx.export(
            net,
            (x,),
            str(full),
            input_names=["input"],
            output_names=["logits"],
            dynamic_shapes=batch,
            dynamo=True,
        )
        model = onnx.load(str(full))
    path = out / f"{name}.onnx"
    onnx.save(strip(model), str(path))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "names", nargs="*", default=list(MODELS),
        help="models to export (any of torchvision's classifiers: 224x224, inception 299)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=HERE, help="folder")
    args = parser.parse_args()
    for name in args.names:
        size, symbolic = MODELS.get(name, (299 if name == "inception_v3" else 224, False))
        path = export(name, size, symbolic, args.out)
        print(f"{path.name}: {path.stat().st_size / 1024:.1f} KiB")


if __name__ == "__main__":
    main()
