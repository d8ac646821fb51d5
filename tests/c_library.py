"""The C device runtime (runtime_c/) as the tests use it: built with CMake into a folder
of the test session, and called through ctypes (``CModel``), the way a camera
application links it. Imported by name, as tests/helpers.py is."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "runtime_c"
# the status codes of edgecv.h
OK, E_ARGUMENT, E_NOT_FOUND, E_IO, E_MANIFEST, E_CHECKSUM, E_PIN = range(7)
E_PLAN, E_PARAMS, E_HOST, E_DEVICE, E_KERNELS, E_INFERENCE, E_MEMORY, E_ARCHIVE = range(7, 15)


def missing_tools() -> str | None:
    """Why the C runtime cannot be built here, or None."""
    for tool in ("cmake", "cc"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (the C runtime is built with CMake and a C compiler)"
    return None


def build(
    folder: Path, sanitize: bool = False, tvm_ffi_root: Path | None = None, extra: tuple = ()
) -> Path:
    """Configure and build runtime_c/ in ``folder`` (warnings are errors) against the
    apache-tvm-ffi of ``tvm_ffi_root`` (this Python's by default), with ``extra`` CMake
    arguments (a cross build's); returns ``folder``."""
    if tvm_ffi_root is None:
        import tvm_ffi

        tvm_ffi_root = Path(tvm_ffi.__file__).parent
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    configure = [
        "cmake",
        "-S",
        str(SOURCE),
        "-B",
        str(folder),
        *generator,
        # the sanitizers' build unoptimized: it compiles faster, and reports read better
        f"-DCMAKE_BUILD_TYPE={'Debug' if sanitize else 'RelWithDebInfo'}",
        "-DEDGECV_WERROR=ON",
        f"-DEDGECV_SANITIZE={'ON' if sanitize else 'OFF'}",
        f"-DTVM_FFI_ROOT={tvm_ffi_root}",
        *extra,
    ]
    for command in (configure, ["cmake", "--build", str(folder)]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout}\n{done.stderr}"
    return folder


def sanitizer_runtime(name: str) -> str:
    """The compiler's own sanitizer library ``name`` (libasan.so), to preload into a
    process that loads the sanitizer build."""
    return subprocess.run(
        ["cc", f"-print-file-name={name}"], capture_output=True, text=True, check=True
    ).stdout.strip()


class TensorInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_char_p),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("nbytes", ctypes.c_size_t),
    ]


class CError(Exception):
    """A failure of the C runtime: its status code and message."""

    def __init__(self, code: int, message: str):
        super().__init__(f"[{code}] {message}")
        self.code, self.message = code, message


def library(folder: Path) -> ctypes.CDLL:
    """libedgecv_runtime.so of a build folder, with the signatures of edgecv.h."""
    lib = ctypes.CDLL(str(folder / "libedgecv_runtime.so"))
    p, size, text = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
    signatures = {
        "edgecv_version": ([], ctypes.c_char_p),
        "edgecv_format_version": ([], ctypes.c_int),
        "edgecv_load_pinned": ([text, text, text, p, p], ctypes.c_int),
        "edgecv_num_inputs": ([p], size),
        "edgecv_num_outputs": ([p], size),
        "edgecv_input_info": ([p, size], ctypes.POINTER(TensorInfo)),
        "edgecv_output_info": ([p, size], ctypes.POINTER(TensorInfo)),
        "edgecv_model_name": ([p], ctypes.c_char_p),
        "edgecv_model_sha256": ([p], ctypes.c_char_p),
        "edgecv_run": ([p, p, p, p, p, p], ctypes.c_int),
        "edgecv_free": ([p], None),
        "edgecv_error_code": ([p], ctypes.c_int),
        "edgecv_error_message": ([p], ctypes.c_char_p),
        "edgecv_error_free": ([p], None),
    }
    for name, (arguments, result) in signatures.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = arguments, result
    return lib


def _raise(lib: ctypes.CDLL, status: int, error: ctypes.c_void_p) -> None:
    message = lib.edgecv_error_message(error).decode()
    code = lib.edgecv_error_code(error)
    lib.edgecv_error_free(error)
    assert code == status, (code, status, message)
    raise CError(code, message)


def _info(pointer) -> tuple[str, tuple[int, ...], np.dtype, int]:
    info = pointer.contents
    shape = tuple(info.shape[d] for d in range(info.ndim))
    return info.name.decode(), shape, np.dtype(info.dtype.decode()), info.nbytes


class CModel:
    """A package loaded by the C runtime; :meth:`run` as ``edgecv.load(path).run``."""

    def __init__(self, lib: ctypes.CDLL, path: Path, device: str | None = "cpu", pin=None):
        self.lib, self.handle = lib, ctypes.c_void_p()
        error = ctypes.c_void_p()
        status = lib.edgecv_load_pinned(
            os.fsencode(path),
            None if device is None else device.encode(),
            None if pin is None else pin.encode(),
            ctypes.byref(self.handle),
            ctypes.byref(error),
        )
        if status != OK:
            _raise(lib, status, error)
        assert not error, "an error was handed out for a load that succeeded"
        count = lib.edgecv_num_inputs(self.handle), lib.edgecv_num_outputs(self.handle)
        self.inputs = [_info(lib.edgecv_input_info(self.handle, i)) for i in range(count[0])]
        self.outputs = [_info(lib.edgecv_output_info(self.handle, i)) for i in range(count[1])]
        assert not lib.edgecv_input_info(self.handle, count[0])  # NULL past the end

    @property
    def name(self) -> str:
        return self.lib.edgecv_model_name(self.handle).decode()

    @property
    def sha256(self) -> str:
        return self.lib.edgecv_model_sha256(self.handle).decode()

    def run(self, *arrays: np.ndarray, sizes: list[int] | None = None) -> list[np.ndarray]:
        arrays = [np.ascontiguousarray(a) for a in arrays]
        outputs = [np.empty(shape, dtype) for _, shape, dtype, _ in self.outputs]
        inputs = (ctypes.c_void_p * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])
        input_bytes = (ctypes.c_size_t * max(1, len(arrays)))(
            *(sizes if sizes is not None else [a.nbytes for a in arrays])
        )
        output_pointers = (ctypes.c_void_p * len(outputs))(*[o.ctypes.data for o in outputs])
        output_bytes = (ctypes.c_size_t * len(outputs))(*[o.nbytes for o in outputs])
        error = ctypes.c_void_p()
        status = self.lib.edgecv_run(
            self.handle, inputs, input_bytes, output_pointers, output_bytes, ctypes.byref(error)
        )
        if status != OK:
            _raise(self.lib, status, error)
        return outputs

    def close(self) -> None:
        if self.handle:
            self.lib.edgecv_free(self.handle)
            self.handle = ctypes.c_void_p()
