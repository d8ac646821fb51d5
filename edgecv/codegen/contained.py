"""Compile every kernel in its own forked process, under a time limit.

A user's model must never hang or crash the build. Each kernel is scheduled and
compiled in a child process forked from the build (no re-import of TVM: a fork costs
milliseconds): the child walks the kernel's candidates in the schedule stage's order
(:meth:`~edgecv.schedules.stage.ScheduleOrder.attempts`) and compiles each until one
succeeds, telling the parent before each compile which candidate it is on. A rule that
raises is passed over in the child; a compile that runs past the time limit, or a child
that dies (LLVM aborting, a segfault), is killed or buried by the parent, which forks a
new child starting at the next candidate. Kernels compile on every core at once.

What a compile leaves (an object file, lowered device functions) is written by the
child into the work folder; the parent gets a small picklable dict of facts back.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path

from tvm import tirx

from ..schedules.stage import KernelChoice, ScheduleOrder

# kernel name, scheduled PrimFunc, work folder -> facts (picklable) about the artifact
CompileOne = Callable[[str, tirx.PrimFunc, Path], dict]

DEFAULT_TIME_LIMIT_S = 60.0


@dataclass
class Compiled:
    """A kernel's choice (see :class:`~edgecv.schedules.stage.KernelChoice`) and the
    facts its compile returned (empty when nothing compiled)."""

    choice: KernelChoice
    facts: dict


def compile_contained(
    kernels: dict[str, tirx.PrimFunc],
    order: ScheduleOrder,
    compile_one: CompileOne,
    work_dir: Path,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    workers: int | None = None,
    on_done: Callable[[str, Compiled], None] = lambda name, compiled: None,
) -> dict[str, Compiled]:
    """Schedule and compile ``kernels``; see the module docstring.

    Parameters
    ----------
    kernels : dict
        Kernel name -> unscheduled (or already scheduled) PrimFunc.
    order : ScheduleOrder
        The candidates of each kernel, in order.
    compile_one : callable
        Compiles one scheduled kernel in the child; raises when it cannot.
    work_dir : Path
        Where children write what they compile.
    time_limit_s : float
        Longest a single candidate may take to schedule and compile.
    workers : int, optional
        Children at once (default: the CPU count).
    on_done : callable
        Called in the parent as each kernel finishes (progress).

    Returns
    -------
    dict
        Kernel name -> :class:`Compiled`, in the order of ``kernels``.
    """
    context = multiprocessing.get_context("fork")
    workers = max(1, workers or os.cpu_count() or 1)
    pending = list(kernels)
    results: dict[str, Compiled] = {}
    running: dict[Connection, _Child] = {}
    state = {name: _State(time.perf_counter()) for name in kernels}

    def start(name: str) -> None:
        receive, send = context.Pipe(duplex=False)
        process = context.Process(
            target=_child,
            args=(send, kernels[name], order, compile_one, name, work_dir, state[name].next),
            daemon=True,
        )
        process.start()
        send.close()
        running[receive] = _Child(name, process, time.perf_counter(), state[name].next)

    def finish(name: str, facts: dict, rule: str | None) -> None:
        s = state[name]
        choice = KernelChoice(name, rule, s.passed_over, time.perf_counter() - s.started)
        results[name] = Compiled(choice, facts)
        on_done(name, results[name])

    while pending or running:
        while pending and len(running) < workers:
            start(pending.pop(0))
        deadline = min(c.since + time_limit_s for c in running.values())
        ready = wait(list(running), timeout=max(0.0, deadline - time.perf_counter()))
        for connection in ready:
            child = running[connection]
            s = state[child.name]
            try:
                message = connection.recv()
            except EOFError:  # the child died without a word on its current candidate
                _bury(running, connection)
                s.passed_over.append((s.trying, f"crashed (exit {child.process.exitcode})"))
                if s.next == child.first:  # died before its first candidate: give up
                    finish(child.name, {}, None)
                else:
                    _restart_or_fail(child.name, s, kernels, order, pending, finish)
                continue
            kind = message[0]
            if kind == "try":
                s.trying, s.next = message[2], message[1] + 1
                child.since = time.perf_counter()  # the limit is per candidate
            elif kind == "failed":
                s.passed_over.append((message[2], message[3]))
            elif kind in ("done", "exhausted"):
                _bury(running, connection)
                if kind == "done":
                    finish(child.name, message[2], message[1])
                else:
                    finish(child.name, {}, None)
        now = time.perf_counter()
        for connection in [c for c, child in running.items() if now - child.since > time_limit_s]:
            child = _bury(running, connection, kill=True)
            s = state[child.name]
            s.passed_over.append((s.trying, f"compile exceeded the {time_limit_s:g} s limit"))
            _restart_or_fail(child.name, s, kernels, order, pending, finish)
    return {name: results[name] for name in kernels}


def compile_in_process(
    kernels: dict[str, tirx.PrimFunc],
    order: ScheduleOrder,
    compile_one: CompileOne,
    work_dir: Path,
) -> dict[str, Compiled]:
    """What :func:`compile_contained` does, in this process: each kernel's candidates in
    the schedule stage's order until one compiles, with the same ``compile_one`` and the
    same result; no fork, no time limit (tests and benchmarks that build kernels alone:
    a hang or crash there is the test's to report)."""
    results = {}
    for name, func in kernels.items():
        started, passed_over = time.perf_counter(), []

        def tell(kind, index, rule, error=None, passed_over=passed_over):
            if kind == "failed":
                passed_over.append((rule, error))

        rule, facts = _walk(func, order, compile_one, name, work_dir, 0, tell) or (None, {})
        choice = KernelChoice(name, rule, passed_over, time.perf_counter() - started)
        results[name] = Compiled(choice, facts)
    return results


@dataclass
class _Child:
    name: str
    process: multiprocessing.Process
    since: float
    first: int  # the candidate index it started from


@dataclass
class _State:
    started: float
    next: int = 0  # the candidate index a new child starts from
    trying: str = "?"

    def __post_init__(self) -> None:
        self.passed_over: list[tuple[str, str]] = []


def _bury(running: dict[Connection, _Child], connection: Connection, kill: bool = False) -> _Child:
    """The child reading into ``connection`` taken out of ``running``: killed first when
    ``kill`` (past its time limit), waited for, its pipe closed."""
    child = running.pop(connection)
    if kill:
        child.process.kill()
    child.process.join()
    connection.close()
    return child


def _restart_or_fail(name, state: _State, kernels, order: ScheduleOrder, pending, finish):
    if state.next < len(order.names(kernels[name])):
        pending.insert(0, name)
    else:
        finish(name, {}, None)


def _child(
    send: Connection,
    func,
    order: ScheduleOrder,
    compile_one: CompileOne,
    name: str,
    work_dir: Path,
    start: int,
) -> None:
    """Runs in the forked child: try candidates from ``start`` until one compiles."""
    # A library loaded by the build (Intel's OpenCL runtime) may have installed its own
    # crash handler, which can return from a SIGSEGV: a crash here must end the child.
    for number in (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE):
        signal.signal(number, signal.SIG_DFL)
    try:
        done = _walk(func, order, compile_one, name, work_dir, start, lambda *m: send.send(m))
        send.send(("done", *done) if done else ("exhausted",))
    except BaseException:  # never let a child unwind into the parent's code
        traceback.print_exc()
    finally:
        send.close()
        os._exit(0)


def _walk(
    func, order: ScheduleOrder, compile_one: CompileOne, name: str, work_dir: Path, start: int, tell
) -> tuple[str, dict] | None:
    """A kernel's candidates from ``start`` in the schedule stage's order until one
    compiles: (its rule, the facts ``compile_one`` returned), or None. ``tell`` hears
    ("try", index, rule) before each rule runs (a rule that hangs is charged to itself)
    and ("failed", index, rule, why) after each that does not compile."""
    for index, rule in enumerate(order.names(func)):
        if index < start:
            continue
        tell("try", index, rule)
        candidate = order.candidate(func, index)
        if candidate is None:  # not this rule's kind of kernel
            continue
        if candidate.func is None:
            tell("failed", index, rule, candidate.error)
            continue
        try:
            return rule, compile_one(name, candidate.func, work_dir)
        except Exception as err:
            tell("failed", index, rule, _reason(err))
    return None


def _reason(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[-1] if lines else ''}"[:240]
