"""The interface every device backend implements (CPU now; OpenCL and CUDA plug in)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


class Backend:
    """Memory and kernels of one device. Subclasses implement every method."""

    name = "abstract"

    def alloc(self, nbytes: int) -> Any:
        """A device allocation of ``nbytes`` bytes (a storage slot)."""
        raise NotImplementedError("need alloc")

    def view(self, storage: Any, shape: tuple[int, ...], dtype: str, offset: int = 0) -> Any:
        """A tensor of ``shape``/``dtype`` over the bytes of ``storage`` from ``offset``
        (a multiple of the device's :data:`~edgecv.package_format.PIECE_ALIGNMENT`)."""
        raise NotImplementedError("need view")

    def upload(self, tensor: Any, array: np.ndarray) -> None:
        raise NotImplementedError("need upload")

    def download(self, tensor: Any) -> np.ndarray:
        raise NotImplementedError("need download")

    def kernel(self, name: str) -> Callable[..., None]:
        """The compiled kernel ``name``, called with tensors in plan order."""
        raise NotImplementedError("need kernel")

    def bind(self, name: str, tensors: list[Any]) -> Callable[[], None]:
        """Kernel ``name`` bound to its argument tensors once, at load time.

        Backends whose launches can be prepared (arguments set) override this so an
        inference only enqueues; the default calls :meth:`kernel` each time.
        """
        kernel = self.kernel(name)
        return lambda: kernel(*tensors)

    def synchronize(self) -> None:
        """Wait for queued work (no-op for synchronous devices)."""
