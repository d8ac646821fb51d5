"""The OpenCL backend: TVM-generated OpenCL C, run through pyopencl.

TVM's wheel has no OpenCL runtime, so this backend is the runtime: one program per
model (built once per device, then cached by the driver), buffers allocated once by
the executor, and each kernel call replays the launches recorded at build time
(:class:`~edgecv.build.opencl.Launch`) with ``clEnqueueNDRangeKernel``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..build.opencl import Launch
from ..errors import EdgecvError
from .backend import Backend
from .opencl_devices import register_pip_runtimes

_SCALARS = {"int": np.int32, "long": np.int64, "float": np.float32}


@dataclass
class CLTensor:
    """A typed view of the start of an OpenCL buffer."""

    buffer: object
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


class OpenCLBackend(Backend):
    """Runs recorded OpenCL launches on one device.

    Parameters
    ----------
    device_query : str
        Case-insensitive part of the platform, vendor or device name (``intel``, ``pocl``);
        among several matches the first whose compiler builds the program is used.
    source : str
        The OpenCL C program holding every kernel.
    launches : dict
        PrimFunc name -> its launches, as recorded by :func:`~edgecv.build.opencl.build_opencl`.
    """

    name = "opencl"

    def __init__(self, device_query: str, source: str, launches: dict[str, list[Launch]]):
        register_pip_runtimes()
        import pyopencl as cl

        self.cl = cl
        devices = [
            dev
            for platform in cl.get_platforms()
            for dev in platform.get_devices()
            if device_query.lower() in f"{platform.name} / {platform.vendor} / {dev.name}".lower()
        ]
        if not devices:
            raise EdgecvError(f"no OpenCL device matches `{device_query}`; see `edgecv devices`")
        failures = []
        for device in devices:  # the first one whose compiler builds the program
            context = cl.Context([device])
            try:
                with warnings.catch_warnings():
                    # Compiler chatter (Intel's "build succeeded" log) is not the user's
                    # concern; a failed build is reported below with its log.
                    warnings.simplefilter("ignore", cl.CompilerWarning)
                    program = cl.Program(context, source).build()
            except cl.RuntimeError as err:
                failures.append(f"{device.name}: {str(err).strip()[:1500]}")
                continue
            self.device, self.context, self.program = device, context, program
            break
        else:
            raise EdgecvError(
                f"the OpenCL program failed to build on every device matching "
                f"`{device_query}`:\n" + "\n".join(failures)
            )
        if failures:
            skipped = ", ".join(f.split(":")[0] for f in failures)
            warnings.warn(
                f"OpenCL device(s) that cannot build the program: {skipped}", stacklevel=2
            )
        self.queue = cl.CommandQueue(self.context)
        self.launches = launches

    def alloc(self, nbytes: int):
        return self.cl.Buffer(self.context, self.cl.mem_flags.READ_WRITE, size=max(nbytes, 4))

    def view(self, storage, shape: tuple[int, ...], dtype: str) -> CLTensor:
        buffer = storage.buffer if isinstance(storage, CLTensor) else storage
        return CLTensor(buffer, tuple(shape), dtype)

    def upload(self, tensor: CLTensor, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array, dtype=tensor.dtype)
        self.cl.enqueue_copy(self.queue, tensor.buffer, data)

    def download(self, tensor: CLTensor) -> np.ndarray:
        out = np.empty(tensor.shape, tensor.dtype)
        self.cl.enqueue_copy(self.queue, out, tensor.buffer)
        return out

    def kernel(self, name: str) -> Callable[..., None]:
        def run(*tensors: CLTensor) -> None:
            self.bind(name, list(tensors))()

        return run

    def bind(self, name: str, tensors: list[CLTensor]) -> Callable[[], None]:
        """One ``cl.Kernel`` per recorded launch with its arguments set now, so running
        the step only enqueues (a kernel name shared by several steps gets its own
        objects per step)."""
        if name not in self.launches:
            raise EdgecvError(f"kernel `{name}` has no OpenCL launches in this package")
        prepared = []
        for launch in self.launches[name]:
            kernel = self.cl.Kernel(self.program, launch.kernel)
            for i, (kind, value, ctype) in enumerate(launch.args):
                if kind == "buffer":
                    kernel.set_arg(i, tensors[int(value)].buffer)
                else:
                    kernel.set_arg(i, _SCALARS[ctype](value))
            prepared.append((kernel, launch.global_size, launch.local_size))
        enqueue, queue = self.cl.enqueue_nd_range_kernel, self.queue

        def run() -> None:
            for kernel, global_size, local_size in prepared:
                enqueue(queue, kernel, global_size, local_size)

        return run

    def synchronize(self) -> None:
        self.queue.finish()
