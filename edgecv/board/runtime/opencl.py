"""The OpenCL backend: TVM-generated OpenCL C, run through pyopencl.

TVM's wheel has no OpenCL runtime, so this backend is the runtime: the program is built
once per device and driver (:mod:`.opencl_program` chooses the device and builds or
finds the program), buffers are allocated once by the executor, and each kernel call
replays the launches recorded at build time (:class:`~edgecv.board.plan.Launch`)
with ``clEnqueueNDRangeKernel``.

The context, programs and memory are shared by every execution context of a model;
each context gets its own command queue (:meth:`OpenCLBackend.stream`) and binds its
own ``cl.Kernel`` objects: a kernel's arguments are state of the kernel object, which
two threads enqueueing it with their own buffers would overwrite for each other.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import EdgecvError, PackageError
from ..plan import Launch
from .backend import Backend, planned_arguments, planned_workspaces
from .opencl_devices import register_pip_runtimes
from .opencl_program import label, open_program

_SCALARS = {"int": np.int32, "long": np.int64, "float": np.float32}


@dataclass
class CLTensor:
    """A typed view of an OpenCL buffer (of a sub-buffer, for one at an offset)."""

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
        PrimFunc name -> its launches, as recorded by :func:`~edgecv.codegen.opencl.build_opencl`.
    requires : list of str
        Device extensions the program uses (``cl_intel_subgroups``): devices without
        them are refused before anything is compiled.
    """

    name = "opencl"

    def __init__(
        self,
        device_query: str,
        source: str,
        launches: dict[str, list[Launch]],
        requires: Sequence[str] = (),
    ):
        register_pip_runtimes()
        import pyopencl as cl

        self.cl = cl
        built = open_program(cl, device_query, source, requires)
        # each device kernel's (program, its name there), see cl_kernel()
        self.device, self.context, self.programs = built.device, built.context, built.programs
        self.build_s = built.build_s
        # (pieces compiled now, pieces): the rest came from the cache (or this process)
        self.pieces_compiled = built.pieces_compiled
        self.program_cached = self.pieces_compiled[0] == 0
        self.queue = cl.CommandQueue(self.context)
        self.events: list | None = None  # (step kernel, OpenCL kernel, event) when profiling
        self.launches = launches
        self._memory = _DeviceMemory()  # one count for this backend and its streams
        self.label = label(self.device.platform, self.device)

    @property
    def allocated_bytes(self) -> int:
        """Bytes allocated on the device through this backend and its streams."""
        return self._memory.allocated

    @allocated_bytes.setter
    def allocated_bytes(self, value: int) -> None:
        self._memory.allocated = value

    def stream(self, streams: int = 1) -> OpenCLBackend:
        """This backend with a command queue of its own (an execution context's): the
        device, program and memory count are shared, and kernels bound through it,
        its copies, profiling and :meth:`synchronize` use that queue alone."""
        stream = copy.copy(self)
        stream.queue = self.cl.CommandQueue(self.context)
        stream.events = None
        return stream

    def alloc(self, nbytes: int):
        nbytes = max(nbytes, 4)
        device = self.device
        if nbytes > device.max_mem_alloc_size:
            raise DeviceMemoryError(
                f"{self.label} cannot allocate one buffer of {nbytes / 2**20:.1f} MiB "
                f"(its largest is {device.max_mem_alloc_size / 2**20:.1f} MiB)"
            )
        if self.allocated_bytes + nbytes > device.global_mem_size:
            raise DeviceMemoryError(
                f"{self.label} is out of memory: the model needs more than "
                f"{(self.allocated_bytes + nbytes) / 2**20:.1f} MiB, the device has "
                f"{device.global_mem_size / 2**20:.1f} MiB"
            )
        try:
            buffer = self.cl.Buffer(self.context, self.cl.mem_flags.READ_WRITE, size=nbytes)
        except self.cl.MemoryError as err:
            raise DeviceMemoryError(
                f"{self.label} is out of memory allocating {nbytes / 2**20:.1f} MiB after "
                f"{self.allocated_bytes / 2**20:.1f} MiB: {err}"
            ) from None
        self.allocated_bytes += nbytes
        return buffer

    @contextlib.contextmanager
    def allocation_scope(self):
        """Buffers allocated inside the block are the caller's to drop by its end (the
        graph tuner's meter, one group of candidates at a time): their bytes stop
        counting against the device's memory there."""
        before = self.allocated_bytes
        try:
            yield
        finally:
            self.allocated_bytes = before

    def view(self, storage, shape: tuple[int, ...], dtype: str, offset: int = 0) -> CLTensor:
        buffer = storage.buffer if isinstance(storage, CLTensor) else storage
        tensor = CLTensor(buffer, tuple(shape), dtype)
        if offset:  # a piece of a concatenation's output: a sub-buffer from its offset
            align = self.device.mem_base_addr_align // 8
            if offset % align:
                raise PackageError(
                    f"the package places a tensor {offset} bytes into a buffer, but "
                    f"{self.label} starts sub-buffers only at multiples of {align} bytes: "
                    f"deploy for this device (`--device local`) or set the profile's "
                    f"gpu.mem_base_addr_align_bits to {align * 8}"
                )
            tensor.buffer = buffer.get_sub_region(offset, max(tensor.nbytes, 4))
        return tensor

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

    def cl_kernel(self, name: str):
        """A new ``cl.Kernel`` of the device kernel ``name`` (its name in the package's
        program; the piece that holds it names it by content)."""
        try:
            program, own = self.programs[name]
        except KeyError:
            raise EdgecvError(f"no OpenCL kernel `{name}` in this package's program") from None
        return self.cl.Kernel(program, own)

    def bind(
        self, name: str, tensors: list[CLTensor], workspaces: list[CLTensor] | None = None
    ) -> Callable[[], None]:
        """One ``cl.Kernel`` per recorded launch with its arguments set now, so running
        the step only enqueues (a kernel name shared by several steps gets its own
        objects per step). Device workspaces are the plan's ``workspaces`` tensors, or
        allocated here for the step when the plan has none (see :meth:`Backend.bind`)."""
        if name not in self.launches:
            raise EdgecvError(f"kernel `{name}` has no OpenCL launches in this package")
        prepared = []
        launches = self.launches[name]
        sizes = launches[0].workspaces if launches else []
        if workspaces is None:  # a plan made before workspaces were planned
            scratch = [self.alloc(size) for size in sizes]  # once per step, at load
        else:
            scratch = [t.buffer for t in planned_workspaces(name, workspaces, sizes)]
        planned_arguments(name, tensors, launches[0].buffers if launches else [])
        for launch in launches:
            kernel = self.cl_kernel(launch.kernel)
            for i, (kind, value, ctype) in enumerate(launch.args):
                if kind == "buffer":
                    kernel.set_arg(i, tensors[int(value)].buffer)
                elif kind == "workspace":
                    kernel.set_arg(i, scratch[int(value)])
                else:
                    kernel.set_arg(i, _SCALARS[ctype](value))
            prepared.append((kernel, launch.global_size, launch.local_size))
        enqueue = self.cl.enqueue_nd_range_kernel

        # set_arg holds no reference to a buffer: run() holds the step's own
        def run(_keep=(scratch, [t.buffer for t in tensors])) -> None:
            queue, events = self.queue, self.events  # the queue changes when profiling
            for kernel, global_size, local_size in prepared:
                event = enqueue(queue, kernel, global_size, local_size)
                if events is not None:
                    events.append((name, kernel.function_name, event))

        return run

    def start_profiling(self) -> None:
        """Record an event per launch on a profiling queue (``edgecv bench``); buffers
        belong to the context, so they carry over to the new queue."""
        self.queue.finish()
        props = self.cl.command_queue_properties.PROFILING_ENABLE
        self.queue = self.cl.CommandQueue(self.context, properties=props)
        self.events = []

    def stop_profiling(self) -> list[tuple[str, str, float]]:
        """(step kernel, OpenCL kernel, device seconds) of each launch since
        :meth:`start_profiling`; the queue is a plain one again."""
        self.queue.finish()
        timed = [
            (step, kernel, (event.profile.end - event.profile.start) * 1e-9)
            for step, kernel, event in self.events or []
        ]
        self.queue = self.cl.CommandQueue(self.context)
        self.events = None
        return timed

    def synchronize(self) -> None:
        try:
            self.queue.finish()
        except self.cl.MemoryError as err:  # lazy allocation fails at first use
            raise DeviceMemoryError(f"{self.label} ran out of memory: {err}") from None


@dataclass
class _DeviceMemory:
    allocated: int = 0


class DeviceMemoryError(EdgecvError):
    """The device cannot hold the model's buffers."""
