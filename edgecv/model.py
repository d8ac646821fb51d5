"""``edgecv.load(path)``: a deployed package, ready to run.

A loaded model may be shared by threads: ``run`` borrows one of the model's
``streams`` execution contexts (its own activation memory and launches, see
:mod:`.runtime.executor`) and calls beyond ``streams`` wait for one, so a result is
never computed in memory another call is writing.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from .errors import PackageError
from .imaging import Detection, detections, preprocess, top_k
from .package import read_manifest
from .package_format import Plan
from .runtime.cpu import CPUBackend
from .runtime.executor import Executor, check_streams
from .runtime.host import check_host


class DeployedModel:
    """A loaded package: call :meth:`run` on tensors or :meth:`predict` on images, from
    any thread (up to ``streams`` calls run at once, the others wait)."""

    def __init__(self, root: Path, manifest: dict, on: str | None = None, streams: int = 1):
        streams = check_streams(streams)  # before any kernel is loaded
        self.root = root
        self.manifest = manifest
        plan = Plan.from_json((root / "plan.json").read_text())
        with np.load(root / "params.npz") as npz:
            constants = {k: npz[k] for k in npz.files}
        t = time.perf_counter()
        self.executor = Executor(plan, self._backends(plan, on), constants, streams)
        self.load_s = time.perf_counter() - t

    def _backends(self, plan: Plan, on: str | None) -> dict:
        """One backend per device the plan uses: the GPU's, and the CPU's for fallback."""
        kernels = self.manifest["build"]["kernels"]
        if "opencl" not in kernels and "cuda" not in kernels:
            return {"cpu": self._cpu_backend()}
        backends = {"gpu": self._gpu_backend(on)}
        if "cpu" in plan.devices() or any(b.device == "cpu" for b in plan.buffers):
            if "cpu" not in kernels:
                raise PackageError(f"{self.root}: the plan runs on the CPU but has no CPU kernels")
            backends["cpu"] = self._cpu_backend()
        return backends

    def _cpu_backend(self) -> CPUBackend:
        """The CPU kernels, once this machine is known to execute them."""
        check_host(self.manifest["build"].get("host"), self.root)
        kernels = self.manifest["build"]["kernels"]
        runtime = [
            self.root / kernels[k] for k in ("tvm_runtime", "tvm_runtime_extra") if k in kernels
        ]
        return CPUBackend.load(self.root / kernels["cpu"], runtime)

    def _gpu_backend(self, on: str | None):
        kernels = self.manifest["build"]["kernels"]
        if "opencl" in kernels:
            from .package_format import launches_from_json
            from .runtime.opencl import OpenCLBackend

            launches = launches_from_json((self.root / kernels["opencl_launches"]).read_text())
            source = (self.root / kernels["opencl"]).read_text()
            requires = self.manifest["build"].get("requires", [])
            return OpenCLBackend(on or _default_device(self.manifest), source, launches, requires)
        if "cuda" in kernels:
            from .package_format import launches_from_json
            from .runtime.cuda import CUDABackend, CudaImages

            launches = launches_from_json((self.root / kernels["cuda_launches"]).read_text())
            images = CudaImages(
                arch=self.manifest["build"]["cuda"]["arch"],
                source=(self.root / kernels["cuda"]).read_text(),
                cubin=_read_optional(self.root, kernels.get("cuda_cubin"), binary=True),
                ptx=_read_optional(self.root, kernels.get("cuda_ptx"), binary=False),
            )
            return CUDABackend(on or "", images, launches)
        raise PackageError(f"{self.root} has no kernels for a backend this edgecv can run")

    @property
    def task(self) -> str:
        return self.manifest["model"]["task"]

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.manifest["inputs"][0]["shape"])

    def require_one_input(self, command: str) -> None:
        """Refuse ``command`` (which feeds one image or tensor) for a model with several
        inputs (a tracker's template and search image)."""
        names = [i["name"] for i in self.manifest["inputs"]]
        if len(names) > 1:
            raise PackageError(
                f"{self.root} takes {len(names)} inputs ({', '.join(names)}); `edgecv "
                f"{command}` feeds one: run it with `edgecv run {self.root} --input A.npy "
                "--input B.npy`, or `edgecv.load(path).run(a, b)` from Python"
            )

    @property
    def classes(self) -> list[str]:
        return self.manifest.get("classes", [])

    @property
    def streams(self) -> int:
        """How many calls may run at once (execution contexts)."""
        return len(self.executor.contexts)

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Run on raw input tensors (no preprocessing); outputs in the model's order.
        Thread-safe: waits for an idle execution context when ``streams`` calls are
        already running."""
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


def _read_optional(root: Path, relative: str | None, binary: bool):
    if relative is None:
        return None
    path = root / relative
    return path.read_bytes() if binary else path.read_text()


def _default_device(manifest: dict) -> str:
    """The OpenCL device a package runs on unless ``--on`` says otherwise."""
    gpu = manifest["profile"].get("gpu", {})
    if gpu.get("intel_subgroups") is True:
        return "intel"  # needs cl_intel_subgroups: Intel's runtime
    return ""  # the first device found


def load(path: str | Path, on: str | None = None, streams: int = 1) -> DeployedModel:
    """Load a package folder (or ``.tar.gz``) written by ``edgecv deploy``.

    Parameters
    ----------
    path : str or Path
        The package folder or its ``.tar.gz``.
    on : str, optional
        The OpenCL device (part of "platform / device", case-insensitive) or CUDA
        device; the package's usual one by default.
    streams : int
        How many calls of ``run`` may be in flight at once from different threads, each
        in its own execution context (activation memory, bound launches, command
        queue); further calls wait for one. 1 (the default) runs calls one at a time
        with the memory of one inference; N > 1 costs N times the activation memory.

    Returns
    -------
    DeployedModel
        The model, safe to share between threads.
    """
    streams = check_streams(streams)
    root, manifest = read_manifest(path)
    return DeployedModel(root, manifest, on, streams)


__all__ = ["Detection", "DeployedModel", "load"]
