"""The CPU backend: kernels compiled by TVM's LLVM target, called in process.

It needs no TVM compiler: the kernel library is loaded by apache-tvm-ffi's module
loader, tensors are NumPy arrays handed to the kernels through DLPack, and the four
functions generated code calls back into (the thread pool's parallel launch and
barrier, workspace allocation) come from TVM's runtime library, ``libtvm_runtime.so``
(3 MB), which a package with CPU kernels carries for its host, with
``libtvm_runtime_extra.so`` when its kernels call TVM's library functions (the CPU
``box_nms`` sorts with ``tvm.contrib.sort``). Where the TVM wheel is installed (the
workstation) its own copies are used instead, the files ``import tvm`` loads, so two
copies never load side by side (they would register the same functions twice).

One loaded library serves every execution context of a model (see :mod:`.executor`):
the generated functions keep no state of their own, and TVM's thread pool and
workspace memory belong to the thread that calls them, so calls from several
threads on their own buffers do not meet. The cores are split between a model's
execution contexts (:meth:`CPUBackend.stream`): each calling thread's pool gets its
share, so N inferences in flight keep N x (cores / N) threads busy instead of N x
cores threads fighting over the cores.
"""

from __future__ import annotations

import atexit
import copy
import ctypes
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tvm_ffi

from ..errors import PackageError
from .backend import Backend

# TVM's kernels may assume their tensors start at this alignment (its own allocator's).
ALIGNMENT = 64
TVM_RUNTIME_LIBRARIES = ("libtvm_runtime.so", "libtvm_runtime_extra.so")

_runtime_lock = threading.Lock()
_runtime_loaded: dict[str, str] = {}  # library file name -> path loaded
# The worker count this thread's TVM pool was last set to by edgecv (None: TVM's default,
# TVM_NUM_THREADS workers). TVM keeps one pool per calling thread.
_this_thread = threading.local()
# TVM's pool modes (threading_backend.h): workers share every core the process may use,
# none pinned, as the default pool's workers run
_SHARE_ALL_CORES = -3


def pool_threads() -> int:
    """The threads edgecv's CPU kernels run on: ``TVM_NUM_THREADS``, which importing
    edgecv sets to the cores this process may use unless the user set it."""
    return int(os.environ.get("TVM_NUM_THREADS") or len(os.sched_getaffinity(0)))


def use_threads(count: int) -> None:
    """Run the CPU kernels the calling thread calls on ``count`` threads (its own
    included). TVM keeps a thread pool per calling thread; this sizes that one. Cheap
    when nothing changes (called before every inference of a context)."""
    current = getattr(_this_thread, "threads", None)
    if current == count or (current is None and count == pool_threads()):
        return  # TVM's default pool already has this size
    configure = tvm_ffi.get_global_func("runtime.config_threadpool")
    cpus = [str(c) for c in sorted(os.sched_getaffinity(0))]
    if current is None and count < len(cpus):
        # This thread's pool does not exist yet; TVM makes it with as many workers as
        # the process-wide concurrency, which configuring sets to the cpus given: made
        # for ``count`` cpus it has no workers to spare. Spare workers are not idle:
        # after being made or set, each spins for 300000 yields before sleeping, which
        # on busy cores lasts seconds and slows the streams that share those cores
        # (benchmarks/results/streams-2026-11-26-zen3.md, the spin count).
        configure(_SHARE_ALL_CORES, count, cpus[:count])
    # the process-wide concurrency back to every core (the next pools' size)
    configure(_SHARE_ALL_CORES, count, cpus)
    _this_thread.threads = count


_private_lock = threading.Lock()
_private: tuple[int, Path] | None = None  # (process id, its folder of libraries)


def private_library(name: str, data: bytes) -> Path:
    """Where to load the library ``data`` (a package's file ``name``, read and checked)
    from: a copy of exactly those bytes in this process's private folder.

    A package's own path is not loaded: its file may have changed since it was checked,
    and the dynamic loader returns the library it loaded before under a path, whatever
    the file there holds now (a package redeployed in place). The folder is made by
    ``mkdtemp`` (a name no one can guess, this user's, mode 0700) and removed at exit:
    a folder of a fixed name in the shared temp dir may have been made first by another
    user, who could then put their library in the place of ours. Each content has its
    own subfolder (named by its sha256) and keeps its file name: the same bytes load
    from the same path, once.
    """
    global _private
    digest = hashlib.sha256(data).hexdigest()
    with _private_lock:
        if _private is None or _private[0] != os.getpid():  # a forked child makes its own
            folder = Path(tempfile.mkdtemp(prefix="edgecv-kernels-"))
            atexit.register(_remove_private, os.getpid(), folder)
            _private = (os.getpid(), folder)
        target = _private[1] / digest[:32] / name
        if not target.is_file():
            target.parent.mkdir(mode=0o700, exist_ok=True)
            partial = target.with_name(f"{name}.part")
            partial.write_bytes(data)
            os.replace(partial, target)
    return target


