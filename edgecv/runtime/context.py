"""An execution context: the memory and bound launches one inference in flight owns.

A static plan writes every activation into storage slots fixed at load time, so two
inferences replaying it on the same slots overwrite each other's tensors: two threads
sharing one set got wrong outputs, silently (mobilenet1.0, 37 of 40). A context
therefore owns everything an inference writes: the storage slots with the temp
buffers viewing them, the input buffers, the kernel launches bound to those, and,
through :meth:`~.backend.Backend.stream`, its own command queue on a device that
queues work (OpenCL kernels with their arguments set are bound per context too: such
a kernel object cannot serve two enqueues at once). The constants, the kernels and
the plan stay shared, read-only: :class:`~.executor.Executor` uploads the constants
once and hands each context their tensors. A context runs one inference at a time;
the executor lends idle ones to its callers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import ShapeError
from ..package_format import Plan
from .backend import Backend


class ExecutionContext:
    """The per-inference state of one plan: allocated and bound once, reused by every
    inference run in it.

    Parameters
    ----------
    plan : Plan
        The static plan (memory already planned).
    backends : dict
        The backend of each device name the plan uses, as this context streams to it
        (:meth:`~.backend.Backend.stream` of the executor's backends).
    shared : dict
        Tensors of the buffers every context reads and none writes (the constants and
        views of them), by buffer id.
    """

    def __init__(self, plan: Plan, backends: dict[str, Backend], shared: dict[int, Any]):
        self.plan = plan
        self.backends = backends
        self.backend = backends[plan.devices()[0]]
        self._distinct = list({id(b): b for b in backends.values()}.values())
        slot_devices = plan.storage_devices or ["cpu"] * len(plan.storage_sizes)
        # views of pieces need their slot kept alive
        self._slots = [
            backends[slot_devices[i]].alloc(size) for i, size in enumerate(plan.storage_sizes)
        ]
        self.allocated_bytes = sum(plan.storage_sizes)
        tensors: list = [None] * len(plan.buffers)
        for buffer_id, tensor in shared.items():
            tensors[buffer_id] = tensor
        for buf in plan.buffers:
            backend = backends[buf.device]
            if buf.kind == "temp":
                slot = self._slots[buf.storage]
                tensors[buf.id] = backend.view(slot, buf.shape, buf.dtype, buf.offset)
            elif buf.kind == "input":
                storage = backend.alloc(max(buf.nbytes, 1))
                self.allocated_bytes += max(buf.nbytes, 1)
                tensors[buf.id] = backend.view(storage, buf.shape, buf.dtype)
        for buf in plan.buffers:  # views come after the buffer they view, in id order
            if buf.kind == "view" and tensors[buf.id] is None:
                root = plan.buffers[plan.root(buf.id)]
                backend = backends[buf.device]
                if root.kind == "temp":
                    slot = self._slots[root.storage]
                    tensors[buf.id] = backend.view(slot, buf.shape, buf.dtype, root.offset)
                else:
                    tensors[buf.id] = backend.view(tensors[root.id], buf.shape, buf.dtype)
        self.tensors = tensors
        self._inputs = [
            (plan.buffers[i], backends[plan.buffers[i].device], tensors[i]) for i in plan.inputs
        ]
        self._outputs = [(backends[plan.buffers[o].device], tensors[o]) for o in plan.outputs]
        self.steps = [step for step in plan.steps if not step.elided]
        # one per step that runs (an elided one's inputs were written in place)
        self.launches = [
            self._bind_copy(step) if step.kind == "copy"
            else backends[step.device].bind(step.kernel, [tensors[a] for a in step.args])
            for step in self.steps
        ]  # fmt: skip

    def _bind_copy(self, step) -> Callable[[], None]:
        source, destination = (self.plan.buffers[a] for a in step.args)
        src_backend = self.backends[source.device]
        dst_backend = self.backends[destination.device]
        src, dst = self.tensors[source.id], self.tensors[destination.id]

        def run() -> None:  # downloads wait for the source device's queued work
            dst_backend.upload(dst, src_backend.download(src))

        return run

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run one inference on arrays in the plan's input order; return the outputs
        (fresh arrays: nothing returned aliases this context's memory)."""
        if len(inputs) != len(self._inputs):
            raise ShapeError(f"expected {len(self._inputs)} input(s), got {len(inputs)}")
        for backend in self._distinct:
            backend.make_current()
        for index, (buf, backend, tensor) in enumerate(self._inputs):
            array = np.asarray(inputs[index])
            if tuple(array.shape) != tuple(buf.shape):
                raise ShapeError(
                    f"input `{buf.name}` has shape {tuple(array.shape)}, the model was built "
                    f"for {tuple(buf.shape)}; redeploy with --input-shape "
                    f"{','.join(map(str, array.shape))} or resize the input"
                )
            backend.upload(tensor, array.astype(buf.dtype, copy=False))
        for launch in self.launches:
            launch()
        for backend in self._distinct:
            backend.synchronize()
        return [backend.download(tensor) for backend, tensor in self._outputs]
