"""The CUDA backend: TVM-generated CUDA kernels run through the CUDA driver API.

The TVM wheel edgecv pins is built without its CUDA runtime, so, as for OpenCL,
edgecv runs device code itself: ``libcuda`` through ctypes (no extra dependency; the
driver is what every CUDA machine has). A package carries a cubin for its profile's
architecture and PTX for the matching virtual architecture; the runtime loads the
cubin when the GPU's architecture is that one, the PTX when the GPU is newer (the
driver JIT-compiles it), and otherwise compiles the shipped source with the nvcc on
the device, caching the result on disk (:mod:`.kernel_cache`). Launches recorded at
build time are bound to their buffers once; an inference only calls
``cuLaunchKernel``.

Every execution context of a model (see :mod:`.executor`) binds its own launches,
argument arrays and workspaces, and all of them run on the legacy default stream of
the device's primary CUDA context: work from several threads is ordered there, each
on its own buffers, so concurrent calls are right, one kernel after another. The
driver keeps the current CUDA context per thread, so an inference first makes it
current in its calling thread (:meth:`CUDABackend.make_current`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import EdgecvError
from ..plan import Launch
from .backend import Backend, planned_arguments, planned_workspaces

_CUDA_SUCCESS = 0
_CUDA_ERROR_OUT_OF_MEMORY = 2
_ATTR_CC_MAJOR, _ATTR_CC_MINOR = 75, 76
_SCALARS = {"int": ctypes.c_int32, "long": ctypes.c_int64, "float": ctypes.c_float}


_P = ctypes.POINTER
_U = ctypes.c_uint
# argtypes of every driver call used: pointers and sizes must not pass as C ints.
_SIGNATURES = {
    "cuInit": [_U],
    "cuGetErrorName": [ctypes.c_int, _P(ctypes.c_char_p)],
    "cuDeviceGetCount": [_P(ctypes.c_int)],
    "cuDeviceGet": [_P(ctypes.c_int), ctypes.c_int],
    "cuDeviceGetName": [ctypes.c_char_p, ctypes.c_int, ctypes.c_int],
    "cuDeviceGetAttribute": [_P(ctypes.c_int), ctypes.c_int, ctypes.c_int],
    "cuDeviceTotalMem_v2": [_P(ctypes.c_size_t), ctypes.c_int],
    "cuDevicePrimaryCtxRetain": [_P(ctypes.c_void_p), ctypes.c_int],
    "cuCtxSetCurrent": [ctypes.c_void_p],
    "cuCtxSynchronize": [],
    "cuModuleLoadData": [_P(ctypes.c_void_p), ctypes.c_void_p],
    "cuModuleGetFunction": [_P(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p],
    "cuMemAlloc_v2": [_P(ctypes.c_uint64), ctypes.c_size_t],
    "cuMemcpyHtoD_v2": [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t],
    "cuMemcpyDtoH_v2": [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t],
    "cuLaunchKernel": [
        ctypes.c_void_p,
        _U,
        _U,
        _U,
        _U,
        _U,
        _U,
        _U,
        ctypes.c_void_p,
        _P(ctypes.c_void_p),
        _P(ctypes.c_void_p),
    ],
}


class CudaUnavailable(EdgecvError):
    """No CUDA driver or no CUDA device on this machine."""


class CudaDriver:
    """The few driver API calls edgecv uses, with errors turned into messages."""

    def __init__(self) -> None:
        path = ctypes.util.find_library("cuda") or "libcuda.so.1"
        try:
            self.lib = ctypes.CDLL(path)
        except OSError:
            raise CudaUnavailable(
                "no CUDA driver (libcuda) on this machine: CUDA packages need an NVIDIA GPU "
                "with its driver; deploy for an OpenCL profile or --device cpu instead"
            ) from None
        missing = [name for name in _SIGNATURES if not hasattr(self.lib, name)]
        if missing:
            raise CudaUnavailable(f"the CUDA driver at {path} lacks {', '.join(missing)}")
        for name, argtypes in _SIGNATURES.items():
            getattr(self.lib, name).argtypes = argtypes
        self.check("cuInit", self.lib.cuInit(0))

    def check(self, what: str, code: int) -> None:
        if code == _CUDA_SUCCESS:
            return
        name = ctypes.c_char_p()
        self.lib.cuGetErrorName(code, ctypes.byref(name))
        label = name.value.decode() if name.value else f"error {code}"
        if code == _CUDA_ERROR_OUT_OF_MEMORY:
            raise EdgecvError(f"the CUDA device is out of memory ({what}: {label})")
        raise EdgecvError(f"CUDA call {what} failed: {label}")

    def call(self, name: str, *args) -> None:
        self.check(name, getattr(self.lib, name)(*args))

    def devices(self) -> list[CudaDevice]:
        count = ctypes.c_int()
        self.call("cuDeviceGetCount", ctypes.byref(count))
        found = []
        for index in range(count.value):
            handle = ctypes.c_int()
            self.call("cuDeviceGet", ctypes.byref(handle), index)
            name = ctypes.create_string_buffer(256)
            self.call("cuDeviceGetName", name, 256, handle)
            major, minor = ctypes.c_int(), ctypes.c_int()
            self.call("cuDeviceGetAttribute", ctypes.byref(major), _ATTR_CC_MAJOR, handle)
            self.call("cuDeviceGetAttribute", ctypes.byref(minor), _ATTR_CC_MINOR, handle)
            memory = ctypes.c_size_t()
            self.call("cuDeviceTotalMem_v2", ctypes.byref(memory), handle)
            found.append(
                CudaDevice(index, name.value.decode(), major.value * 10 + minor.value, memory.value)
            )
        return found


@dataclass(frozen=True)
class CudaDevice:
    index: int
    name: str
    compute_capability: int  # 87 for sm_87
    global_memory_bytes: int

    @property
    def arch(self) -> str:
        return f"sm_{self.compute_capability}"

    @property
    def label(self) -> str:
        return f"cuda:{self.index} {self.name} ({self.arch})"


def cuda_devices() -> list[CudaDevice]:
    """CUDA devices on this machine (empty without a driver or a GPU)."""
    try:
        return CudaDriver().devices()
    except EdgecvError:
        return []


@dataclass
class CudaTensor:
    pointer: int  # CUdeviceptr
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class CudaImages:
    """What a package carries for CUDA: source always, cubin/PTX when built here."""

    arch: str
    source: str
    cubin: bytes | None = None
    ptx: str | None = None


def choose_image(images: CudaImages, device: CudaDevice) -> tuple[str, bytes]:
    """The module image for ``device``: ("cubin"|"ptx"|"source", bytes), or refuse."""
    built_for = int(images.arch.removeprefix("sm_"))
    if images.cubin is not None and device.compute_capability == built_for:
        return "cubin", images.cubin
    if images.ptx is not None and device.compute_capability >= built_for:
        return "ptx", images.ptx.encode() + b"\0"
    if device.compute_capability < built_for:
        raise EdgecvError(
            f"this package was built for {images.arch} and {device.label} is older; "
            f"redeploy for a profile with arch sm_{device.compute_capability}"
        )
    from .kernel_cache import compile_cuda_cached

    return "cubin", compile_cuda_cached(images.source, device.arch)


class CUDABackend(Backend):
    """Runs recorded launches on one CUDA device (``query`` matches its name or index)."""

    name = "cuda"

    def __init__(self, query: str, images: CudaImages, launches: dict[str, list[Launch]]):
        self.driver = driver = CudaDriver()
        devices = driver.devices()
        chosen = [d for d in devices if query.lower() in d.label.lower()]
        if not chosen:
            listed = ", ".join(d.label for d in devices) or "none"
            raise CudaUnavailable(f"no CUDA device matches `{query}` (found: {listed})")
        self.device = chosen[0]
        handle = ctypes.c_int()
        driver.call("cuDeviceGet", ctypes.byref(handle), self.device.index)
        self.context = ctypes.c_void_p()
        driver.call("cuDevicePrimaryCtxRetain", ctypes.byref(self.context), handle)
        driver.call("cuCtxSetCurrent", self.context)
        self.image_kind, image = choose_image(images, self.device)
        self.module = ctypes.c_void_p()
        self._image = ctypes.create_string_buffer(image, len(image))
        driver.call("cuModuleLoadData", ctypes.byref(self.module), self._image)
        self.launches = launches
        self.allocated_bytes = 0
        self._functions: dict[str, ctypes.c_void_p] = {}

    def alloc(self, nbytes: int) -> CudaTensor:
        pointer = ctypes.c_uint64()
        self.driver.call("cuMemAlloc_v2", ctypes.byref(pointer), max(nbytes, 4))
        self.allocated_bytes += max(nbytes, 4)
        return CudaTensor(pointer.value, (max(nbytes, 4),), "uint8")

    def view(self, storage: CudaTensor, shape: tuple[int, ...], dtype: str, offset=0):
        return CudaTensor(storage.pointer + offset, tuple(shape), dtype)

    def upload(self, tensor: CudaTensor, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array, dtype=tensor.dtype)
        self.driver.call(
            "cuMemcpyHtoD_v2", ctypes.c_uint64(tensor.pointer), data.ctypes.data, data.nbytes
        )

    def download(self, tensor: CudaTensor) -> np.ndarray:
        out = np.empty(tensor.shape, tensor.dtype)
        self.driver.call(
            "cuMemcpyDtoH_v2", out.ctypes.data, ctypes.c_uint64(tensor.pointer), out.nbytes
        )
        return out

    def _function(self, kernel: str) -> ctypes.c_void_p:
        if kernel not in self._functions:
            handle = ctypes.c_void_p()
            self.driver.call(
                "cuModuleGetFunction", ctypes.byref(handle), self.module, kernel.encode()
            )
            self._functions[kernel] = handle
        return self._functions[kernel]

    def kernel(self, name: str) -> Callable[..., None]:
        return lambda *tensors: self.bind(name, list(tensors))()

    def bind(
        self, name: str, tensors: list[CudaTensor], workspaces: list[CudaTensor] | None = None
    ) -> Callable[[], None]:
        """The launches of kernel ``name`` with their argument arrays made now; device
        workspaces are the plan's ``workspaces`` tensors, or allocated here for the step
        when the plan has none (see :meth:`Backend.bind`)."""
        if name not in self.launches:
            raise EdgecvError(f"kernel `{name}` has no CUDA launches in this package")
        prepared = []
        launches = self.launches[name]
        sizes = launches[0].workspaces if launches else []
        if workspaces is None:  # a plan made before workspaces were planned
            workspaces = [self.alloc(size) for size in sizes]  # once per step, at load
        else:
            workspaces = planned_workspaces(name, workspaces, sizes)
        planned_arguments(name, tensors, launches[0].buffers if launches else [])
        for launch in launches:
            values = [
                ctypes.c_uint64(tensors[int(value)].pointer)
                if kind == "buffer"
                else ctypes.c_uint64(workspaces[int(value)].pointer)
                if kind == "workspace"
                else _SCALARS[ctype](value)
                for kind, value, ctype in launch.args
            ]
            params = (ctypes.c_void_p * max(len(values), 1))(
                *[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values]
            )
            grid = [g // b for g, b in zip(launch.global_size, launch.local_size)]
            function = self._function(launch.kernel)
            prepared.append((function, grid, launch.local_size, params, values))
        launch_kernel, check = self.driver.lib.cuLaunchKernel, self.driver.check

        def run(_workspaces=workspaces) -> None:
            for function, grid, block, params, _keep in prepared:
                check(
                    "cuLaunchKernel",
                    launch_kernel(function, *grid, *block, 0, None, params, None),
                )

        return run

    def make_current(self) -> None:
        """The loading thread has the context current; any other thread running the
        model would otherwise find none (CUDA_ERROR_INVALID_CONTEXT)."""
        self.driver.call("cuCtxSetCurrent", self.context)

    def synchronize(self) -> None:
        self.driver.call("cuCtxSynchronize")


__all__ = ["CUDABackend", "CudaDevice", "CudaImages", "CudaUnavailable", "cuda_devices"]
