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
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .cpu import pool_threads

T = TypeVar("T")


class _Worker:
    """A kept thread and its mailbox: one job at a time."""

    def __init__(self, index: int):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=f"edgecv-cpu-{index}", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            fn, args, box, done = self.jobs.get()
            try:
                box.append((True, fn(*args)))
            except BaseException as err:  # handed back to the caller, raised there
                box.append((False, err))
            done.release()

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        done = threading.Lock()
        done.acquire()
        box: list = []
        self.jobs.put((fn, args, box, done))
        done.acquire()
        ok, value = box[0]
        if not ok:
            raise value
        return value


# idle kept threads by the size of their TVM pool: a thread serves only inferences
# asking for the pool size it was set to, so it is set once. Setting it again costs
# more than the call: TVM's pool workers then spin on a core for about 0.3 s
# (measured on 2 cores: two 1-thread streams served by threads that also ran
# 2-thread calls made 68 inferences/s of mobilenet1.0 where 100 were possible).
_idle: dict[int, queue.SimpleQueue] = {}
_count_lock = threading.Lock()
_made = [0]


def kept_threads() -> int:
    """How many threads are kept so far (for each pool size, the most inferences of
    that size ever in flight at once)."""
    return _made[0]


def run_on_kept_thread(fn: Callable[..., T], *args: Any, pool: int) -> T:
    """``fn(*args)`` on an idle kept thread whose TVM pool has ``pool`` threads (one is
    made when none is idle), or right here when the caller is the main thread and
    ``pool`` is the size its pool has by default (``TVM_NUM_THREADS``): the main thread
    is never set to another size. Exceptions reach the caller as raised."""
    if pool == pool_threads() and threading.current_thread() is threading.main_thread():
        return fn(*args)
    idle = _idle.get(pool)
    if idle is None:
        with _count_lock:
            idle = _idle.setdefault(pool, queue.SimpleQueue())
    try:
        worker = idle.get_nowait()
    except queue.Empty:
        with _count_lock:
            _made[0] += 1
            index = _made[0]
        worker = _Worker(index)
    try:
        return worker.call(fn, *args)
    finally:
        idle.put(worker)
