"""``edgecv.load(path)``: a deployed package, ready to run."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from .build.plan import Plan
from .errors import PackageError
from .imaging import Detection, detections, preprocess, top_k
from .package import read_manifest
from .runtime.cpu import CPUBackend
from .runtime.executor import Executor


class DeployedModel:
    """A loaded package: call :meth:`run` on tensors or :meth:`predict` on images."""

    def __init__(self, root: Path, manifest: dict):
        self.root = root
        self.manifest = manifest
        plan = Plan.from_json((root / "plan.json").read_text())
        with np.load(root / "params.npz") as npz:
            constants = {k: npz[k] for k in npz.files}
        kernels = manifest["build"]["kernels"]
        if "cpu" not in kernels:
            raise PackageError(f"{root} has no kernels for a backend this edgecv can run")
        t = time.perf_counter()
        self.executor = Executor(plan, CPUBackend.load(root / kernels["cpu"]), constants)
        self.load_s = time.perf_counter() - t

    @property
    def task(self) -> str:
        return self.manifest["model"]["task"]

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.manifest["inputs"][0]["shape"])

    @property
    def classes(self) -> list[str]:
        return self.manifest.get("classes", [])

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Run on raw input tensors (no preprocessing); outputs in the model's order."""
        return self.executor.run(list(inputs))

    def preprocess(self, image_bgr: np.ndarray) -> np.ndarray:
        return preprocess(image_bgr, self.manifest["preprocessing"], self.input_shape)

    def predict(self, image_bgr: np.ndarray, threshold: float = 0.5, k: int = 5):
        """Classify (top-k ``(label, prob)``) or detect (:class:`Detection` list) one image."""
        outputs = self.run(self.preprocess(image_bgr))
        if self.task == "classification":
            return top_k(outputs[0], self.classes, k)
        return detections(
            outputs, self.classes, self.input_shape[2:], image_bgr.shape[:2], threshold
        )


def load(path: str | Path) -> DeployedModel:
    """Load a package folder (or ``.tar.gz``) written by ``edgecv deploy``."""
    root, manifest = read_manifest(path)
    return DeployedModel(root, manifest)


__all__ = ["Detection", "DeployedModel", "load"]
