"""The executor: replays a static :class:`~edgecv.package_format.Plan` on a backend,
from any number of threads.

Everything is resolved once, at construction, so that ``run`` allocates nothing: it
copies the inputs in, calls kernels already bound to their argument tensors and
copies the outputs out. Those tensors are the plan's fixed memory, which an inference
overwrites as it goes, so the executor is split in two:

- shared and read-only: the plan, the backends with their loaded kernels, and the
  constants, uploaded once per device;
- per inference in flight: an :class:`~.context.ExecutionContext` (activation memory,
  input buffers, bound launches, on OpenCL its own command queue).

``streams`` contexts are made at construction; :meth:`Executor.run` takes an idle one
and gives it back after, and a call that finds none idle waits for one. So calls from
several threads are always right: with ``streams=1`` (the default) they run one at a
time and memory stays that of one inference; with ``streams=N`` up to N run at once,
for N times the activation memory. Waiting was chosen over making a context per
call: that would allocate and bind on every call, and a board's memory would grow
with its callers.
"""

from __future__ import annotations

import contextlib
import operator
import queue
from collections.abc import Iterator, Sequence

import numpy as np

from ..errors import EdgecvError
from ..package_format import Plan
from .backend import Backend
from .context import ExecutionContext


def check_streams(streams: int) -> int:
    """``streams`` as an int, refused with what it means when it is not a count >= 1."""
    try:
        count = operator.index(streams)
    except TypeError:
        count = None
    if count is None or isinstance(streams, bool) or count < 1:
        raise EdgecvError(
            f"streams={streams!r}: expected a whole number of at least 1 (how many calls "
            "of `run` may be in flight at once, each with its own activation memory; "
            "calls beyond that wait); give streams=1 to run calls one at a time"
        )
    return count


class Executor:
    """Runs one plan on its backends, safely from several threads.

    Parameters
    ----------
    plan : Plan
        The static plan (memory already planned).
    backends : Backend or dict
        The backend running every step, or one per device name the plan uses
        (``{"gpu": OpenCLBackend, "cpu": CPUBackend}`` for a plan with CPU fallback).
    constants : dict
        Constant (parameter) arrays by buffer name.
    streams : int
        Execution contexts: how many :meth:`run` calls may be in flight at once (more
        wait for one to finish). Each holds its own activation memory.
    """

    def __init__(
        self,
        plan: Plan,
        backends: Backend | dict[str, Backend],
        constants: dict[str, np.ndarray],
        streams: int = 1,
    ):
        streams = check_streams(streams)
        self.plan = plan
        if isinstance(backends, Backend):
            backends = {device: backends for device in {"cpu", "gpu", *plan.devices()}}
        missing = {b.device for b in plan.buffers} - set(backends)
        if missing:
            raise EdgecvError(f"internal: no backend given for device(s) {sorted(missing)}")
        self.backends = backends
        self.backend = backends[plan.devices()[0]]
        shared = self._upload_constants(constants)
        self.contexts = [self._new_context(shared) for _ in range(streams)]
        self.allocated_bytes = self._constant_bytes + sum(c.allocated_bytes for c in self.contexts)
        # idle contexts; a get waits while there is none. SimpleQueue is C: a get and a
        # put take 0.1 us, where a pool guarded by a threading.Condition took 1.3 us,
        # 2% of a small model's 60 us run
        self._idle: queue.SimpleQueue = queue.SimpleQueue()
        for context in self.contexts:
            self._idle.put(context)

    def _upload_constants(self, constants: dict[str, np.ndarray]) -> dict:
        """Tensors of the constants and of views of them, every context's to read."""
        plan, shared = self.plan, {}
        self._constant_bytes = 0
        for buf in plan.buffers:
            if buf.kind == "const":
                backend = self.backends[buf.device]
                storage = backend.alloc(max(buf.nbytes, 1))
                self._constant_bytes += max(buf.nbytes, 1)
                shared[buf.id] = backend.view(storage, buf.shape, buf.dtype)
                backend.upload(shared[buf.id], constants[buf.name])
        for buf in plan.buffers:  # views come after the buffer they view, in id order
            root = plan.root(buf.id)
            if buf.kind == "view" and root in shared:
                shared[buf.id] = self.backends[buf.device].view(shared[root], buf.shape, buf.dtype)
        for backend in {id(b): b for b in self.backends.values()}.values():
            backend.synchronize()  # contexts' queues must find the constants in place
        return shared

    def _new_context(self, shared: dict) -> ExecutionContext:
        streams: dict[int, Backend] = {}  # one per backend, however many devices it runs
        for backend in self.backends.values():
            if id(backend) not in streams:
                streams[id(backend)] = backend.stream()
        own = {device: streams[id(b)] for device, b in self.backends.items()}
        return ExecutionContext(self.plan, own, shared)

    @property
    def num_launches(self) -> int:
        return len(self.contexts[0].launches)

    @property
    def steps(self) -> list:
        """The plan's steps that run, in order (those of each context's ``launches``)."""
        return list(self.contexts[0].steps)

    @contextlib.contextmanager
    def context(self) -> Iterator[ExecutionContext]:
        """An idle execution context, the caller's alone until the block ends (waits
        for one when every context is busy): ``edgecv bench`` times its launches one
        by one in it. Run in it with its own ``run``: :meth:`run` inside the block
        waits for another context (forever with ``streams=1``)."""
        context = self._idle.get()
        try:
            yield context
        finally:
            self._idle.put(context)

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run one inference on arrays in the plan's input order; return the outputs.

        Safe from any number of threads: the call runs in an idle execution context,
        waiting for one when all are busy.
        """
        context = self._idle.get()
        try:
            return context.run(inputs)
        finally:
            self._idle.put(context)
