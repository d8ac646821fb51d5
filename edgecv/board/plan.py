"""The static plan and the recorded GPU launches: what a package's ``plan.json`` and
launch files hold, written by the build and replayed on the board.

A plan is decided entirely at build time and replayed by the executor: every tensor
is a :class:`Buffer` (an input, a constant, a kernel output or a view of another
buffer), every kernel launch a :class:`Step` naming its argument buffers, and every
intermediate buffer is placed in a shared *storage* slot, so an inference allocates
nothing. The build decides those slots (:mod:`edgecv.lowering.memory_plan`, on the
compiler side); this module holds what both sides read: the types, their JSON and the
checks a board runs on a plan before it trusts it. A GPU kernel's :class:`Launch`
records say how the host launches its device functions (grid, work-group, arguments,
workspaces).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import numpy as np


@dataclass
class Buffer:
    """One tensor of the plan."""

    id: int
    shape: tuple[int, ...]
    dtype: str
    kind: str  # "input" | "const" | "temp" | "view"
    name: str = ""
    view_of: int | None = None  # for kind == "view": the buffer whose bytes it reinterprets
    storage: int | None = None  # for kind == "temp": the storage slot
    device: str = "cpu"  # where its bytes live: "cpu" or "gpu" (see edgecv.fallback)
    # for kind == "temp": where in its slot its bytes start, and the buffer it is a
    # piece of when its producer writes it straight into a concatenation's output
    offset: int = 0
    piece_of: int | None = None

    @property
    def nbytes(self) -> int:
        # Python ints: exact for any shape (a damaged plan's too), where int64 wraps
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


@dataclass
class Step:
    """One kernel launch: ``kernel(*args)`` with outputs last (destination passing).

    ``kind == "copy"`` is a device copy instead: ``args == [source, destination]``, two
    buffers of one shape on different devices; ``device`` is the destination's.

    ``elementwise_inputs`` are the positions of inputs the kernel reads only at the
    element its output is writing (a residual add's input; see
    :func:`edgecv.lowering.in_place.elementwise_inputs`): the output may be written
    over such an input where this launch is the input's last use.

    ``pieces`` are the byte offsets of a concatenation's inputs in its output (see
    :func:`edgecv.lowering.in_place.concat_pieces`); where the memory plan places the
    inputs there, the launch is ``elided``: nothing runs for it.

    ``workspaces`` are the buffers of a GPU kernel's device workspaces (the global
    scratch memory its launches share: :attr:`Launch.workspaces`, in that order), added
    by :func:`edgecv.lowering.memory_plan.add_workspaces`: temp buffers of ``uint8``
    bytes this launch alone reads and writes, never its outputs, so the memory plan
    places them like any intermediate live at this launch only (sharing bytes with
    tensors dead there).
    Empty for CPU launches, copies and plans made before workspaces were planned (the
    runtime then allocates them per launch, outside the plan).
    """

    kernel: str
    args: list[int]
    num_outputs: int = 1
    device: str = "cpu"
    kind: str = "kernel"  # "kernel" | "copy"
    elementwise_inputs: list[int] = field(default_factory=list)
    pieces: list[int] = field(default_factory=list)
    elided: bool = False
    workspaces: list[int] = field(default_factory=list)


# A concatenation's input is written in place only at an offset that is a multiple of
# its device's alignment (bytes): TVM's CPU kernels take 64-byte aligned tensors; an
# OpenCL sub-buffer starts at the device's base address alignment (1024 bits on Intel
# graphics and Mali, 4096 on NVIDIA's; a profile may say, see Profile.piece_alignments).
PIECE_ALIGNMENT = {"cpu": 64, "gpu": 512}


@dataclass
class Plan:
    """Buffers, launches, and the storage slots the intermediate buffers share (decided
    by :func:`edgecv.lowering.memory_plan.plan_memory`)."""

    buffers: list[Buffer]
    steps: list[Step]
    inputs: list[int]
    outputs: list[int]
    storage_sizes: list[int] = field(default_factory=list)
    storage_devices: list[str] = field(default_factory=list)  # the device of each slot

    def root(self, buffer_id: int) -> int:
        """The buffer that owns the bytes of ``buffer_id`` (follows views)."""
        buf = self.buffers[buffer_id]
        while buf.kind == "view":
            buf = self.buffers[buf.view_of]
        return buf.id

    def owner(self, buffer_id: int) -> int:
        """The buffer whose slot holds ``buffer_id``'s bytes: its root, or the
        concatenation output that root is written into (through nested ones)."""
        buf = self.buffers[self.root(buffer_id)]
        while buf.piece_of is not None:
            buf = self.buffers[self.root(buf.piece_of)]
        return buf.id

    def devices(self) -> list[str]:
        """The devices the plan's launches run on, in order of first use."""
        return list(dict.fromkeys(step.device for step in self.steps)) or ["cpu"]

    # -- serialization ---------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(
            {
                "buffers": [asdict(b) for b in self.buffers],
                # a launch without workspaces (every one of a CPU plan) is written as
                # before they were planned, so earlier runtimes still read its plan
                "steps": [
                    {k: v for k, v in asdict(s).items() if k != "workspaces" or v}
                    for s in self.steps
                ],
                "inputs": self.inputs,
                "outputs": self.outputs,
                "storage_sizes": self.storage_sizes,
                "storage_devices": self.storage_devices,
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> Plan:
        """The plan ``text`` holds, checked (:meth:`check`): a :class:`FormatError` (a
        ValueError) names what is malformed, where a plan built wrong or damaged would
        otherwise fail deep in the executor, or write outside its memory."""
        raw = _json_object(text, "plan")
        with _fields_checked("plan"):
            buffers = [
                Buffer(**{**_object(b, "buffer"), "shape": tuple(_object(b, "buffer")["shape"])})
                for b in _list(raw, "buffers")
            ]
            plan = cls(
                buffers=buffers,
                steps=[Step(**_object(s, "step")) for s in _list(raw, "steps")],
                inputs=_list(raw, "inputs"),
                outputs=_list(raw, "outputs"),
                storage_sizes=_list(raw, "storage_sizes"),
                storage_devices=raw.get("storage_devices", ["cpu"] * len(raw["storage_sizes"])),
            )
        plan.check()
        return plan

    def check(self) -> None:
        """Raise :class:`FormatError` unless every index the plan holds points where it
        must, every tensor fits the memory it is placed in (a CPU one at an offset TVM's
        kernels can take) and no launch writes a constant: what the executor relies on
        when it views storage slots and binds kernels to them. What a GPU kernel reads
        through each argument is checked where it is bound (:attr:`Launch.buffers`)."""
        _check_slots(self)
        for i, buf in enumerate(self.buffers):
            _check_buffer(self, i, buf)
        _check_pieces_end(self)
        owner_of: dict[int, int] = {}  # workspace -> the step it belongs to
        for i, step in enumerate(self.steps):
            _check_step(self, i, step)
            _check_workspaces(self, i, step, owner_of)
        _check_ends(self)


def _check_slots(plan: Plan) -> None:
    """The storage slots: a size in bytes and a device each."""
    slots, devices = plan.storage_sizes, plan.storage_devices
    _require(_ints(slots, 0), "storage_sizes", "sizes in bytes", slots)
    _require(
        isinstance(devices, list)
        and len(devices) == len(slots)
        and all(d in DEVICES for d in devices),
        "storage_devices",
        f"one of {DEVICES} per storage slot",
        devices,
    )


def _check_buffer(plan: Plan, i: int, buf: Buffer) -> None:
    """Buffer ``i``: its fields, the buffer it views, and a temp buffer's place in its
    slot (inside it, on its device, aligned on the CPU)."""
    n, slots, devices = len(plan.buffers), plan.storage_sizes, plan.storage_devices
    at = f"buffer {i}"
    _require(buf.id == i, f"{at}: id", f"{i} (buffers in id order)", buf.id)
    _require(_ints(buf.shape, 0), f"{at}: shape", "sizes (whole numbers >= 0)", buf.shape)
    _require(_is_dtype(buf.dtype), f"{at}: dtype", "a NumPy dtype name", buf.dtype)
    _require(buf.kind in BUFFER_KINDS, f"{at}: kind", f"one of {BUFFER_KINDS}", buf.kind)
    _require(buf.device in DEVICES, f"{at}: device", f"one of {DEVICES}", buf.device)
    _require(isinstance(buf.name, str), f"{at}: name", "a string", buf.name)
    if buf.kind == "view":
        _require(
            _index(buf.view_of, i),
            f"{at}: view_of",
            f"a buffer before it (< {i})",
            buf.view_of,
        )
        root = plan.buffers[plan.root(i)]
        _require(
            buf.nbytes <= root.nbytes,
            f"{at}: shape",
            f"at most the {root.nbytes} bytes of the buffer it views",
            buf.shape,
        )
    if buf.kind == "temp":
        _require(_index(buf.storage, len(slots)), f"{at}: storage", "a slot", buf.storage)
        _require(_ints([buf.offset], 0), f"{at}: offset", "bytes >= 0", buf.offset)
        # TVM's CPU kernels assume 64-byte aligned tensors (aligned vector loads:
        # a plan placing one at offset 4 crashed the process)
        cpu_align = PIECE_ALIGNMENT["cpu"]
        _require(
            buf.device != "cpu" or buf.offset % cpu_align == 0,
            f"{at}: offset",
            f"a multiple of {cpu_align} (TVM's CPU kernels take aligned tensors)",
            buf.offset,
        )
        end = buf.offset + buf.nbytes
        _require(
            end <= slots[buf.storage] and devices[buf.storage] == buf.device,
            f"{at}: offset",
            f"a place inside storage slot {buf.storage} ({slots[buf.storage]} bytes on "
            f"the {devices[buf.storage]})",
            f"{buf.offset} + {buf.nbytes} bytes on the {buf.device}",
        )
    if buf.piece_of is not None:
        _require(_index(buf.piece_of, n), f"{at}: piece_of", "a buffer", buf.piece_of)


def _check_pieces_end(plan: Plan) -> None:
    """Every chain of pieces ends: :meth:`Plan.owner` follows them, so no loop."""
    for i, buf in enumerate(plan.buffers):
        seen, piece = {i}, buf
        while piece.piece_of is not None:
            piece = plan.buffers[plan.root(piece.piece_of)]
            _require(piece.id not in seen, f"buffer {i}: piece_of", "no loop", buf.piece_of)
            seen.add(piece.id)


def _check_step(plan: Plan, i: int, step: Step) -> None:
    """Launch ``i``: its fields, buffers that exist, outputs that are no constant, and
    a copy between two buffers of one size."""
    n, at = len(plan.buffers), f"step {i}"
    _require(isinstance(step.kernel, str), f"{at}: kernel", "a name", step.kernel)
    _require(
        isinstance(step.args, list) and all(_index(a, n) for a in step.args),
        f"{at}: args",
        "buffer ids",
        step.args,
    )
    outputs = step.num_outputs
    _require(
        _ints([outputs], 1) and outputs <= len(step.args),
        f"{at}: num_outputs",
        "1 to the number of args",
        outputs,
    )
    _require(step.kind in STEP_KINDS, f"{at}: kind", f"one of {STEP_KINDS}", step.kind)
    for a in step.args[len(step.args) - outputs :]:
        _check_not_constant(plan, at, a)
    _require(step.device in DEVICES, f"{at}: device", f"one of {DEVICES}", step.device)
    if step.kind == "copy":
        _require(len(step.args) == 2, f"{at}: args", "[source, destination]", step.args)
        source, destination = (plan.buffers[a] for a in step.args)
        # a float16 package's copies to and from its float32 CPU part convert
        converts = {source.dtype, destination.dtype} == {"float16", "float32"}
        _require(
            source.nbytes == destination.nbytes
            or (converts and tuple(source.shape) == tuple(destination.shape)),
            f"{at}: args",
            "two buffers of one size (or shape, float16 <-> float32)",
            step.args,
        )
    inputs = len(step.args) - outputs
    _require(
        isinstance(step.elementwise_inputs, list)
        and all(_index(p, inputs) for p in step.elementwise_inputs),
        f"{at}: elementwise_inputs",
        "input positions",
        step.elementwise_inputs,
    )
    _require(_ints(step.pieces, 0), f"{at}: pieces", "byte offsets", step.pieces)
    _require(isinstance(step.elided, bool), f"{at}: elided", "true or false", step.elided)


def _check_workspaces(plan: Plan, i: int, step: Step, owner_of: dict[int, int]) -> None:
    """Launch ``i``'s workspaces: temp buffers on its device, none of its arguments, of
    no other launch (``owner_of``: workspace -> the launch it belongs to, so far)."""
    at = f"step {i}"
    _require(
        isinstance(step.workspaces, list)
        and all(_index(w, len(plan.buffers)) for w in step.workspaces)
        and (step.kind == "kernel" or not step.workspaces),
        f"{at}: workspaces",
        "buffer ids (of a kernel launch)",
        step.workspaces,
    )
    for w in step.workspaces:
        buf = plan.buffers[w]
        _require(
            buf.kind == "temp" and buf.device == step.device and w not in step.args,
            f"{at}: workspace {w}",
            f"a temp buffer on the {step.device}, none of the launch's arguments",
            f"a {buf.kind} buffer on the {buf.device}",
        )
        _require(
            owner_of.setdefault(w, i) == i,
            f"{at}: workspace {w}",
            "a buffer of this launch alone",
            f"a workspace of step {owner_of[w]} too",
        )


def _check_ends(plan: Plan) -> None:
    """The plan's inputs and outputs: buffer ids, the inputs input buffers."""
    n = len(plan.buffers)
    for name in ("inputs", "outputs"):
        ids = getattr(plan, name)
        _require(isinstance(ids, list) and all(_index(b, n) for b in ids), name, "buffer ids", ids)
    for b in plan.inputs:
        kind = plan.buffers[b].kind
        _require(kind == "input", f"inputs: buffer {b}", "an input buffer", kind)


def _check_not_constant(plan: Plan, at: str, output: int) -> None:
    """Launch ``at`` may write buffer ``output``: it is no constant, nor a view or
    a piece of one. Every stream reads the same constants, uploaded once: a launch
    writing one would race the others and change the weights of every later call."""
    written = plan.buffers[plan.owner(output)]
    if written.kind == "const":
        what = "constant" if written.id == output else "a view of constant"
        _require(
            False,
            f"{at}: output buffer {output}",
            "memory of the inference, not a constant (shared by every stream)",
            f"{what} `{written.name}`",
        )


DEVICES = ("cpu", "gpu")
BUFFER_KINDS = ("input", "const", "temp", "view")
STEP_KINDS = ("kernel", "copy")


class FormatError(ValueError):
    """A plan or launches file that does not hold what the package format says."""


def _escaped(text: str) -> str:
    """``text`` on one line: Python's messages quote a field name as it is, and a
    damaged file's names may hold line breaks."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def _require(ok: bool, field: str, expected: str, found: object) -> None:
    if not ok:
        raise FormatError(f"{field} should be {expected}, found {found!r:.80}")


def _ints(values: object, minimum: int) -> bool:
    """``values`` is a list or tuple of ints (not bools) of at least ``minimum``."""
    return isinstance(values, (list, tuple)) and all(
        type(v) is int and v >= minimum for v in values
    )


def _index(value: object, size: int) -> bool:
    return type(value) is int and 0 <= value < size


def _is_dtype(name: object) -> bool:
    if not isinstance(name, str):
        return False
    try:
        return np.dtype(name).kind in "biuf"
    except TypeError:
        return False


def _list(raw: dict, key: str) -> list:
    value = raw[key]
    if not isinstance(value, list):
        raise TypeError(f"field '{key}' is a {type(value).__name__}, not a list")
    return value


def _object(raw: object, what: str) -> dict:
    if not isinstance(raw, dict):
        raise TypeError(f"a {what} is a {type(raw).__name__}, not an object")
    return raw


@dataclass
class Launch:
    """One device-function launch: args are ("buffer", param index), ("workspace", index)
    or ("scalar", value), each with the C type of the parameter.

    ``global_size`` counts work-items (OpenCL's convention): CUDA's grid is
    ``global_size / local_size``.
    """

    kernel: str
    args: list[tuple[str, int | float, str]]
    global_size: tuple[int, int, int]
    local_size: tuple[int, int, int]
    # bytes of each device workspace of the PrimFunc (the same list on each of its
    # launches); ("workspace", i) arguments name them. The build makes them temp buffers
    # of the plan (Step.workspaces); the runtime allocates them once per step only for a
    # plan without them (made before they were planned).
    workspaces: list[int] = field(default_factory=list)
    # bytes the device code reads or writes through each parameter of the PrimFunc, in
    # parameter order (the step's args; 0 for one that is no buffer): the same list on
    # each of its launches. No argument check stands between a GPU kernel and memory,
    # so the runtime refuses buffers smaller than these. Empty: recorded before them.
    buffers: list[int] = field(default_factory=list)


def _json_object(text: str, what: str) -> dict:
    """``text`` parsed, where it is one JSON object; else a :class:`FormatError` naming
    ``what`` it should have been."""
    try:
        raw = json.loads(text)
    except RecursionError:
        raise FormatError(f"malformed {what}: JSON nested too deep") from None
    if not isinstance(raw, dict):
        raise FormatError(f"malformed {what}: a JSON {type(raw).__name__}, not an object")
    return raw


@contextlib.contextmanager
def _fields_checked(what: str) -> Iterator[None]:
    """Reading fields of ``what`` inside the block: a field missing, of a type that
    does not fit or unknown (KeyError, TypeError, AttributeError) is one
    :class:`FormatError` naming it."""
    try:
        yield
    except (KeyError, TypeError, AttributeError) as err:
        reason = f"field {err} is missing" if isinstance(err, KeyError) else str(err)
        raise FormatError(f"malformed {what}: {_escaped(reason)}") from None


def launches_to_json(launches: dict[str, list[Launch]]) -> str:
    return json.dumps({name: [asdict(x) for x in items] for name, items in launches.items()})


def launches_from_json(text: str) -> dict[str, list[Launch]]:
    """The launches ``text`` holds; :class:`FormatError` (a ValueError) names what is
    malformed."""
    raw = _json_object(text, "launches")
    with _fields_checked("launches"):
        launches = {
            name: [
                Launch(
                    x["kernel"],
                    [tuple(a) for a in x["args"]],
                    tuple(x["global_size"]),
                    tuple(x["local_size"]),
                    list(x.get("workspaces", [])),
                    list(x.get("buffers", [])),
                )
                for x in items
            ]
            for name, items in raw.items()
        }
    for name, items in launches.items():
        for launch in items:
            _check_launch(name, launch)
    return launches


def _check_launch(name: str, launch: Launch) -> None:
    at = f"launch of `{name}`"
    _require(isinstance(launch.kernel, str), f"{at}: kernel", "a name", launch.kernel)
    for size in (launch.global_size, launch.local_size):
        _require(len(size) == 3 and _ints(size, 1), f"{at}: sizes", "3 counts >= 1", size)
    _require(_ints(launch.workspaces, 0), f"{at}: workspaces", "sizes", launch.workspaces)
    _require(_ints(launch.buffers, 0), f"{at}: buffers", "sizes in bytes", launch.buffers)
    for arg in launch.args:
        ok = len(arg) == 3 and isinstance(arg[2], str)
        if ok and arg[0] in ("buffer", "workspace"):
            ok = type(arg[1]) is int and arg[1] >= 0
        elif ok:
            ok = arg[0] == "scalar" and isinstance(arg[1], (int, float))
        _require(ok, f"{at}: args", "(buffer|workspace|scalar, value, C type)", arg)