def _remove_private(pid: int, folder: Path) -> None:
    if os.getpid() == pid:  # not a forked child's exit: the folder is its parent's
        shutil.rmtree(folder, ignore_errors=True)


def _library_bytes(path: Path, checked: Mapping[Path, bytes] | None) -> bytes:
    """The bytes of library ``path`` as they were checked, else as read once now."""
    if checked is not None and Path(path) in checked:
        return checked[Path(path)]
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise PackageError(f"cannot read library {path}: {err.strerror or err}") from None


def installed_tvm_libraries() -> Path | None:
    """The library folder of an installed TVM wheel (found without importing TVM)."""
    try:
        spec = importlib.util.find_spec("tvm")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent / "lib"
    return folder if (folder / TVM_RUNTIME_LIBRARIES[0]).is_file() else None


def load_tvm_runtime(
    packaged: Sequence[Path], checked: Mapping[Path, bytes] | None = None
) -> list[str]:
    """Make TVM's runtime functions available to kernel libraries loaded after this call:
    ``packaged`` are a package's copies (the runtime, then its extra library when the
    kernels need it), loaded from their bytes in ``checked`` when there (see
    :func:`private_library`). Returns the libraries loaded so far (``tvm``: TVM's own,
    imported)."""
    with _runtime_lock:
        if sys.modules.get("tvm") is not None:  # the compiler side is here: its runtime too
            return ["tvm"]
        installed = installed_tvm_libraries()
        wanted = {Path(p).name: Path(p) for p in packaged}
        if installed is not None:  # TVM's own copies: `import tvm` later loads the same files
            wanted = {name: installed / name for name in wanted or TVM_RUNTIME_LIBRARIES[:1]}
        for name, library in wanted.items():
            if name in _runtime_loaded:
                continue
            if installed is None:  # a package's copy: from the bytes checked
                if library not in (checked or {}) and not library.is_file():
                    raise PackageError(f"TVM's runtime library {library} is missing; redeploy")
                library = private_library(name, _library_bytes(library, checked))
            try:  # the runtime's symbols serve the libraries loaded after it
                ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
            except OSError as err:
                raise PackageError(f"cannot load TVM's runtime library {library}: {err}") from None
            _runtime_loaded[name] = str(library)
        if TVM_RUNTIME_LIBRARIES[0] not in _runtime_loaded:
            raise PackageError(
                f"this package's CPU kernels need TVM's runtime library "
                f"({TVM_RUNTIME_LIBRARIES[0]}), which it does not carry and no TVM is installed "
                "here: redeploy the model with this edgecv (packages carry it beside "
                "kernels/cpu.so)"
            )
        return list(_runtime_loaded.values())


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
        # the streams made from it and alive (a context replaced after a failure drops
        # its own): they share the cores
        # threads an inference through this backend runs its kernels on (a stream's
        # share of them: :meth:`stream`)
        self.threads = pool_threads()

    @classmethod
    def load(
        cls,
        path: str | Path,
        runtime_libraries: Sequence[Path] = (),
        checked: Mapping[Path, bytes] | None = None,
    ) -> CPUBackend:
        """Load a kernel library written by the CPU code stage (``kernels/cpu.so``) after
        the package's TVM runtime libraries (see :func:`load_tvm_runtime`), each from
        its bytes in ``checked`` (by path) when there, else from the bytes read once
        now, copied to this process's private folder (:func:`private_library`)."""
        load_tvm_runtime([Path(p) for p in runtime_libraries], checked)
        library = private_library(Path(path).name, _library_bytes(Path(path), checked))
        try:
            return cls(tvm_ffi.load_module(str(library)))
        except Exception as err:
            raise PackageError(f"cannot load CPU kernels from {path}: {err}") from None

    def stream(self, streams: int = 1) -> CPUBackend:
        """This backend as one of ``streams`` execution contexts uses it: the same
        kernels, and a share of the cores. The cores this process may use
        (``TVM_NUM_THREADS``) are split evenly between the streams (at least one thread
        each): a model loaded with ``streams=2`` on 2 cores runs each inference on one
        core, two at once. The share applies to the thread running the inference, while
        it runs it (:meth:`make_current`); it is fixed here, once, not read per call."""
        stream = copy.copy(self)
        stream.threads = max(1, pool_threads() // max(1, streams))
        return stream

    @property
    def calling_thread_pool(self) -> int:  # see Backend.calling_thread_pool
        return self.threads

    def make_current(self) -> None:
        use_threads(self.threads)

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

    def bind(
        self, name: str, tensors: list[Any], workspaces: list[Any] | None = None
    ) -> Callable[[], None]:
        # CPU kernels have no device workspaces: TVM's runtime gives them scratch memory
        function, handles = self._function(name), [t.handle for t in tensors]
        return lambda: function(*handles)

    def _function(self, name: str) -> Callable[..., None]:
        try:
            return self.module[name]
        except Exception:
            raise PackageError(f"kernel `{name}` is missing from the CPU kernel library") from None
