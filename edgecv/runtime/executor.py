"""The executor: replays a static :class:`~edgecv.build.plan.Plan` on a backend.

Everything is resolved once, at construction: storage slots are allocated, every
buffer becomes a tensor (a view into its slot), constants are uploaded and each step
is bound to its kernel and argument tensors. ``run`` then only copies the inputs in,
calls the bound kernels in order and copies the outputs out.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..build.plan import Plan
from ..errors import ShapeError
from .backend import Backend


class Executor:
    """Runs one plan on one backend.

    Parameters
    ----------
    plan : Plan
        The static plan (memory already planned).
    backend : Backend
        The device backend holding the compiled kernels.
    constants : dict
        Constant (parameter) arrays by buffer name.
    """

    def __init__(self, plan: Plan, backend: Backend, constants: dict[str, np.ndarray]):
        self.plan = plan
        self.backend = backend
        slots = [backend.alloc(size) for size in plan.storage_sizes]
        tensors: list = [None] * len(plan.buffers)
        self.allocated_bytes = sum(plan.storage_sizes)
        for buf in plan.buffers:
            if buf.kind == "temp":
                tensors[buf.id] = backend.view(slots[buf.storage], buf.shape, buf.dtype)
            elif buf.kind in ("input", "const"):
                storage = backend.alloc(max(buf.nbytes, 1))
                self.allocated_bytes += max(buf.nbytes, 1)
                tensors[buf.id] = backend.view(storage, buf.shape, buf.dtype)
                if buf.kind == "const":
                    backend.upload(tensors[buf.id], constants[buf.name])
        for buf in plan.buffers:  # views come after the buffer they view, in id order
            if buf.kind == "view":
                root = plan.buffers[plan.root(buf.id)]
                slot = slots[root.storage] if root.kind == "temp" else None
                base = slot if slot is not None else _storage_of(tensors, root.id)
                tensors[buf.id] = backend.view(base, buf.shape, buf.dtype)
        self._tensors = tensors
        self._launches = [
            backend.bind(step.kernel, [tensors[a] for a in step.args]) for step in plan.steps
        ]

    @property
    def num_launches(self) -> int:
        return len(self._launches)

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run one inference on arrays in the plan's input order; return the outputs."""
        if len(inputs) != len(self.plan.inputs):
            raise ShapeError(f"expected {len(self.plan.inputs)} input(s), got {len(inputs)}")
        for buffer_id, array in zip(self.plan.inputs, inputs, strict=True):
            buf = self.plan.buffers[buffer_id]
            array = np.asarray(array)
            if tuple(array.shape) != tuple(buf.shape):
                raise ShapeError(
                    f"input `{buf.name}` has shape {tuple(array.shape)}, the model was built "
                    f"for {tuple(buf.shape)}; redeploy with --input-shape "
                    f"{','.join(map(str, array.shape))} or resize the input"
                )
            self.backend.upload(self._tensors[buffer_id], array.astype(buf.dtype, copy=False))
        for launch in self._launches:
            launch()
        self.backend.synchronize()
        return [self.backend.download(self._tensors[o]) for o in self.plan.outputs]


def _storage_of(tensors: list, buffer_id: int):
    return tensors[buffer_id]
