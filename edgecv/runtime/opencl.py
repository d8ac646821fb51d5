"""The OpenCL backend: TVM-generated OpenCL C, run through pyopencl.

TVM's wheel has no OpenCL runtime, so this backend is the runtime: one program per
model, compiled in pieces (:mod:`.opencl_pieces`: one per step kernel, on every core)
once per device and driver and then loaded from the on-disk binary cache
(:mod:`.kernel_cache`), buffers allocated once by the executor, and each kernel
call replays the launches recorded at build time (:class:`~edgecv.package_format.Launch`)
with ``clEnqueueNDRangeKernel``. Devices are refused, with the reason, before any
compilation when they lack an extension the program uses.

The context, programs and memory are shared by every execution context of a model;
each context gets its own command queue (:meth:`OpenCLBackend.stream`) and binds its
own ``cl.Kernel`` objects: a kernel's arguments are state of the kernel object, which
two threads enqueueing it with their own buffers would overwrite for each other.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..errors import EdgecvError, PackageError
from ..package_format import Launch
from . import compiler_process, kernel_cache
from .backend import Backend, planned_arguments, planned_workspaces
from .opencl_devices import register_pip_runtimes
from .opencl_pieces import split_program


def build_options(requires: Sequence[str]) -> list[str]:
    """OpenCL C 3.0 only for subgroup builtins (Intel's compiler wants it there); other
    programs stay OpenCL C 1.2, which every device (Mali's included) compiles."""
    return ["-cl-std=CL3.0"] if any("subgroups" in ext for ext in requires) else []


# Built programs (and their OpenCL contexts) kept for the next load of the same kernels
# on the same device, the most recently used last: a model loaded again runs on the
# program it ran on, with no build. It spares memory too: cl.Kernel objects made from a
# new program leave memory behind in pyopencl's argument-setting code (measured on
# Intel's runtime, 2026-11-26: loading and dropping tests/user_models.tiny_yolo grew RSS
# by 8.8 MiB over 1,000 loads with a program per load, 68 KiB a load with pyopencl's
# cache off, and not at all over 400 loads of one kept program).
PROGRAMS_KEPT = 8
_programs: dict[tuple, tuple] = {}
_programs_lock = threading.Lock()

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
        try:
            platforms = cl.get_platforms()
        except cl.Error:
            platforms = []
        every = [(p, d) for p in platforms for d in p.get_devices()]
        query = device_query.lower()
        matching = [(p, d) for p, d in every if query in f"{_label(p, d)} / {p.vendor}".lower()]
        if not matching:
            listed = "; ".join(_label(p, d) for p, d in every) or "none"
            raise DeviceNotFoundError(
                f"no OpenCL device matches `{device_query}` (devices here: {listed}); "
                "see `edgecv devices`"
            )
        capable = [(p, d) for p, d in matching if not _missing(d, requires)]
        capable.sort(key=lambda pd: _rank(*pd))  # real GPUs first, simulators last
        if not capable:
            able = [_label(p, d) for p, d in every if not _missing(d, requires)]
            missing = sorted({ext for _, d in matching for ext in _missing(d, requires)})
            raise DeviceNotFoundError(
                f"this package needs {', '.join(missing)}, which "
                f"{'; '.join(_label(p, d) for p, d in matching)} lacks; "
                + (
                    f"devices that have it: {'; '.join(able)} (pick one with --on)"
                    if able
                    else "no device on this machine has it: redeploy "
                    + (
                        "with --precision fp32"  # float16 arithmetic: an fp16 package
                        if missing == ["cl_khr_fp16"]
                        else "for a profile without that capability (aisage, local) or --device cpu"
                    )
                )
            )
        failures, failing, crashed = [], [], True
        started = time.perf_counter()
        options = build_options(requires)
        digest = hashlib.sha256(source.encode()).hexdigest()
        for platform, device in capable:  # the first one whose compiler builds the program
            key = (device.int_ptr, digest, tuple(options))
            with _programs_lock:
                built = _programs.pop(key, None)
                if built is not None:
                    _programs[key] = built  # the most recently used last
            if built is None:
                context = cl.Context([device])
                try:
                    kernels, compiled = _build_program(cl, context, device, source, options)
                except ProgramBuildError as err:
                    failures.append(f"{_label(platform, device)}: {err}")
                    failing.extend(err.kernels)
                    crashed = crashed and err.crashed
                    continue
                built = (context, kernels)
                self.pieces_compiled = (compiled, len({p for p, _ in kernels.values()}))
                with _programs_lock:
                    _programs[key] = built
                    while len(_programs) > PROGRAMS_KEPT:
                        del _programs[next(iter(_programs))]
            else:
                self.pieces_compiled = (0, len({p for p, _ in built[1].values()}))
            # each device kernel's (program, its name there), see cl_kernel()
            self.device, (self.context, self.programs) = device, built
            break
        else:
            raise ProgramBuildError(
                f"the OpenCL program failed to build on every device matching "
                f"`{device_query}`:\n" + "\n".join(failures),
                dict.fromkeys(failing),
                crashed=crashed,
            )
        self.build_s = time.perf_counter() - started
        # (pieces compiled now, pieces): the rest came from the cache (or this process)
        self.program_cached = self.pieces_compiled[0] == 0
        if failures:
            skipped = ", ".join(f.split(":")[0] for f in failures)
            warnings.warn(
                f"OpenCL device(s) that cannot build the program: {skipped}", stacklevel=2
            )
        self.queue = cl.CommandQueue(self.context)
        self.events: list | None = None  # (step kernel, OpenCL kernel, event) when profiling
        self.launches = launches
        self._memory = _DeviceMemory()  # one count for this backend and its streams
        self.label = _label(self.device.platform, self.device)

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


class DeviceNotFoundError(EdgecvError):
    """No device matches the query, or none has what the package needs."""


class ProgramBuildError(EdgecvError):
    """The device's OpenCL compiler rejected the program (``kernels``: the ones named
    by its log, empty when it rejected everything, e.g. a compiler that cannot run),
    or died compiling it (``crashed``; which kernels it died on is not known)."""

    def __init__(self, message: str, kernels: Sequence[str] = (), crashed: bool = False):
        super().__init__(message)
        self.kernels = list(kernels)
        self.crashed = crashed


def compile_on_device(query: str, source: str, requires: Sequence[str] = ()) -> str:
    """Compile ``source`` on the first matching device (filling the program cache);
    return what was done (the device, how many pieces it compiled). Raises like
    :class:`OpenCLBackend`."""
    backend = OpenCLBackend(query, source, {}, requires)
    compiled, pieces = backend.pieces_compiled
    if compiled == pieces:
        return f"{pieces} kernels compiled on {backend.label}"
    return f"{compiled} of {pieces} kernels compiled on {backend.label}, the rest cached"


class DeviceMemoryError(EdgecvError):
    """The device cannot hold the model's buffers."""


def is_simulator(platform_name: str) -> bool:
    """Oclgrind interprets every work-item: right for checking kernels, far too slow
    to run models on unless asked for by name."""
    return "oclgrind" in platform_name.lower()


def _rank(platform, device) -> int:
    if is_simulator(platform.name):
        return 2
    return 0 if device.type & 4 else 1  # CL_DEVICE_TYPE_GPU


def _label(platform, device) -> str:
    return f"{platform.name.strip()} / {device.name.strip()}"


def _missing(device, requires: Sequence[str]) -> list[str]:
    extensions = set(device.extensions.split())
    return [ext for ext in requires if ext not in extensions]


@contextlib.contextmanager
def _quiet_compiler(cl):
    """Compiler chatter (Intel's "build succeeded" log, also when it loads a cached
    binary) is not the user's concern: pyopencl's CompilerWarning is silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cl.CompilerWarning)
        yield


def _build_program(
    cl, context, device, source: str, options: list[str]
) -> tuple[dict[str, tuple], int]:
    """Build ``source`` for ``device`` in pieces (:mod:`.opencl_pieces`), each from the
    on-disk binary cache when it is there, the rest compiled at once in the compiler
    processes.

    Returns each kernel's (program, name in that program) and how many pieces were
    compiled (not found in the cache). Raises :class:`ProgramBuildError` naming the
    kernels of every piece the compiler rejected or crashed on.
    """
    pieces = split_program(source)
    platform = device.platform
    identity = (platform.name, platform.version, device.name, device.version)
    identity += (device.driver_version,)
    # each piece with the options its own code needs (the language version subgroup
    # builtins want), so it is the same piece in every program that holds it
    own = [options if "sub_group" in p.source else [] for p in pieces]
    keys = [
        kernel_cache.cache_key("opencl", p.source, " ".join(o), *identity)
        for p, o in zip(pieces, own)
    ]
    programs: list = [None] * len(pieces)
    for i, key in enumerate(keys):
        binary = kernel_cache.read(key, "clbin")
        if binary is None:
            continue
        try:
            with _quiet_compiler(cl):
                programs[i] = cl.Program(context, [device], [binary]).build(options=own[i])
        except cl.Error:  # a corrupt or foreign entry: forget it and compile the source
            kernel_cache.forget(key, "clbin")
    # a piece two kernels share (the same code under two names) compiles once
    missing = list({keys[i]: i for i, program in enumerate(programs) if program is None}.values())
    results = _compile_pieces(platform, device, [(pieces[i].source, own[i]) for i in missing])
    rejected, crashed = [], []
    for i, (kind, value) in zip(missing, results):
        try:
            with _quiet_compiler(cl):
                if kind == "binary" and value is not None:
                    program = cl.Program(context, [device], [value]).build(options=own[i])
                elif kind == "binary":  # no worker, or one without binaries: build here
                    program = cl.Program(context, pieces[i].source).build(
                        options=own[i], cache_dir=False
                    )
                elif kind == "rejected":
                    raise compiler_process.CompilerRejected(value)
                else:
                    crashed.append((pieces[i], value))
                    continue
        except (cl.RuntimeError, compiler_process.CompilerRejected) as err:
            rejected.append((pieces[i], str(err).strip()))
            continue
        programs[i] = program
        binaries = program.get_info(cl.program_info.BINARIES)
        if binaries and binaries[0]:
            kernel_cache.write(keys[i], "clbin", bytes(binaries[0]))
    if rejected or crashed:
        raise _build_error(rejected, crashed)
    built = {keys[i]: programs[i] for i in missing}
    programs = [p if p is not None else built[k] for p, k in zip(programs, keys)]
    kernels = {
        name: (program, there)
        for piece, program in zip(pieces, programs)
        for name, there in piece.names.items()
    }
    return kernels, len(missing)


def _compile_pieces(platform, device, sources: list[tuple[str, list[str]]]) -> list[tuple]:
    """Each (source, options) compiled in a compiler process, as many at once as there
    are cores: ``("binary", bytes | None)``, ``("rejected", log)`` or ``("crashed",
    message)``; all ``("binary", None)`` (build here) when compiles stay in this process."""
    if not compiler_process.in_worker() or not sources:
        return [("binary", None)] * len(sources)

    def compile_one(source_and_options: tuple[str, list[str]]) -> tuple:
        source, options = source_and_options
        try:
            return "binary", compiler_process.compile_in_worker(
                platform.name, device.name, source, options
            )
        except compiler_process.CompilerRejected as err:
            return "rejected", err.log
        except compiler_process.CompilerCrash as err:
            return "crashed", str(err)

    with ThreadPoolExecutor(min(len(sources), compiler_process.parallel())) as pool:
        return list(pool.map(compile_one, sources))


def _build_error(rejected: list, crashed: list) -> ProgramBuildError:
    """One error for every piece that failed: the kernels it holds (their names in the
    program) and the compiler's log or how it crashed."""
    parts, names = [], []
    for piece, log in rejected:
        names += piece.names
        parts.append(f"kernel {', '.join(piece.names)} failed to compile:\n{log[:3000]}")
    for piece, message in crashed:
        names += piece.names
        parts.append(f"kernel {', '.join(piece.names)}: {message}")
    return ProgramBuildError("\n".join(parts), names, crashed=not rejected)
