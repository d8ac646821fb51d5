"""The OpenCL compiler, run in a process of its own.

A vendor's OpenCL compiler runs inside whichever process calls ``clBuildProgram``;
when it crashes (Intel's CPU runtime segfaulted on a tuning candidate) or hangs, it
takes that process along: a deploy, a tuning run, a user's application loading a
package. So a program is compiled from source in a worker process, which hands back
the program's binary; the caller creates its program from that binary (milliseconds).

A worker is started on first need and kept for the next programs (its runtime and
contexts stay warm); a process using edgecv has as many as it compiled programs at
once, at most one per core (a model's program compiles in pieces,
:mod:`.opencl_pieces`). A worker is a fresh interpreter
(``python -m edgecv.board.runtime.compiler_process``): not a fork, which is unsafe once an
OpenCL runtime runs threads in the caller, and not multiprocessing's *spawn*, which
re-runs a user's ``__main__``. A worker that dies while compiling, or runs past the
time limit, is buried (and killed) and replaced by the next compile; the compile raises
:class:`CompilerCrash`, naming the device and how the worker ended.

Protocol: length-prefixed pickles over the worker's stdin and stdout; the worker's
stderr (compiler chatter, a crash report) goes to a file whose tail a crash quotes.
``EDGECV_COMPILER_PROCESS=0`` compiles in the calling process instead.
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..errors import EdgecvError

# A whole model's program on a CPU runtime compiles in seconds to a minute; PoCL's
# slowest seen took minutes. Past this, the compile is taken for a hang.
DEFAULT_TIME_LIMIT_S = 900.0
_HEADER = struct.Struct("<Q")
PARENT_ENV = "EDGECV_COMPILER_PARENT"


class CompilerRejected(Exception):
    """The compiler reported errors (``log``): the source is wrong for this device."""

    def __init__(self, log: str):
        super().__init__(log)
        self.log = log


class CompilerCrash(EdgecvError):
    """The device's OpenCL compiler died (or hung) compiling a program; what it was
    compiling is not known to be wrong, only that this compiler cannot build it."""


def worker_command() -> list[str]:
    """How a worker is started (tests start one that crashes on demand)."""
    return [sys.executable, "-m", "edgecv.board.runtime.compiler_process"]


def in_worker() -> bool:
    """Whether compiles go to the worker (``EDGECV_COMPILER_PROCESS=0``: in process)."""
    return os.environ.get("EDGECV_COMPILER_PROCESS", "1") != "0"


def _send(stream, message) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(payload)) + payload)
    stream.flush()


def _read_exactly(stream, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _receive(stream):
    (size,) = _HEADER.unpack(_read_exactly(stream, _HEADER.size))
    return pickle.loads(_read_exactly(stream, size))


class _Worker:
    """One worker process and the file its stderr goes to."""

    def __init__(self):
        package_root = str(Path(__file__).resolve().parents[3])  # the folder above edgecv/
        env = dict(os.environ)
        # the worker imports this edgecv, also when it was found through sys.path only
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        env[PARENT_ENV] = str(os.getpid())  # the worker ends when this process is gone
        self.log = tempfile.TemporaryFile(prefix="edgecv-cl-compiler-")
        self.process = subprocess.Popen(
            worker_command(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            start_new_session=True,
        )

    def compile(self, request: tuple, time_limit_s: float):
        _send(self.process.stdin, request)
        ready, _, _ = select.select([self.process.stdout], [], [], time_limit_s)
        if not ready:
            raise TimeoutError
        return _receive(self.process.stdout)

    def bury(self) -> tuple[str, str]:
        """Kill the worker if it still runs; how it ended, and the tail of its stderr
        (a compiler's crash report)."""
        if self.process.poll() is None:
            self.process.kill()
        code = self.process.wait()
        self.log.seek(0)
        tail = self.log.read()[-400:].decode(errors="replace").strip()
        self.log.close()
        if code >= 0:
            return f"exit status {code}", tail
        try:
            return signal.Signals(-code).name, tail
        except ValueError:
            return f"signal {-code}", tail

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()  # the worker's loop ends at end of input
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.log.close()


_lock = threading.Lock()
_idle: list[_Worker] = []  # workers between compiles, each ready for the next


def parallel() -> int:
    """How many programs may compile at once: one worker per core this process may use."""
    return max(1, len(os.sched_getaffinity(0)))


def workers() -> list[_Worker]:
    """The workers waiting for a compile (tests look at their processes)."""
    with _lock:
        return list(_idle)


def compile_in_worker(
    platform: str,
    device: str,
    source: str,
    options: list[str],
    time_limit_s: float | None = None,
) -> bytes | None:
    """Compile ``source`` for the device named by its ``platform`` and ``device`` names,
    in a worker of its own while the compile runs (threads may compile at once, each in
    its own worker).

    Returns the program binary, or ``None`` when the worker has none to give (a runtime
    without binaries; a device the worker does not see): the caller then builds the
    source itself. Raises :class:`CompilerRejected` with the compiler's log when it
    reports errors, :class:`CompilerCrash` when the worker died or ran past
    ``time_limit_s`` (default :data:`DEFAULT_TIME_LIMIT_S`).
    """
    limit = DEFAULT_TIME_LIMIT_S if time_limit_s is None else time_limit_s
    worker = _take()
    try:
        kind, value = worker.compile((platform, device, source, options), limit)
    except TimeoutError:
        how, tail = f"ran past {limit:g} s (killed)", worker.bury()[1]
    except (EOFError, OSError, pickle.UnpicklingError, struct.error):
        ended, tail = worker.bury()
        how = f"died ({ended})"
    else:
        with _lock:
            _idle.append(worker)
        if kind == "rejected":
            raise CompilerRejected(value)
        return value
    said = f"\nits last output: ...{tail[-300:]}" if tail else ""
    raise CompilerCrash(
        f"the OpenCL compiler of {platform.strip()} / {device.strip()} {how} compiling a "
        f"program of {source.count('__kernel')} kernel(s){said}"
    )


def _take() -> _Worker:
    """An idle worker that is still alive, else a new one."""
    with _lock:
        while _idle:
            worker = _idle.pop()
            if worker.process.poll() is None:
                return worker
            worker.bury()
    return _Worker()


def stop_worker() -> None:
    """End the idle workers (the next compile starts a new one)."""
    with _lock:
        idle = list(_idle)
        _idle.clear()
    for worker in idle:
        worker.close()


atexit.register(stop_worker)


# ----------------------------------------------------------------- the worker side


def _serve(stdin, stdout) -> None:
    """Compile requests until end of input: ``(platform, device, source, options)`` ->
    ``("binary", bytes | None)`` or ``("rejected", log)``."""
    import warnings

    from .opencl_devices import register_pip_runtimes

    register_pip_runtimes()
    import pyopencl as cl

    contexts: dict[tuple[str, str], tuple] = {}
    while True:
        try:
            platform_name, device_name, source, options = _receive(stdin)
        except EOFError:
            return
        key = (platform_name, device_name)
        if key not in contexts:
            found = [
                d
                for p in cl.get_platforms()
                if p.name.strip() == platform_name.strip()
                for d in p.get_devices()
                if d.name.strip() == device_name.strip()
            ]
            if not found:  # the caller compiles it (as before there was a worker)
                _send(stdout, ("binary", None))
                continue
            contexts[key] = (found[0], cl.Context([found[0]]))
        device, context = contexts[key]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", cl.CompilerWarning)
                program = cl.Program(context, source).build(options=options, cache_dir=False)
        except cl.RuntimeError as err:
            _send(stdout, ("rejected", str(err)))
            continue
        binaries = program.get_info(cl.program_info.BINARIES)
        _send(stdout, ("binary", bytes(binaries[0]) if binaries and binaries[0] else None))


def _exit_with_parent(parent: int, every_s: float = 1.0) -> None:
    """End this worker once its parent is gone. End of input says so only between
    compiles: a worker whose parent was killed mid-compile went on for minutes (PoCL)
    as an orphan. (Not PR_SET_PDEATHSIG: it fires when the *thread* that started the
    worker ends, and any of a caller's threads may start it.)"""
    while True:
        time.sleep(every_s)
        if os.getppid() != parent:
            os._exit(0)


def main() -> None:
    """The worker: requests on stdin, answers on stdout (which nothing else may print
    to: what else goes to stdout is sent to stderr)."""
    # the parent's pid as it gave it: it may be gone before this line runs
    parent = int(os.environ.get(PARENT_ENV) or os.getppid())
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    _serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
