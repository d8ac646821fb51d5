"""The one timing harness: timed runs, alternating runs, percentiles.

Runtimes compared on a shared machine are timed in ALTERNATING runs (A, B, C, A, B,
C, ...) in one process, so a change of the machine's load hits each alike; MXNet's and
ONNX Runtime's busy-waiting thread pools make sequential blocks misleading.

Each turn of a runtime starts with one SETTLE run, untimed: the threads of the runtime
timed before it keep spinning for a while after it returns and take the cores from the
next one. Seen on 2 cores (mobilenet1.0, medians of 20): the edgecv package timed right
after OpenVINO took 49-68 ms, the same package timed second 21 ms; with a settle run
both measure 23 ms.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


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
    runners: dict[str, Callable[[], object]], repeat: int, warmup: int = 1, settle: int = 1
) -> dict[str, Timings]:
    """Time each runner ``repeat`` times, interleaved run by run.

    Parameters
    ----------
    runners : dict
        Name -> a function doing one complete inference (outputs ready on return).
    repeat : int
        Timed runs of each.
    warmup : int
        Untimed runs of each first (allocations, caches, lazy compilation).
    settle : int
        Untimed runs at the start of each turn (see the module docstring); 0 when only
        one runner is timed.

    Returns
    -------
    dict
        Name -> :class:`Timings`, in the order given.
    """
    for fn in runners.values():
        for _ in range(warmup):
            fn()
    spent: dict[str, list[float]] = {name: [] for name in runners}
    settle = settle if len(runners) > 1 else 0
    for _ in range(max(repeat, 1)):
        for name, fn in runners.items():
            for _ in range(settle):
                fn()
            start = time.perf_counter()
            fn()
            spent[name].append(time.perf_counter() - start)
    return {name: Timings(name, np.asarray(s)) for name, s in spent.items()}


def alternating_medians(
    fns: Sequence[Callable[[], object]], repeat: int, warmup: int = 1
) -> list[float]:
    """Median seconds of each function, timed in alternating runs (for scripts)."""
    timed = alternate({str(i): fn for i, fn in enumerate(fns)}, repeat, warmup)
    return [t.median for t in timed.values()]


def median_time(fn: Callable[[], object], repeat: int, warmup: int = 1) -> float:
    """Median seconds of ``repeat`` calls of ``fn`` after ``warmup`` untimed ones."""
    return time_runs(fn, repeat, warmup).median
