"""Threads edgecv keeps for running CPU kernels called from other threads.

TVM's CPU kernels run their parallel loops on a thread pool that belongs to the
thread calling them, made on its first call, and that pool's workers outlive their
thread: measured with TVM 0.27 on 2 cores, every new Python thread that ran one
inference of a CPU package left 2 threads behind for good (20 short-lived threads, 40
threads more). A server that starts a thread per request (``ThreadingHTTPServer``,
a camera callback thread per connection) would grow without bound.

So an inference with CPU kernels called from any thread but the main one runs on one
of the threads kept here: a process-wide set that grows to the most inferences ever
in flight at once and is reused by every model loaded after (their pools with it);
a call takes an idle thread, hands it the inference and waits for the result. The
hand-off costs about 16 microseconds a call (2 cores, loaded); the main thread lives
as long as the process, so its calls run where they are, at no cost.

A caller whose wait is interrupted (Ctrl-C, a watchdog's signal handler raising) gets
the interrupt at once, and the inference runs on to its end on the kept thread, which
only then gives back the execution context it writes into, and itself: given back at
the interrupt, the context would go to a later call while this one still wrote there.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .cpu import pool_threads

T = TypeVar("T")


class _Job:
    """``fn(*args)`` handed to a kept thread, and which side gives back what it uses.

    ``state`` goes queued -> running -> done; a caller that stops waiting (an interrupt
    in its wait) makes a queued job "dropped" (it never starts) and a running one
    "abandoned": the kept thread then calls ``release`` itself when ``fn`` ends, since
    until then ``fn`` still writes into what the caller would give back.
    """

    def __init__(self, fn: Callable[..., Any], args: tuple, release: Callable[[], None]):
        self.fn, self.args, self.release = fn, args, release
        self.state = "queued"
        self.lock = threading.Lock()  # guards state: the caller and the kept thread race
        self.ended = threading.Lock()  # held until fn's outcome is in
        self.ended.acquire()
        self.outcome: tuple[bool, Any] = (False, None)

    def start(self) -> bool:
        """On the kept thread: whether to run ``fn`` (its caller may have gone)."""
        with self.lock:
            if self.state != "queued":
                return False
            self.state = "running"
            return True

    def finish(self, outcome: tuple[bool, Any]) -> bool:
        """On the kept thread: ``fn``'s outcome is in; True where its caller stopped
        waiting meanwhile (the kept thread then releases)."""
        with self.lock:
            abandoned = self.state == "abandoned"
            self.state, self.outcome = "done", outcome
        self.ended.release()
        return abandoned

    def drop(self) -> bool:
        """On the caller's thread, when it stops waiting: True where ``fn`` is running
        (the kept thread releases when it ends), False where it never starts or ended."""
        with self.lock:
            if self.state == "running":
                self.state = "abandoned"
                return True
            if self.state == "queued":
                self.state = "dropped"
            return False


class _Worker:
    """A kept thread and its mailbox: one job at a time."""

    def __init__(self, index: int, idle: queue.SimpleQueue):
        self.idle = idle  # the idle threads of its pool size, where it goes back
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=f"edgecv-cpu-{index}", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            job = self.jobs.get()
            if not job.start():
                continue
            try:
                outcome = (True, job.fn(*job.args))
            except BaseException as err:  # handed back to the caller, raised there
                outcome = (False, err)
            if job.finish(outcome):  # its caller is gone: give back what fn used, then
                with contextlib.suppress(Exception):  # no one is left to tell
                    job.release()
                self.idle.put(self)  # this thread, free only now


# idle kept threads by the size of their TVM pool: a thread serves only inferences
# asking for the pool size it was set to, so it is set once. Setting it again costs
# more than the call: TVM's pool workers then spin on a core for a while, taking it
# from the other streams (benchmarks/results/streams-2026-11-26-zen3.md).
_idle: dict[int, queue.SimpleQueue] = {}
_count_lock = threading.Lock()
_made = [0]


def kept_threads() -> int:
    """How many threads are kept so far (for each pool size, the most inferences of
    that size ever in flight at once)."""
    return _made[0]


def run_on_kept_thread(
    fn: Callable[..., T], *args: Any, pool: int, release: Callable[[], None] = lambda: None
) -> T:
    """``fn(*args)`` on an idle kept thread whose TVM pool has ``pool`` threads (one is
    made when none is idle), or right here when the caller is the main thread and
    ``pool`` is the size its pool has by default (``TVM_NUM_THREADS``): the main thread
    is never set to another size. Exceptions reach the caller as raised.

    ``release`` gives back what ``fn`` writes into (an execution context) and is
    called once ``fn`` has ended or will never start: here, before this returns or
    raises; or, where this wait is interrupted (Ctrl-C, an exception a signal handler
    raises) while ``fn`` still runs, by the kept thread when ``fn`` ends. The interrupt
    is raised here at once; what ``fn`` uses is not given back while it still writes.
    """
    if pool == pool_threads() and threading.current_thread() is threading.main_thread():
        try:
            return fn(*args)
        finally:
            release()
    idle = _idle.get(pool)
    if idle is None:
        with _count_lock:
            idle = _idle.setdefault(pool, queue.SimpleQueue())
    job = _Job(fn, args, release)
    worker, handed_on = None, False
    try:
        try:
            worker = idle.get_nowait()
        except queue.Empty:
            with _count_lock:
                _made[0] += 1
                index = _made[0]
            worker = _Worker(index, idle)
        worker.jobs.put(job)
        job.ended.acquire()
    except BaseException:  # the wait interrupted: fn may still be running
        handed_on = job.drop()
        raise
    finally:
        if not handed_on:
            release()
            if worker is not None:
                idle.put(worker)
    ok, value = job.outcome
    if not ok:
        raise value
    return value
