"""The CPU backend: kernels compiled by TVM's LLVM target, called in process."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tvm

from ..errors import PackageError
from .backend import Backend


def pool_threads() -> int:
    """The threads edgecv's CPU kernels run on: ``TVM_NUM_THREADS``, which importing
    edgecv sets to the cores this process may use unless the user set it."""
    return int(os.environ.get("TVM_NUM_THREADS") or len(os.sched_getaffinity(0)))


class CPUBackend(Backend):
    """Runs kernels of a TVM module built for the host CPU."""

    name = "cpu"

    def __init__(self, module: tvm.runtime.Module):
        self.module = module
        self.device = tvm.cpu(0)

    @classmethod
    def load(cls, path: str | Path) -> CPUBackend:
        """Load a kernel library written by ``export_library``."""
        try:
            return cls(tvm.runtime.load_module(str(path)))
        except Exception as err:
            raise PackageError(f"cannot load CPU kernels from {path}: {err}") from None

    def alloc(self, nbytes: int) -> tvm.runtime.Tensor:
        return tvm.runtime.empty((nbytes,), "uint8", self.device)

    def view(self, storage: tvm.runtime.Tensor, shape: tuple[int, ...], dtype: str, offset=0):
        if not offset:
            return storage._create_view(tuple(shape), dtype)
        # TVM's kernels take tensors whose data starts at their pointer (a view with a
        # byte offset is refused): one over the bytes from ``offset``, sharing them.
        # The caller keeps ``storage`` alive (the executor holds its slots).
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        raw = (ctypes.c_byte * nbytes).from_address(storage.data_ptr() + offset)
        return tvm.runtime.from_dlpack(np.frombuffer(raw, dtype=dtype).reshape(shape))

    def upload(self, tensor: tvm.runtime.Tensor, array: np.ndarray) -> None:
        tensor.copyfrom(np.ascontiguousarray(array, dtype=tensor.dtype))

    def download(self, tensor: tvm.runtime.Tensor) -> np.ndarray:
        return tensor.numpy()

    def kernel(self, name: str) -> Callable[..., None]:
        try:
            return self.module[name]
        except Exception:
            raise PackageError(f"kernel `{name}` is missing from the CPU kernel library") from None
