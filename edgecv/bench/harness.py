"""The one timing harness: timed runs, alternating turns, percentiles.

Runtimes compared on a shared machine are timed in ALTERNATING turns (A, B, C, A, B,
C, ...) in one process, so a change of the machine's load hits each alike; MXNet's and
ONNX Runtime's busy-waiting thread pools make sequential blocks misleading.

Each turn starts by SETTLING: untimed runs of the turn's runtime for at least
SETTLE_S (and at least one run), while the threads of the runtime timed before it
spin and then sleep; then TURN timed runs. ONNX Runtime's and OpenVINO's pool threads
keep spinning for milliseconds after a run returns, and TVM's pool yields the cores to
them: with one settle run and one timed run a turn both measured far slower than alone
(benchmarks/results/bench_turns-2026-11-25-2core.md).

Throughput under concurrent callers (``edgecv bench --streams N``) is timed the same
way, a ROUND at a time: N threads, each one runtime's caller, start together and make
a fixed number of calls; the round's throughput is all their calls over its wall
time, and the runtimes take rounds in turns (:func:`alternate_concurrent`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

# Untimed seconds at the start of each turn, and timed runs a turn (module docstring).
SETTLE_S = 0.05
TURN = 5


@dataclass
class Timings:
    """Seconds of each timed run of one runtime."""

    name: str
    seconds: np.ndarray

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.seconds, q))

    @property
    def median(self) -> float:
        return self.percentile(50)

    @property
    def throughput(self) -> float:
        """Inferences per second, one at a time (1 / mean latency)."""
        return 1.0 / float(np.mean(self.seconds))

    def summary_ms(self) -> dict[str, float]:
        """p50/p90/p99/mean/min in milliseconds, and throughput per second."""
        return {
            "p50_ms": self.percentile(50) * 1e3,
            "p90_ms": self.percentile(90) * 1e3,
            "p99_ms": self.percentile(99) * 1e3,
            "mean_ms": float(np.mean(self.seconds)) * 1e3,
            "min_ms": float(np.min(self.seconds)) * 1e3,
            "throughput_per_s": self.throughput,
            "runs": len(self.seconds),
        }


def time_runs(fn: Callable[[], object], repeat: int, warmup: int = 1, name: str = "") -> Timings:
    """Call ``fn`` ``warmup`` times untimed, then ``repeat`` times timed."""
    return alternate({name: fn}, repeat, warmup)[name]


def alternate(
    runners: dict[str, Callable[[], object]],
    repeat: int,
    warmup: int = 1,
    settle_s: float | None = None,
    turn: int | None = None,
) -> dict[str, Timings]:
    """Time each runner ``repeat`` times, in alternating turns.

    Parameters
    ----------
    runners : dict
        Name -> a function doing one complete inference (outputs ready on return).
    repeat : int
        Timed runs of each.
    warmup : int
        Untimed runs of each first (allocations, caches, lazy compilation).
    settle_s : float
        Seconds of untimed runs (at least one) at the start of each turn (see the
        module docstring); default :data:`SETTLE_S`, none when only one runner is timed.
    turn : int
        Timed runs a turn; default :data:`TURN`.

    Returns
    -------
    dict
        Name -> :class:`Timings`, in the order given.
    """
    for fn in runners.values():
        for _ in range(warmup):
            fn()
    spent: dict[str, list[float]] = {name: [] for name in runners}
    alone = len(runners) == 1
    settle_s = SETTLE_S if settle_s is None else settle_s
    turn = max(1, TURN if turn is None else turn)
    repeat = max(repeat, 1)
    while len(spent[next(iter(runners))]) < repeat:
        for name, fn in runners.items():
            if not alone:
                until = time.perf_counter() + settle_s
                fn()
                while time.perf_counter() < until:
                    fn()
            for _ in range(min(turn, repeat - len(spent[name]))):
                start = time.perf_counter()
                fn()
                spent[name].append(time.perf_counter() - start)
    return {name: Timings(name, np.asarray(s)) for name, s in spent.items()}


def alternating_medians(
    fns: Sequence[Callable[[], object]], repeat: int, warmup: int = 1
) -> list[float]:
    """Median seconds of each function, timed in alternating turns (for scripts)."""
    timed = alternate({str(i): fn for i, fn in enumerate(fns)}, repeat, warmup)
    return [t.median for t in timed.values()]


def median_time(fn: Callable[[], object], repeat: int, warmup: int = 1) -> float:
    """Median seconds of ``repeat`` calls of ``fn`` after ``warmup`` untimed ones."""
    return time_runs(fn, repeat, warmup).median


@dataclass
class Throughput:
    """What N callers calling one runtime at once got, round by round."""

    name: str
    callers: int
    per_round: np.ndarray  # inferences per second of each round, all callers together
    latencies: np.ndarray  # seconds of every timed call, every caller

    def summary(self) -> dict[str, float]:
        """Median throughput over the rounds, and the calls' latency percentiles (ms)."""
        return {
            "throughput_per_s": float(np.median(self.per_round)),
            "throughput_min_per_s": float(np.min(self.per_round)),
            "callers": self.callers,
            "rounds": len(self.per_round),
            "p50_ms": float(np.percentile(self.latencies, 50)) * 1e3,
            "p90_ms": float(np.percentile(self.latencies, 90)) * 1e3,
            "p99_ms": float(np.percentile(self.latencies, 99)) * 1e3,
            "calls": len(self.latencies),
        }


def _round(callers: Sequence[Callable[[], object]], calls: int) -> tuple[float, list[float]]:
    """One round: every caller in a thread of its own makes one untimed call (the
    previous runtime's spinning pool threads settle meanwhile), all wait for each
    other, then each makes ``calls`` timed calls. Returns the round's throughput and
    every call's seconds."""
    ready = threading.Barrier(len(callers) + 1)
    latencies: list[list[float]] = [[] for _ in callers]
    errors: list[BaseException] = []

    def work(index: int, fn: Callable[[], object]) -> None:
        try:
            fn()
        except BaseException as err:  # reported after the round, in the caller's thread
            errors.append(err)
        ready.wait()
        if errors:
            return
        mine = latencies[index]
        for _ in range(calls):
            start = time.perf_counter()
            fn()
            mine.append(time.perf_counter() - start)

    threads = [threading.Thread(target=work, args=(i, fn)) for i, fn in enumerate(callers)]
    for thread in threads:
        thread.start()
    ready.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    if errors:
        raise errors[0]
    return len(callers) * calls / wall, [s for mine in latencies for s in mine]


def alternate_concurrent(
    runners: dict[str, Sequence[Callable[[], object]]], rounds: int, calls: int
) -> dict[str, Throughput]:
    """Throughput of each runtime under concurrent callers, in alternating rounds.

    Parameters
    ----------
    runners : dict
        Name -> one function per caller thread, each doing one complete inference
        (callers of one runtime may need their own request object: OpenVINO's).
    rounds : int
        Rounds of each runtime, taken in turns (A, B, C, A, B, C, ...) so that a
        change of the machine's load hits each alike.
    calls : int
        Timed calls of each caller in a round.
    """
    per_round: dict[str, list[float]] = {name: [] for name in runners}
    latencies: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(max(rounds, 1)):
        for name, callers in runners.items():
            rate, seconds = _round(callers, max(calls, 1))
            per_round[name].append(rate)
            latencies[name].extend(seconds)
    return {
        name: Throughput(
            name, len(runners[name]), np.asarray(per_round[name]), np.asarray(latencies[name])
        )
        for name in runners
    }
