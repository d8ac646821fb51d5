"""Pass 2: put every buffer on a device and insert a copy on each edge that crosses.

After :func:`~.placement.place` tags the launches, each buffer lives where it is made:
a kernel output on its launch's device, a view with the buffer it views, a model input
on the device of its first reader. A launch that reads a buffer living on the other
device reads a copy instead; the copy is made once per tensor and destination device
(right before its first reader there) and shared by every later reader on that device.
Parameters are not copied at run time: a parameter read on both devices is uploaded to
both when the package loads. The result is a new plan, memory planned per device.

In a float16 package (``widen_on_cpu``) the CPU part stays float32: every float16 tensor
living on the CPU becomes float32, a copy between the devices converts (the runtime's
uploads cast to the destination's dtype), a float16 parameter read on the CPU is stored
again as float32 under its own name (:func:`widened_constants`), and the CPU launches
run the float32 versions of their kernels (:func:`edgecv.lowering.precision.widen_kernels`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..board.plan import Buffer, Plan, Step
from ..lowering.memory_plan import add_workspaces, plan_memory
from .placement import Placement


@dataclass(frozen=True)
class Copy:
    """One device copy in the plan (for ``--explain`` and the manifest)."""

    step: int
    source: int  # buffer ids
    destination: int
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    from_device: str
    to_device: str
    to_dtype: str = ""  # the destination's dtype where the copy converts, else ""

    def describe(self) -> str:
        shape = "x".join(map(str, self.shape))
        dtype = f"{self.dtype}->{self.to_dtype}" if self.to_dtype else self.dtype
        return f"{self.from_device}->{self.to_device} {shape} {dtype} ({self.nbytes:,} bytes)"


# the name a float16 parameter's float32 copy for the CPU is stored under
_WIDE_SUFFIX = "_fp32"


def insert_copies(
    plan: Plan,
    placement: Placement,
    alignments: dict[str, int] | None = None,
    widen_on_cpu: bool = False,
    workspaces: dict[str, list[int]] | None = None,
) -> tuple[Plan, list[Copy]]:
    """A new plan with devices on every step and buffer, and the copies it needed;
    memory planned with the devices' ``alignments`` (see
    :func:`~edgecv.lowering.memory_plan.plan_memory`). ``widen_on_cpu``: float16
    tensors on the CPU become float32 (see the module). ``workspaces``: the bytes of
    each GPU kernel's device workspaces, by kernel name
    (:attr:`~edgecv.board.plan.Launch.workspaces`): the plan holds them as temp buffers of the
    GPU launches (:func:`~edgecv.lowering.memory_plan.add_workspaces`), memory planned
    with the rest."""
    buffers = [replace(b, storage=None) for b in plan.buffers]
    dtypes = [b.dtype for b in plan.buffers]  # as the GPU kernels take them
    steps = [replace(s, device=d) for s, d in zip(plan.steps, placement.devices, strict=True)]
    _place_buffers(buffers, steps, placement)

    def dtype_on(buffer_id: int, device: str) -> str:
        wide = widen_on_cpu and device == "cpu" and dtypes[buffer_id] == "float16"
        return "float32" if wide else dtypes[buffer_id]

    for buf in buffers:
        if dtype_on(buf.id, buf.device) != buf.dtype:
            buf.dtype = "float32"
            if buf.kind == "const":
                buf.name += _WIDE_SUFFIX
    if widen_on_cpu:  # a concatenation's pieces are byte offsets: twice as far in float32
        steps = [
            replace(s, pieces=[2 * p for p in s.pieces])
            if s.device == "cpu" and s.pieces and dtypes[s.args[-1]] == "float16"
            else s
            for s in steps
        ]

    new_steps: list[Step] = []
    copies: list[Copy] = []
    made: dict[tuple[int, str], int] = {}  # (buffer, destination device) -> its copy

    def add_buffer(like: Buffer, kind: str, device: str) -> int:
        dtype, name = dtype_on(like.id, device), like.name
        if kind == "const":  # the GPU reads a parameter as stored, the CPU its float32 copy
            name = name.removesuffix(_WIDE_SUFFIX)
            name += _WIDE_SUFFIX if dtype != dtypes[like.id] else ""
        new = replace(
            like, id=len(buffers), kind=kind, view_of=None, device=device, dtype=dtype, name=name
        )
        buffers.append(new)
        dtypes.append(dtypes[like.id])
        return new.id

    for step in steps:
        args = list(step.args)
        for position in range(len(args) - step.num_outputs):
            arg = args[position]
            if buffers[arg].device == step.device:
                continue
            key = (arg, step.device)
            if key not in made:
                source = buffers[arg]
                if _root(buffers, arg).kind == "const" and source.kind == "const":
                    made[key] = add_buffer(source, "const", step.device)  # uploaded twice
                else:
                    made[key] = add_buffer(source, "temp", step.device)
                    to_dtype = buffers[made[key]].dtype
                    copies.append(
                        Copy(
                            len(new_steps),
                            arg,
                            made[key],
                            source.shape,
                            source.dtype,
                            source.nbytes,
                            source.device,
                            step.device,
                            to_dtype if to_dtype != source.dtype else "",
                        )
                    )
                    new_steps.append(Step("copy", [arg, made[key]], 1, step.device, "copy"))
            args[position] = made[key]
        new_steps.append(replace(step, args=args))
    result = Plan(buffers, new_steps, list(plan.inputs), list(plan.outputs))
    if workspaces:
        add_workspaces(result, workspaces, alignments)
    plan_memory(result, alignments)
    return result, copies


def _root(buffers: list[Buffer], buffer_id: int) -> Buffer:
    """The buffer a view (of a view...) is of; any other buffer itself."""
    buf = buffers[buffer_id]
    while buf.kind == "view":
        buf = buffers[buf.view_of]
    return buf


def _place_buffers(buffers: list[Buffer], steps: list[Step], placement: Placement) -> None:
    """Each buffer's device: a step's outputs where it runs, an input or constant where
    it is first read, a view where its root is."""
    first_reader: dict[int, str] = {}
    for step in steps:
        for arg in step.args[: len(step.args) - step.num_outputs]:
            first_reader.setdefault(_root(buffers, arg).id, step.device)
        for out in step.args[len(step.args) - step.num_outputs :]:
            buffers[out].device = step.device
    # an input or constant no step reads (an output that is a constant) stays where the
    # plan runs: on the CPU of a GPU package it would need CPU kernels to hold it
    unread = "gpu" if "gpu" in placement.devices else "cpu"
    for buf in buffers:
        if buf.kind in ("input", "const"):
            buf.device = first_reader.get(buf.id, unread)
    for buf in buffers:  # views follow their root (ids are in definition order)
        if buf.kind == "view":
            buf.device = _root(buffers, buf.id).device


def widened_constants(plan: Plan, constants: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The parameters ``plan`` reads: ``constants`` with the float32 copies of the float16
    parameters the CPU reads (made by :func:`insert_copies` with ``widen_on_cpu``), and
    without the float16 ones only the CPU read (the package would carry them unread)."""
    names = {buf.name for buf in plan.buffers if buf.kind == "const"}
    return {
        name: constants[name[: -len(_WIDE_SUFFIX)]].astype(np.float32)
        if name not in constants
        else constants[name]
        for name in sorted(names)
    }
