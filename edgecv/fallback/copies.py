"""Pass 2: put every buffer on a device and insert a copy on each edge that crosses.

After :func:`~.placement.place` tags the launches, each buffer lives where it is made:
a kernel output on its launch's device, a view with the buffer it views, a model input
on the device of its first reader. A launch that reads a buffer living on the other
device reads a copy instead; the copy is made once per tensor and destination device
(right before its first reader there) and shared by every later reader on that device.
Parameters are not copied at run time: a parameter read on both devices is uploaded to
both when the package loads. The result is a new plan, memory planned per device.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..package_format import Buffer, Plan, Step
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

    def describe(self) -> str:
        shape = "x".join(map(str, self.shape))
        return f"{self.from_device}->{self.to_device} {shape} {self.dtype} ({self.nbytes:,} bytes)"


def insert_copies(
    plan: Plan, placement: Placement, alignments: dict[str, int] | None = None
) -> tuple[Plan, list[Copy]]:
    """A new plan with devices on every step and buffer, and the copies it needed;
    memory planned with the devices' ``alignments`` (see :meth:`Plan.plan_memory`)."""
    buffers = [replace(b, storage=None) for b in plan.buffers]
    steps = [replace(s, device=d) for s, d in zip(plan.steps, placement.devices, strict=True)]

    def root(buffer_id: int) -> Buffer:
        buf = buffers[buffer_id]
        while buf.kind == "view":
            buf = buffers[buf.view_of]
        return buf

    first_reader: dict[int, str] = {}
    for step in steps:
        for arg in step.args[: len(step.args) - step.num_outputs]:
            first_reader.setdefault(root(arg).id, step.device)
        for out in step.args[len(step.args) - step.num_outputs :]:
            buffers[out].device = step.device
    for buf in buffers:
        if buf.kind in ("input", "const"):
            buf.device = first_reader.get(buf.id, "cpu")
    for buf in buffers:  # views follow their root (ids are in definition order)
        if buf.kind == "view":
            buf.device = root(buf.id).device

    new_steps: list[Step] = []
    copies: list[Copy] = []
    made: dict[tuple[int, str], int] = {}  # (buffer, destination device) -> its copy

    def add_buffer(like: Buffer, kind: str, device: str) -> int:
        new = replace(like, id=len(buffers), kind=kind, view_of=None, device=device)
        buffers.append(new)
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
                if root(arg).kind == "const" and source.kind == "const":
                    made[key] = add_buffer(source, "const", step.device)  # uploaded twice
                else:
                    made[key] = add_buffer(source, "temp", step.device)
                    copies.append(
                        Copy(len(new_steps), arg, made[key], source.shape, source.dtype,
                             source.nbytes, source.device, step.device)
                    )  # fmt: skip
                    new_steps.append(Step("copy", [arg, made[key]], 1, step.device, "copy"))
            args[position] = made[key]
        new_steps.append(replace(step, args=args))
    result = Plan(buffers, new_steps, list(plan.inputs), list(plan.outputs))
    result.plan_memory(alignments)
    return result, copies
