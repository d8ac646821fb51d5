"""OpenCL programs: which device runs a package, and its program built there once.

A package's OpenCL C program is built for the first matching device whose compiler
accepts it: devices are refused, with the reason, before any compilation when they lack
an extension the program uses; the program is compiled in pieces (:mod:`.opencl_pieces`:
one per step kernel, on every core in the compiler processes) once per device and driver
and then loaded from the on-disk binary cache (:mod:`.kernel_cache`). A built program
and its context are kept in this process for the next load of the same kernels.

:mod:`.opencl` launches the kernels of the program chosen here.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..errors import EdgecvError
from . import compiler_process, kernel_cache
from .opencl_devices import register_pip_runtimes
from .opencl_pieces import split_program


def build_options(requires: Sequence[str]) -> list[str]:
    """OpenCL C 3.0 only for subgroup builtins (Intel's compiler wants it there); other
    programs stay OpenCL C 1.2, which every device (Mali's included) compiles."""
    return ["-cl-std=CL3.0"] if any("subgroups" in ext for ext in requires) else []


# Built programs (and their OpenCL contexts) kept for the next load of the same kernels
# on the same device, the most recently used last: a model loaded again runs on the
# program it ran on, with no build. It spares memory too: cl.Kernel objects made from a
# new program leave memory behind in pyopencl's argument-setting code, which a kept
# program does not (benchmarks/results/soak-2026-11-26-zen3.md, the reload rows).
PROGRAMS_KEPT = 8
_programs: dict[tuple, tuple] = {}
_programs_lock = threading.Lock()


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


@dataclass
class BuiltProgram:
    """The program of a package on the device chosen for it."""

    device: object  # the cl.Device
    context: object  # the cl.Context the program was built in
    programs: dict  # each device kernel's (cl.Program, its name there)
    pieces_compiled: tuple[int, int]  # (compiled now, pieces): the rest came from a cache
    build_s: float  # seconds spent choosing the device and building


def open_program(cl, device_query: str, source: str, requires: Sequence[str]) -> BuiltProgram:
    """``source`` built on the first device matching ``device_query`` that has the
    extensions in ``requires`` and whose compiler builds it (real GPUs first, simulators
    last); the matching devices that failed to build it are named in a warning. Raises
    :class:`DeviceNotFoundError` when none matches or none has the extensions,
    :class:`ProgramBuildError` when every capable one fails to build it."""
    started = time.perf_counter()
    capable = _capable_devices(cl, device_query, requires)
    failures, failing, crashed = [], [], True
    options = build_options(requires)
    digest = hashlib.sha256(source.encode()).hexdigest()
    for platform, device in capable:  # the first one whose compiler builds the program
        key = (device.int_ptr, digest, tuple(options))
        with _programs_lock:
            built = _programs.pop(key, None)
            if built is not None:
                _programs[key] = built  # the most recently used last
        if built is not None:
            pieces_compiled = (0, len({p for p, _ in built[1].values()}))
        else:
            context = cl.Context([device])
            try:
                kernels, compiled = _build_program(cl, context, device, source, options)
            except ProgramBuildError as err:
                failures.append(f"{label(platform, device)}: {err}")
                failing.extend(err.kernels)
                crashed = crashed and err.crashed
                continue
            built = (context, kernels)
            pieces_compiled = (compiled, len({p for p, _ in kernels.values()}))
            with _programs_lock:
                _programs[key] = built
                while len(_programs) > PROGRAMS_KEPT:
                    del _programs[next(iter(_programs))]
        if failures:  # stacklevel: whoever asked for the backend or the compile
            skipped = ", ".join(f.split(":")[0] for f in failures)
            warnings.warn(
                f"OpenCL device(s) that cannot build the program: {skipped}", stacklevel=3
            )
        elapsed = time.perf_counter() - started
        return BuiltProgram(device, built[0], built[1], pieces_compiled, elapsed)
    raise ProgramBuildError(
        f"the OpenCL program failed to build on every device matching "
        f"`{device_query}`:\n" + "\n".join(failures),
        dict.fromkeys(failing),
        crashed=crashed,
    )


def compile_on_device(query: str, source: str, requires: Sequence[str] = ()) -> str:
    """Compile ``source`` on the first matching device (filling the program cache);
    return what was done (the device, how many pieces it compiled). Raises like
    :func:`open_program`."""
    register_pip_runtimes()
    import pyopencl as cl

    built = open_program(cl, query, source, requires)
    compiled, pieces = built.pieces_compiled
    where = label(built.device.platform, built.device)
    if compiled == pieces:
        return f"{pieces} kernels compiled on {where}"
    return f"{compiled} of {pieces} kernels compiled on {where}, the rest cached"


def _capable_devices(cl, device_query: str, requires: Sequence[str]) -> list[tuple]:
    """(platform, device) of every device matching the query that has the extensions the
    program uses, best first; raises :class:`DeviceNotFoundError` naming what is here
    when there is none."""
    try:
        platforms = cl.get_platforms()
    except cl.Error:
        platforms = []
    every = [(p, d) for p in platforms for d in p.get_devices()]
    query = device_query.lower()
    matching = [(p, d) for p, d in every if query in f"{label(p, d)} / {p.vendor}".lower()]
    if not matching:
        listed = "; ".join(label(p, d) for p, d in every) or "none"
        raise DeviceNotFoundError(
            f"no OpenCL device matches `{device_query}` (devices here: {listed}); "
            "see `edgecv devices`"
        )
    capable = [(p, d) for p, d in matching if not _missing(d, requires)]
    capable.sort(key=lambda pd: _rank(*pd))  # real GPUs first, simulators last
    if capable:
        return capable
    able = [label(p, d) for p, d in every if not _missing(d, requires)]
    missing = sorted({ext for _, d in matching for ext in _missing(d, requires)})
    raise DeviceNotFoundError(
        f"this package needs {', '.join(missing)}, which "
        f"{'; '.join(label(p, d) for p, d in matching)} lacks; "
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


def is_simulator(platform_name: str) -> bool:
    """Oclgrind interprets every work-item: right for checking kernels, far too slow
    to run models on unless asked for by name."""
    return "oclgrind" in platform_name.lower()


def _rank(platform, device) -> int:
    if is_simulator(platform.name):
        return 2
    return 0 if device.type & 4 else 1  # CL_DEVICE_TYPE_GPU


def label(platform, device) -> str:
    """How a device is named in messages: ``platform / device``."""
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
