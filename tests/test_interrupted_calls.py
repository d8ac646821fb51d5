"""A call interrupted while it waits (issue 49, item 6).

An inference of a CPU package called from the main thread with ``streams`` > 1 runs on
a thread edgecv keeps (runtime/workers.py) while the caller waits for it. Ctrl-C, or a
watchdog whose signal handler raises, ends that wait at once, and the kept thread goes
on writing into the call's execution context. The context then went back to the idle
ones, where a later call could borrow it and have its outputs mixed with the abandoned
inference's. It now stays out of the pool until the kept thread has finished with it.

The abandoned inference is held mid-run (one of its launches waits on an event) so that
the interrupt always lands while it runs; the kernels and the interrupt are real.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
from test_run_faults import quick_package, x_of

import edgecv
from edgecv.board.runtime.cpu import pool_threads
from edgecv.board.runtime.executor import Executor


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return quick_package("cpu", tmp_path_factory)


class Watchdog(Exception):
    """What the signal handler raises in the waiting thread."""


@contextlib.contextmanager
def interrupt_after(seconds: float, raised: type[BaseException]) -> Iterator[None]:
    """Raise ``raised`` in the main thread after ``seconds`` (SIGALRM's handler)."""

    def bark(signum, frame):
        raise raised

    before = signal.signal(signal.SIGALRM, bark)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def idle_contexts(executor: Executor) -> list:
    """The contexts idle now (taken out and put back in their order)."""
    taken = []
    with contextlib.suppress(Exception):
        while True:
            taken.append(executor._idle.get_nowait())
    for context in taken:
        executor._idle.put(context)
    return taken


def hold_next_inference(executor: Executor, release: threading.Event) -> list:
    """Make the next inference (in whichever context) wait at its second launch until
    ``release`` is set; returns a list that receives the context it runs in."""
    held: list = []

    def holding(context, launch):
        def run() -> None:
            if not held:
                held.append(context)
                release.wait(60)
            launch()

        return run

    for context in executor.contexts:
        context.launches[1] = holding(context, context.launches[1])
    return held


def wait_until(condition, seconds: float = 30) -> bool:
    end = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


# Ctrl-C, and a watchdog raising an exception of its own
INTERRUPTS = pytest.mark.parametrize("raised", [KeyboardInterrupt, Watchdog])


@INTERRUPTS
def test_an_interrupted_call_keeps_its_context_until_its_kept_thread_ends(package, raised):
    model = edgecv.load(package, streams=2)
    executor = model.executor
    if executor.contexts[0].calling_thread_pool == pool_threads():
        pytest.skip("one core: a call from the main thread runs where it is, on no kept thread")
    inputs = [x_of(seed) for seed in range(6)]
    serial = [model.run(x)[0] for x in inputs]
    contexts = list(executor.contexts)
    release = threading.Event()
    held = hold_next_inference(executor, release)
    try:
        with pytest.raises(raised), interrupt_after(0.3, raised):
            model.run(inputs[0])
        assert held, "the interrupted inference never started"
        idle = idle_contexts(executor)
        assert held[0] not in idle, "a context still being written went back to the pool"
        assert len(idle) == 1
        # meanwhile a call runs in the other context, right
        assert np.array_equal(model.run(inputs[1])[0], serial[1])
    finally:
        release.set()
    assert wait_until(lambda: len(idle_contexts(executor)) == 2), "the context never came back"
    assert executor.contexts == contexts, "an interrupt is no failure: no context is replaced"
    for x, want in zip(inputs, serial, strict=True):
        assert np.array_equal(model.run(x)[0], want)
    results: list = [None] * len(inputs)

    def call(i: int) -> None:
        results[i] = model.run(inputs[i])[0]

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for got, want in zip(results, serial, strict=True):
        assert got is not None and np.array_equal(got, want)


def test_an_interrupt_that_stops_the_inference_itself_gives_its_context_back(package):
    """With one stream the main thread runs the inference itself: Ctrl-C stops it
    there, so its context goes back at once and the next call is right."""
    model = edgecv.load(package, streams=1)
    x = x_of(7)
    want = model.run(x)[0]
    release = threading.Event()
    held = hold_next_inference(model.executor, release)
    with pytest.raises(KeyboardInterrupt), interrupt_after(0.3, KeyboardInterrupt):
        model.run(x)
    assert held and idle_contexts(model.executor) == held
    assert np.array_equal(model.run(x)[0], want)
