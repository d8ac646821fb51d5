"""The executor: replays a static :class:`~edgecv.board.plan.Plan` on a backend,
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

A call's inputs are checked (and converted where that keeps their meaning: see
:func:`~.context.prepare_inputs`) before it borrows a context, so a refused call never
waits for one nor touches one. A context always goes back to the idle ones, however
its call ended: a context lost to a failed call would leave every later caller of a
one-stream model waiting forever. It goes back once nothing writes into it any more:
a call whose wait for a kept thread (runtime/workers.py) is interrupted (Ctrl-C, a
watchdog's signal handler raising) raises at once, and the kept thread gives the
context back when the inference it still runs ends; an interrupt is no failure of the
context, which is kept. A call that fails on the device (a kernel raising,
a command queue gone bad) replaces its context with a new one, made from the shared
backends as at load time, so the next call starts from a fresh queue and memory and
the other contexts never see the failure. Where no new context can be made (the
device itself is gone), the broken one goes back marked with why, and every call
that borrows it is refused with that reason: the model is closed, never hung.
"""

from __future__ import annotations

import contextlib
import operator
import queue
import threading
from collections.abc import Iterator, Sequence

import numpy as np

from ..errors import EdgecvError, PackageError
from ..plan import Plan
from .backend import Backend
from .context import ExecutionContext, input_specs, one_line, prepare_inputs
from .workers import run_on_kept_thread


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
        self.stream_count = streams  # how many contexts share the cores (a replacement too)
        self.plan = plan
        if isinstance(backends, Backend):
            backends = {device: backends for device in {"cpu", "gpu", *plan.devices()}}
        missing = {b.device for b in plan.buffers} - set(backends)
        if missing:
            raise EdgecvError(f"internal: no backend given for device(s) {sorted(missing)}")
        self.backends = backends
        self.backend = backends[plan.devices()[0]]
        self.specs = input_specs(plan)
        self._shared = self._upload_constants(constants)
        self._replacing = threading.Lock()  # one context replaced at a time
        self.contexts = [self._new_context() for _ in range(streams)]
        # the pool of the calling thread's that every context's kernels use (fixed with
        # the streams: a context made in place of one has the same)
        self._pool = self.contexts[0].calling_thread_pool
        self.allocated_bytes = self._constant_bytes + sum(c.allocated_bytes for c in self.contexts)
        # idle contexts; a get waits while there is none. SimpleQueue is C: a get and a
        # put cost a tenth of a pool guarded by a threading.Condition, whose cost showed
        # on small models (benchmarks/results/execution_contexts-2026-11-25.md)
        self._idle: queue.SimpleQueue = queue.SimpleQueue()
        for context in self.contexts:
            self._idle.put(context)

    def _upload_constants(self, constants: dict[str, np.ndarray]) -> dict:
        """Tensors of the constants and of views of them, every context's to read."""
        plan, shared = self.plan, {}
        self._constant_bytes = 0
        for buf in plan.buffers:
            if buf.kind == "const":
                value = _constant(buf, constants)
                backend = self.backends[buf.device]
                storage = backend.alloc(max(buf.nbytes, 1))
                self._constant_bytes += max(buf.nbytes, 1)
                shared[buf.id] = backend.view(storage, buf.shape, buf.dtype)
                backend.upload(shared[buf.id], value)
        for buf in plan.buffers:  # views come after the buffer they view, in id order
            root = plan.root(buf.id)
            if buf.kind == "view" and root in shared:
                shared[buf.id] = self.backends[buf.device].view(shared[root], buf.shape, buf.dtype)
        for backend in {id(b): b for b in self.backends.values()}.values():
            backend.synchronize()  # contexts' queues must find the constants in place
        return shared

    def _new_context(self) -> ExecutionContext:
        streams: dict[int, Backend] = {}  # one per backend, however many devices it runs
        distinct = list({id(b): b for b in self.backends.values()}.values())
        before = [_device_bytes(b) for b in distinct]
        try:
            for backend in distinct:
                streams[id(backend)] = backend.stream(self.stream_count)
            own = {device: streams[id(b)] for device, b in self.backends.items()}
            context = ExecutionContext(self.plan, own, self._shared)
        except BaseException:  # what it allocated before failing is dropped with it
            for backend, count in zip(distinct, before):
                if count >= 0:
                    backend.allocated_bytes = count
            raise
        # what it holds of each backend's device-memory count, given back when replaced
        context.device_bytes = [
            (b, _device_bytes(b) - n) for b, n in zip(distinct, before) if n >= 0
        ]
        return context

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
        waiting for one when all are busy. Inputs are checked before that
        (:func:`~.context.prepare_inputs`); a failure on the device is one
        :class:`~edgecv.board.errors.EdgecvError` for this call, after which its context is
        replaced by a new one (see the module's notes).
        """
        arrays = prepare_inputs(self.specs, inputs)
        held: list[ExecutionContext] = []  # the call's context, or the one replacing it

        def give_back() -> None:
            self._idle.put(held[0])

        if self._pool is None:
            held.append(self._idle.get())
            try:
                return self._run_in(held, arrays)
            finally:
                give_back()
        # a pool of the calling thread's that outlives it (TVM's CPU kernels): run on a
        # thread edgecv keeps for that pool size, which gives the context back where
        # this call's wait is interrupted (runtime/workers.py)
        held.append(self._idle.get())
        return run_on_kept_thread(self._run_in, held, arrays, pool=self._pool, release=give_back)

    def _run_in(self, held: list[ExecutionContext], arrays: list[np.ndarray]) -> list[np.ndarray]:
        """One inference in the context ``held[0]``, put in its place there: a new one
        where it was broken, or where it fails on the device (see the module's notes)."""
        context = held[0]
        if context.broken is not None:
            context = held[0] = self._replace(context)
        try:
            return context.run_prepared(arrays)
        except Exception as err:
            held[0] = self._after_failure(context, err)
            raise

    def _after_failure(self, context: ExecutionContext, err: Exception) -> ExecutionContext:
        """The context to give back after ``context`` failed with ``err``: a new one in
        its place, or ``context`` itself marked broken when none can be made. Never
        raises: the caller is raising ``err``."""
        for backend in context._distinct:  # let queued work end before its memory goes
            with contextlib.suppress(Exception):
                backend.synchronize()
        context.broken = f"{type(err).__name__}: {one_line(err, limit=200)}"
        try:
            return self._replace(context)
        except EdgecvError:
            return context

    def _replace(self, context: ExecutionContext) -> ExecutionContext:
        """A new context in place of the broken ``context``, or an EdgecvError saying
        the model cannot run any more (``context`` keeps its place and its reason)."""
        with self._replacing:
            try:
                fresh = self._new_context()
            except Exception as err:
                raise EdgecvError(
                    f"this model can no longer run: an inference failed ({context.broken}) "
                    f"and no new execution context could be made ({type(err).__name__}: "
                    f"{one_line(err, limit=200)}); load the model again"
                ) from None
            self.contexts[self.contexts.index(context)] = fresh
            for backend, nbytes in context.device_bytes:
                backend.allocated_bytes -= nbytes  # the old context's memory is dropped
        return fresh


def _device_bytes(backend: Backend) -> int:
    """The device-memory count a backend keeps (OpenCL, CUDA), -1 where it keeps none."""
    count = getattr(backend, "allocated_bytes", None)
    return count if isinstance(count, int) else -1


def _constant(buf, constants: dict[str, np.ndarray]) -> np.ndarray:
    """The value of constant buffer ``buf``: exactly its shape, in its dtype (a
    package's params.npz that disagrees with its plan is refused, not broadcast)."""
    value = constants.get(buf.name)
    if value is None:
        raise PackageError(
            f"the plan's constant `{buf.name}` is not in the package's params; redeploy the model"
        )
    if tuple(value.shape) != tuple(buf.shape) or value.dtype != np.dtype(buf.dtype):
        raise PackageError(
            f"the package's constant `{buf.name}` is {value.dtype} {tuple(value.shape)}, its "
            f"plan says {buf.dtype} {tuple(buf.shape)}; redeploy the model"
        )
    return value
