"""``edgecv.load(path)``: a deployed package, ready to run.

A loaded model may be shared by threads: ``run`` borrows one of the model's
``streams`` execution contexts (its own activation memory and launches, see
:mod:`.runtime.executor`) and calls beyond ``streams`` wait for one, so a result is
never computed in memory another call is writing.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from .decoders import decode
from .durable import clean_stale_staging
from .errors import EdgecvError, PackageError
from .imaging import Detection, preprocess
from .manifest import Manifest
from .package import Package, open_package
from .plan import Plan
from .runtime.context import one_line
from .runtime.cpu import CPUBackend
from .runtime.executor import Executor, check_streams
from .runtime.host import check_host


class DeployedModel:
    """A loaded package: call :meth:`run` on tensors or :meth:`predict` on images, from
    any thread (up to ``streams`` calls run at once, the others wait)."""

    def __init__(self, package: Package, on: str | None = None, streams: int = 1):
        streams = check_streams(streams)  # before any kernel is loaded
        self.root = root = package.root
        self.manifest = package.manifest
        self.sha256 = package.sha256  # the pin: edgecv.load(path, sha256=...)
        plan = package.plan()
        constants = package.params()
        t = time.perf_counter()
        backends = self._backends(package, plan, on)
        try:
            self.executor = Executor(plan, backends, constants, streams)
        except EdgecvError:
            raise
        except MemoryError:
            raise PackageError(
                f"{root} needs more memory than this machine can give it (constants "
                f"{sum(a.nbytes for a in constants.values()):,} bytes, activations "
                f"{sum(plan.storage_sizes):,} bytes per stream); load it with fewer streams "
                "or on a larger machine"
            ) from None
        except Exception as err:  # a device call failing while the model is set up
            raise PackageError(
                f"cannot set up {root} on its device: {type(err).__name__}: {one_line(err)}"
            ) from None
        self.load_s = time.perf_counter() - t
        self.processing = self.manifest.processing(root)  # pre- and post-processing

    def _backends(self, package: Package, plan: Plan, on: str | None) -> dict:
        """One backend per device the plan uses: the GPU's, and the CPU's for fallback."""
        kernels = self.manifest.kernels
        if "opencl" not in kernels and "cuda" not in kernels:
            return {"cpu": self._cpu_backend(package)}
        backends = {"gpu": self._gpu_backend(package, on)}
        if "cpu" in plan.devices() or any(b.device == "cpu" for b in plan.buffers):
            if "cpu" not in kernels:
                raise PackageError(f"{self.root}: the plan runs on the CPU but has no CPU kernels")
            backends["cpu"] = self._cpu_backend(package)
        return backends

    def _cpu_backend(self, package: Package) -> CPUBackend:
        """The CPU kernels, once this machine is known to execute them: loaded from the
        bytes that were checked (the package's files may have changed since)."""
        check_host(self.manifest.host, self.root)
        kernels = self.manifest.kernels
        if "cpu" not in kernels:
            raise PackageError(
                f"{self.root}/manifest.json names no CPU kernels (`build.kernels.cpu`) for a "
                "plan that runs on the CPU; redeploy the model"
            )
        runtime = [kernels[k] for k in ("tvm_runtime", "tvm_runtime_extra") if k in kernels]
        checked = {self.root / r: package.take(r) for r in [kernels["cpu"], *runtime]}
        return CPUBackend.load(
            self.root / kernels["cpu"], [self.root / r for r in runtime], checked
        )

    def _gpu_backend(self, package: Package, on: str | None):
        kernels = self.manifest.kernels
        if "opencl" in kernels:
            from .runtime.opencl import OpenCLBackend

            launches = package.launches("opencl_launches")
            source = package.kernel_text("opencl")
            device = on or _default_device(self.manifest)
            return OpenCLBackend(device, source, launches, self.manifest.requires)
        if "cuda" in kernels:
            from .runtime.cuda import CUDABackend, CudaImages

            launches = package.launches("cuda_launches")
            images = CudaImages(
                arch=self.manifest.cuda_arch,
                source=package.kernel_text("cuda"),
                cubin=package.file(kernels.get("cuda_cubin"), binary=True),
                ptx=package.file(kernels.get("cuda_ptx"), binary=False),
            )
            return CUDABackend(on or "", images, launches)
        raise PackageError(f"{self.root} has no kernels for a backend this edgecv can run")

    @property
    def task(self) -> str:
        return self.manifest.task

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.manifest.input_shape

    def require_one_input(self, command: str) -> None:
        """Refuse ``command`` (which feeds one image or tensor) for a model with several
        inputs (a tracker's template and search image)."""
        names = [tensor.name for tensor in self.manifest.inputs]
        if len(names) > 1:
            raise PackageError(
                f"{self.root} takes {len(names)} inputs ({', '.join(names)}); `edgecv "
                f"{command}` feeds one: run it with `edgecv run {self.root} --input A.npy "
                "--input B.npy`, or `edgecv.load(path).run(a, b)` from Python"
            )

    @property
    def classes(self) -> list[str]:
        return self.manifest.classes

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
        """An image as the model's input tensor (see :meth:`predict` for the images it
        takes)."""
        return preprocess(image_bgr, self.manifest.preprocessing, self.input_shape)

    def predict(self, image_bgr: np.ndarray, threshold: float | None = None, k: int = 5):
        """Classify (top-k ``(label, prob)``) or detect (:class:`Detection` list) one image,
        as the package's decoder says (:mod:`edgecv.board.decoders`; boxes in ``image_bgr``'s
        pixels, letterboxing undone).

        ``image_bgr`` is an HxWx3 uint8 BGR image, as ``cv2.imread`` returns it; a
        grayscale (HxW, HxWx1) or BGRA (HxWx4) one is converted as OpenCV converts an
        image it reads in colour. Anything else (None, an empty image, another dtype: a
        float image's scale cannot be known) is one :class:`~edgecv.board.errors.EdgecvError`
        saying how to convert it (:func:`~edgecv.board.imaging.bgr_image`). A detection whose
        class id, score or box is NaN or infinite is dropped. ``threshold``: the lowest
        score kept (the decoder's ``confidence`` for Ultralytics' heads, 0.5 otherwise).
        """
        outputs = self.run(self.preprocess(image_bgr))
        return self.decode(outputs, image_bgr.shape[:2], threshold, k)

    def decode(self, outputs: list[np.ndarray], image_hw, threshold=None, k: int = 5):
        """:meth:`predict`'s results from outputs of an image of ``image_hw`` pixels."""
        return decode(outputs, self.processing, self.input_shape[2:], image_hw, threshold, k)


def _default_device(manifest: Manifest) -> str:
    """The OpenCL device a package runs on unless ``--on`` says otherwise."""
    if manifest.gpu.get("intel_subgroups") is True:
        return "intel"  # needs cl_intel_subgroups: Intel's runtime
    return ""  # the first device found


def load(
    path: str | Path, on: str | None = None, streams: int = 1, sha256: str | None = None
) -> DeployedModel:
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
    sha256 : str, optional
        The package's pin, printed by ``edgecv deploy``: the sha256 of its manifest,
        which lists every file's sha256. A package that is not that one is refused
        before anything of it runs. Loading a package runs its native code, and
        without a pin its checksums catch damage, not tampering (docs/security.md).

    Returns
    -------
    DeployedModel
        The model, safe to share between threads.
    """
    streams = check_streams(streams)
    if not os.path.lexists(path):  # a deploy killed while replacing it: put it back
        clean_stale_staging(Path(path).parent, Path(path).name)
    return DeployedModel(open_package(path, sha256=sha256), on, streams)


__all__ = ["Detection", "DeployedModel", "load"]
