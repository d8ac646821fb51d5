"""The executor: replays a static :class:`~edgecv.package_format.Plan` on a backend.

Everything is resolved once, at construction: storage slots are allocated, every
buffer becomes a tensor (a view into its slot), constants are uploaded and each step
is bound to its kernel and argument tensors. ``run`` then only copies the inputs in,
calls the bound kernels in order and copies the outputs out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..errors import EdgecvError, ShapeError
from ..package_format import Plan
from .backend import Backend


class Executor:
    """Runs one plan on its backends.

    Parameters
    ----------
    plan : Plan
        The static plan (memory already planned).
    backends : Backend or dict
        The backend running every step, or one per device name the plan uses
        (``{"gpu": OpenCLBackend, "cpu": CPUBackend}`` for a plan with CPU fallback).
    constants : dict
        Constant (parameter) arrays by buffer name.
    """

    def __init__(
        self, plan: Plan, backends: Backend | dict[str, Backend], constants: dict[str, np.ndarray]
    ):
        self.plan = plan
        if isinstance(backends, Backend):
            backends = {device: backends for device in {"cpu", "gpu", *plan.devices()}}
        missing = {b.device for b in plan.buffers} - set(backends)
        if missing:
            raise EdgecvError(f"internal: no backend given for device(s) {sorted(missing)}")
        self.backends = backends
        self.backend = backends[plan.devices()[0]]
        slot_devices = plan.storage_devices or ["cpu"] * len(plan.storage_sizes)
        slots = [
            backends[device].alloc(size) for size, device in zip(plan.storage_sizes, slot_devices)
        ]
        self._slots = slots  # views of pieces need their slot kept alive
        tensors: list = [None] * len(plan.buffers)
        self.allocated_bytes = sum(plan.storage_sizes)
        for buf in plan.buffers:
            backend = backends[buf.device]
            if buf.kind == "temp":
                slot = slots[buf.storage]
                tensors[buf.id] = backend.view(slot, buf.shape, buf.dtype, buf.offset)
            elif buf.kind in ("input", "const"):
                storage = backend.alloc(max(buf.nbytes, 1))
                self.allocated_bytes += max(buf.nbytes, 1)
                tensors[buf.id] = backend.view(storage, buf.shape, buf.dtype)
                if buf.kind == "const":
                    backend.upload(tensors[buf.id], constants[buf.name])
        for buf in plan.buffers:  # views come after the buffer they view, in id order
            if buf.kind == "view":
                root = plan.buffers[plan.root(buf.id)]
                backend = backends[buf.device]
                if root.kind == "temp":
                    view = backend.view(slots[root.storage], buf.shape, buf.dtype, root.offset)
                else:
                    view = backend.view(tensors[root.id], buf.shape, buf.dtype)
                tensors[buf.id] = view
        self._tensors = tensors
        # one per step that runs (an elided one's inputs were written in place)
        self._launches = [
            self._bind_copy(step) if step.kind == "copy"
            else backends[step.device].bind(step.kernel, [tensors[a] for a in step.args])
            for step in self.steps
        ]  # fmt: skip

    def _bind_copy(self, step) -> Callable[[], None]:
        source, destination = (self.plan.buffers[a] for a in step.args)
        src_backend = self.backends[source.device]
        dst_backend = self.backends[destination.device]
        src, dst = self._tensors[source.id], self._tensors[destination.id]

        def run() -> None:  # downloads wait for the source device's queued work
            dst_backend.upload(dst, src_backend.download(src))

        return run

    @property
    def num_launches(self) -> int:
        return len(self._launches)

    @property
    def steps(self) -> list:
        """The plan's steps that run, in order (those of :attr:`_launches`)."""
        return [step for step in self.plan.steps if not step.elided]

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run one inference on arrays in the plan's input order; return the outputs."""
        if len(inputs) != len(self.plan.inputs):
            raise ShapeError(f"expected {len(self.plan.inputs)} input(s), got {len(inputs)}")
        for buffer_id, array in zip(self.plan.inputs, inputs):
            buf = self.plan.buffers[buffer_id]
            array = np.asarray(array)
            if tuple(array.shape) != tuple(buf.shape):
                raise ShapeError(
                    f"input `{buf.name}` has shape {tuple(array.shape)}, the model was built "
                    f"for {tuple(buf.shape)}; redeploy with --input-shape "
                    f"{','.join(map(str, array.shape))} or resize the input"
                )
            backend = self.backends[buf.device]
            backend.upload(self._tensors[buffer_id], array.astype(buf.dtype, copy=False))
        for launch in self._launches:
            launch()
        for backend in set(self.backends.values()):
            backend.synchronize()
        return [
            self.backends[self.plan.buffers[o].device].download(self._tensors[o])
            for o in self.plan.outputs
        ]
