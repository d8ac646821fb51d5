"""The CPU backend: kernels compiled by TVM's LLVM target, called in process.

It needs no TVM compiler: the kernel library is loaded by apache-tvm-ffi's module
loader, tensors are NumPy arrays handed to the kernels through DLPack, and the four
functions generated code calls back into (the thread pool's parallel launch and
barrier, workspace allocation) come from TVM's runtime library, ``libtvm_runtime.so``
(3 MB), which a package with CPU kernels carries for its host. Where the TVM wheel is
installed (the workstation) its own copy is used instead, the same file ``import tvm``
loads, so the two never load side by side.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tvm_ffi

from ..errors import PackageError
from .backend import Backend

# TVM's kernels may assume their tensors start at this alignment (its own allocator's).
ALIGNMENT = 64
TVM_RUNTIME_LIBRARY = "libtvm_runtime.so"

_runtime_lock = threading.Lock()
_runtime_loaded: list[str] = []


def pool_threads() -> int:
    """The threads edgecv's CPU kernels run on: ``TVM_NUM_THREADS``, which importing
    edgecv sets to the cores this process may use unless the user set it."""
    return int(os.environ.get("TVM_NUM_THREADS") or len(os.sched_getaffinity(0)))


def installed_tvm_runtime() -> Path | None:
    """The runtime library of an installed TVM wheel (found without importing TVM)."""
    try:
        spec = importlib.util.find_spec("tvm")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    library = Path(spec.origin).parent / "lib" / TVM_RUNTIME_LIBRARY
    return library if library.is_file() else None


def load_tvm_runtime(packaged: Path | None) -> str:
    """Make TVM's runtime functions available to kernel libraries loaded after this call;
    returns which copy serves them (``tvm``: already imported, or a library's path)."""
    with _runtime_lock:
        if _runtime_loaded:
            return _runtime_loaded[0]
        if sys.modules.get("tvm") is not None:  # the compiler side is here: its runtime too
            _runtime_loaded.append("tvm")
            return "tvm"
        library = installed_tvm_runtime() or packaged
        if library is None or not Path(library).is_file():
            raise PackageError(
                f"this package's CPU kernels need TVM's runtime library ({TVM_RUNTIME_LIBRARY}), "
                "which it does not carry and no TVM is installed here: redeploy the model with "
                "this edgecv (packages carry it next to kernels/cpu.so)"
            )
        try:
            ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
        except OSError as err:
            raise PackageError(f"cannot load TVM's runtime library {library}: {err}") from None
        _runtime_loaded.append(str(library))
        return str(library)


class CPUTensor:
    """A tensor of the CPU backend: a NumPy array and the DLPack handle kernels take."""

    __slots__ = ("array", "handle")

    def __init__(self, array: np.ndarray):
        self.array = array
        self.handle = tvm_ffi.from_dlpack(array)


class CPUBackend(Backend):
    """Runs kernels of a TVM module built for the host CPU (any ``tvm_ffi.Module``: a
    package's library, or one built in memory by the compiler side)."""

    name = "cpu"

    def __init__(self, module: Any):
        self.module = module

    @classmethod
    def load(cls, path: str | Path, runtime_library: str | Path | None = None) -> CPUBackend:
        """Load a kernel library written by the CPU code stage (``kernels/cpu.so``)."""
        load_tvm_runtime(Path(runtime_library) if runtime_library else None)
        try:
            return cls(tvm_ffi.load_module(str(path)))
        except Exception as err:
            raise PackageError(f"cannot load CPU kernels from {path}: {err}") from None

    def alloc(self, nbytes: int) -> np.ndarray:
        raw = np.empty(nbytes + ALIGNMENT, np.uint8)
        start = -raw.ctypes.data % ALIGNMENT
        return raw[start : start + nbytes]

    def view(self, storage: Any, shape: tuple[int, ...], dtype: str, offset=0) -> CPUTensor:
        if isinstance(storage, CPUTensor):
            storage = storage.array.reshape(-1).view(np.uint8)
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return CPUTensor(storage[offset : offset + nbytes].view(dtype).reshape(shape))

    def upload(self, tensor: CPUTensor, array: np.ndarray) -> None:
        np.copyto(tensor.array, array, casting="unsafe")

    def download(self, tensor: CPUTensor) -> np.ndarray:
        return tensor.array.copy()

    def kernel(self, name: str) -> Callable[..., None]:
        function = self._function(name)
        return lambda *tensors: function(*(t.handle for t in tensors))

    def bind(self, name: str, tensors: list[Any]) -> Callable[[], None]:
        function, handles = self._function(name), [t.handle for t in tensors]
        return lambda: function(*handles)

    def _function(self, name: str) -> Callable[..., None]:
        try:
            return self.module[name]
        except Exception:
            raise PackageError(f"kernel `{name}` is missing from the CPU kernel library") from None
