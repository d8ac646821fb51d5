"""The package format: the static execution plan and the recorded GPU launches.

Both the build (which writes them) and the runtime (which replays them) import this
module, and nothing else of each other.

A plan is decided entirely at build time and replayed by the executor: every tensor
is a :class:`Buffer` (an input, a constant, a kernel output or a view of another
buffer), every kernel launch a :class:`Step` naming its argument buffers, and every
intermediate buffer is placed in a shared *storage* slot chosen by liveness, so an
inference allocates nothing. A GPU kernel's :class:`Launch` records say how the host
launches its device functions (grid, work-group, arguments, workspaces).
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
    by :meth:`Plan.add_workspaces`: temp buffers of ``uint8`` bytes this launch alone
    reads and writes, never its outputs, so the memory plan places them like any
    intermediate live at this launch only (sharing bytes with tensors dead there).
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
# How much larger (or smaller, to be grown) than a tensor a free slot the memory plan may
# give it, tried in turn (None: any); the plan keeps the smallest total. Measured on the
# seven zoo models' deeplens plans: 16 takes 10-22% off SSD-512 MobileNet and SqueezeNet,
# none is best for ResNet-50 and MobileNet (16: +0.2-1.9%).
SLOT_MATCH_RANGES = (None, 64, 16, 8)
# The largest single slot an arena plan may put on a GPU: OpenCL promises one allocation
# of a quarter of the device's memory and at least 128 MB (CL_DEVICE_MAX_MEM_ALLOC_SIZE);
# a larger arena leaves the choice to the plans of several slots.
ARENA_GPU_LIMIT = 128 << 20
# TVM's runtime libraries for the package's host, beside its CPU kernels (runtime/cpu.py):
# the runtime, and its extra library when a kernel calls one of TVM's library functions.
TVM_RUNTIME_FILES = ("kernels/libtvm_runtime.so", "kernels/libtvm_runtime_extra.so")


@dataclass
class Plan:
    """Buffers, launches, and the storage slots the intermediate buffers share."""

    buffers: list[Buffer]
    steps: list[Step]
    inputs: list[int]
    outputs: list[int]
    storage_sizes: list[int] = field(default_factory=list)
    storage_devices: list[str] = field(default_factory=list)  # the device of each slot

    # -- memory planning -------------------------------------------------------------
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

    def _write_pieces_in_place(self, alignments: dict[str, int]) -> dict[int, int]:
        """Decide which concatenations need not run: those whose every input is a temp
        buffer written by a kernel launch on the concatenation's device, at an aligned
        offset, and a piece of no other. Such inputs become pieces of the output (each
        producer writes its range of the output) and the launch is elided. Returns each
        piece's byte offset in the buffer it is a piece of."""
        pieces: dict[int, int] = {}
        writer: dict[int, Step] = {}
        for step in self.steps:
            step.elided = False
            for out in step.args[len(step.args) - step.num_outputs :]:
                writer[out] = step
        for buf in self.buffers:
            buf.piece_of = None
        for step in self.steps:
            inputs = step.args[: len(step.args) - step.num_outputs]
            output = self.buffers[step.args[-1]]
            roots = [self.root(a) for a in inputs]  # a reshaped input: the bytes it views
            if (
                not step.pieces
                or step.kind != "kernel"
                or step.num_outputs != 1
                or output.kind != "temp"
                or len(step.pieces) != len(inputs)
                or len(set(roots)) != len(roots)
                or any(offset % alignments[step.device] for offset in step.pieces)
            ):
                continue
            if all(
                self.buffers[r].kind == "temp"
                and self.buffers[r].piece_of is None
                and r in writer
                and writer[r].kind == "kernel"
                and writer[r].device == step.device == self.buffers[r].device
                for r in roots
            ):
                for r, offset in zip(roots, step.pieces):
                    self.buffers[r].piece_of = output.id
                    pieces[r] = offset
                step.elided = True
        return pieces

    def add_workspaces(
        self, sizes: dict[str, list[int]], alignments: dict[str, int] | None = None
    ) -> list[int]:
        """Give every GPU kernel launch that runs (not a concatenation :meth:`plan_memory`
        elides with ``alignments``) a temp buffer for each of its kernel's device
        workspaces, of ``sizes[kernel]`` bytes (:attr:`Launch.workspaces`), recorded in
        :attr:`Step.workspaces`; :meth:`plan_memory` then places them. Launches that
        already have theirs keep them. Returns the new buffers' ids."""
        self._write_pieces_in_place(alignments or PIECE_ALIGNMENT)  # which launches run
        added: list[int] = []
        for step in self.steps:
            if step.kind != "kernel" or step.device != "gpu" or step.elided or step.workspaces:
                continue
            ids = []  # a new list: steps copied with dataclasses.replace share the old one
            for i, size in enumerate(sizes.get(step.kernel, [])):
                name = f"{step.kernel}:workspace{i}"
                ids.append(len(self.buffers))
                self.buffers.append(Buffer(ids[-1], (size,), "uint8", "temp", name, device="gpu"))
            step.workspaces = ids
            added += ids
        return added

    def plan_memory(self, alignments: dict[str, int] | None = None) -> None:
        """Assign every temp buffer a storage slot, reusing slots of dead buffers.

        Liveness runs over launches: a buffer is live from the step that writes it to
        the last step that reads it (through any view). Graph outputs live to the end.
        A freed slot is reused by the next buffer on the same device that it fits best
        (smallest slot that is large enough, else the largest free slot, grown); the
        plan is made once per :data:`SLOT_MATCH_RANGES` (how far a slot's size may be
        from the buffer's), once more with every buffer at an offset in one slot per
        device (:meth:`_arena`: on the seven zoo models' deeplens plans it reaches the
        live lower bound, 27.3 MB for SSD-512 ResNet-50 where slots took 32.8), and the
        smallest kept. A
        launch's output takes over the slot of an input read only element for element
        (:attr:`Step.elementwise_inputs`) that dies at that launch: the output is written
        in place, as the input's cache lines are still hot, not into a fresh slot.
        Concatenations whose inputs can be written straight into their output are elided
        first: each input (a piece) lives in the output's slot at its offset, and that
        slot from the first piece's launch to the last read of the output or a piece,
        where the input's offset is a multiple of its device's ``alignments`` (bytes,
        default :data:`PIECE_ALIGNMENT`). A launch's workspaces (:attr:`Step.workspaces`)
        live at that launch alone, placed like its outputs but never over an input.
        """
        alignments = alignments or PIECE_ALIGNMENT
        pieces = self._write_pieces_in_place(alignments)
        # the smallest of the plans made with each match range (none first: it wins ties)
        # and the arena's (one slot per device, buffers at offsets)
        plans = [(*self._assign_slots(r), {}) for r in SLOT_MATCH_RANGES]
        arena = self._arena(alignments)
        if all(size <= ARENA_GPU_LIMIT for size, d in zip(*arena[:2]) if d == "gpu"):
            plans.append(arena)
        sizes, devices, storage, base = min(plans, key=lambda plan: sum(plan[0]))
        for buf in self.buffers:
            if buf.id in storage:
                buf.storage = storage[buf.id]
        for buf in self.buffers:  # pieces: in their owner's slot, at their offset
            if buf.kind == "temp":
                buf.offset, piece = 0, buf
                while piece.piece_of is not None:
                    buf.offset += pieces[piece.id]
                    piece = self.buffers[self.root(piece.piece_of)]
                buf.storage = piece.storage
                buf.offset += base.get(piece.id, 0)
        self.storage_sizes = sizes
        self.storage_devices = devices

    def _arena(
        self, alignments: dict[str, int]
    ) -> tuple[list[int], list[str], dict[int, int], dict[int, int]]:
        """(slot sizes, slot devices, buffer id -> slot, buffer id -> byte offset): one
        slot per device, every buffer at an offset in it, placed largest first at the
        lowest offset free of the buffers live at the same time (greedy by size). A
        launch's output takes its element-wise input's place as in :meth:`_assign_slots`
        (the two share a place and their lifetimes join)."""
        first, last = self._lifetimes()
        group: dict[int, int] = {}  # owner -> the owner whose place it shares
        temps = [b for b in first if self.buffers[b].kind == "temp"]

        def place_of(b: int) -> int:
            while group.get(b, b) != b:
                b = group[b]
            return b

        for index, step in enumerate(self.steps):
            if step.elided or step.num_outputs != 1:
                continue
            out = self.buffers[step.args[-1]]
            if out.kind != "temp" or out.id != self.owner(out.id) or first.get(out.id) != index:
                continue
            for donor in self._elementwise_donors(step, out):
                if (
                    donor.id == self.owner(donor.id)
                    and last.get(donor.id) == index
                    and _aligned(self.buffers[place_of(donor.id)].nbytes) >= _aligned(out.nbytes)
                ):
                    group[out.id] = place_of(donor.id)
                    break
        span: dict[int, list[int]] = {}
        for b in temps:
            head = place_of(b)
            lo, hi = span.get(head, [first[b], last[b]])
            span[head] = [min(lo, first[b]), max(hi, last[b])]
        slots: dict[str, int] = {}
        sizes: list[int] = []
        devices: list[str] = []
        placed: dict[str, list[tuple[int, int, int, int]]] = {}  # (lo, hi, offset, size)
        base: dict[int, int] = {}
        for head in sorted(span, key=lambda h: (-self.buffers[h].nbytes, h)):
            buf = self.buffers[head]
            align = alignments.get(buf.device, 64)
            need = _aligned(buf.nbytes, align)
            lo, hi = span[head]
            busy = sorted(
                (offset, offset + size)
                for a, b, offset, size in placed.get(buf.device, [])
                if a <= hi and lo <= b
            )
            offset = 0
            for start, stop in busy:
                if offset + need <= start:
                    break
                offset = max(offset, -(-stop // align) * align)
            placed.setdefault(buf.device, []).append((lo, hi, offset, need))
            if buf.device not in slots:
                slots[buf.device] = len(sizes)
                sizes.append(0)
                devices.append(buf.device)
            sizes[slots[buf.device]] = max(sizes[slots[buf.device]], offset + need)
            base[head] = offset
        storage = {b: slots[self.buffers[b].device] for b in temps}
        offsets = {b: base[place_of(b)] for b in temps}
        return sizes, devices, storage, offsets

    def _assign_slots(self, match_range: int | None) -> tuple[list[int], list[str], dict[int, int]]:
        """(slot sizes, slot devices, buffer id -> slot) of every temp buffer, as
        :meth:`plan_memory` describes; a free slot goes to a buffer only within
        ``match_range`` of its size (None: any), else a new slot is made, since a small
        tensor in a large slot pins the whole slot while it lives."""
        _, last_use = self._lifetimes()
        end = len(self.steps)
        for buf in self.buffers:
            if buf.kind == "temp":
                buf.storage = None
        sizes: list[int] = []
        devices: list[str] = []
        free: list[int] = []
        storage: dict[int, int] = {}
        for index, step in enumerate(self.steps):
            if step.elided:
                continue
            # the buffers this launch makes: its outputs, its workspaces
            outputs = step.args[len(step.args) - step.num_outputs :]
            for arg, output in [(a, True) for a in outputs] + [(w, False) for w in step.workspaces]:
                buf = self.buffers[self.owner(arg)]
                if buf.kind != "temp" or buf.id in storage:
                    continue
                need = _aligned(buf.nbytes)
                donor = None
                if output and buf.id == arg:
                    donor = self._donor(step, index, buf, last_use, sizes)
                if donor is not None:
                    buf.storage = storage[buf.id] = donor.storage
                    last_use[donor.id] = end + 1  # its slot passes on, not to the free list
                    continue
                here = [
                    s
                    for s in free
                    if devices[s] == buf.device
                    and (match_range is None or need <= sizes[s] * match_range)
                    and (match_range is None or sizes[s] <= need * match_range)
                ]
                fits = [s for s in here if sizes[s] >= need]
                if fits:
                    slot = min(fits, key=lambda s: sizes[s])
                elif here:
                    slot = max(here, key=lambda s: sizes[s])
                    sizes[slot] = need
                else:
                    slot = len(sizes)
                    sizes.append(need)
                    devices.append(buf.device)
                if slot in free:
                    free.remove(slot)
                buf.storage = storage[buf.id] = slot
            for arg in set(step.args + step.workspaces):
                root = self.buffers[self.owner(arg)]
                if root.kind == "temp" and last_use.get(root.id, index) <= index:
                    if root.storage is not None and root.storage not in free:
                        free.append(root.storage)
                    last_use[root.id] = end + 1  # freed once
        return sizes, devices, storage

    def _donor(
        self, step: Step, index: int, out: Buffer, last_use: dict[int, int], sizes: list[int]
    ) -> Buffer | None:
        """The input of ``step`` whose slot ``out`` can take over, if any: a temp buffer
        on ``out``'s device, in a slot large enough, read by this launch only through
        element-wise positions, and never read after it."""
        if step.num_outputs != 1:
            return None
        for root in self._elementwise_donors(step, out):
            if (
                root.storage is not None
                and last_use.get(root.id) == index
                and sizes[root.storage] >= _aligned(out.nbytes)
            ):
                return root
        return None

    def _elementwise_donors(self, step: Step, out: Buffer) -> Iterator[Buffer]:
        """The inputs of ``step`` whose bytes its output ``out`` may be written over (if
        they die there): temp buffers on ``out``'s device that the launch reads only at
        element-wise positions (:attr:`Step.elementwise_inputs`)."""
        num_inputs = len(step.args) - step.num_outputs
        for position in step.elementwise_inputs:
            root = self.buffers[self.root(step.args[position])]
            others = {p for p in range(num_inputs) if self.root(step.args[p]) == root.id} - set(
                step.elementwise_inputs
            )
            if root.kind == "temp" and root.device == out.device and not others:
                yield root

    def written_over(self, index: int) -> int | None:
        """The input (root buffer) launch ``index`` writes its output over, if any."""
        step = self.steps[index]
        output = self.buffers[step.args[-1]]
        for position in step.elementwise_inputs:
            donor = self.buffers[self.root(step.args[position])]
            if donor.kind == "temp" == output.kind and donor.storage is not None:
                pieces = donor.piece_of is not None or output.piece_of is not None
                same = donor.storage == output.storage and donor.offset == output.offset
                if same and donor.id != output.id and not pieces:
                    return donor.id
        return None

    def _lifetimes(self) -> tuple[dict[int, int], dict[int, int]]:
        """(first, last): per buffer owning bytes (:meth:`owner`), the first and the
        last launch that runs and reads or writes it; a graph output lives to the end,
        a workspace at its launch only."""
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for index, step in enumerate(self.steps):
            if step.elided:
                continue
            for arg in step.args + step.workspaces:
                root = self.owner(arg)
                first.setdefault(root, index)
                last[root] = index
        for out in self.outputs:
            last[self.owner(out)] = len(self.steps)
        return first, last

    def live_bytes_lower_bound(self, device: str | None = None) -> int:
        """The largest total size of intermediate buffers live at one launch (on
        ``device`` only, when given); an input a launch writes its output over counts
        until the launch before."""
        first, last = self._lifetimes()
        for index in range(len(self.steps)):
            donor = self.written_over(index)
            if donor is not None:
                last[donor] = index - 1
        peak = 0
        for index in range(len(self.steps)):
            live = sum(
                self.buffers[b].nbytes
                for b in first
                if self.buffers[b].kind == "temp"
                and first[b] <= index <= last[b]
                and device in (None, self.buffers[b].device)
            )
            peak = max(peak, live)
        return peak

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
        n, slots = len(self.buffers), self.storage_sizes
        _require(_ints(slots, 0), "storage_sizes", "sizes in bytes", slots)
        devices = self.storage_devices
        _require(
            isinstance(devices, list)
            and len(devices) == len(slots)
            and all(d in DEVICES for d in devices),
            "storage_devices",
            f"one of {DEVICES} per storage slot",
            devices,
        )
        for i, buf in enumerate(self.buffers):
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
                root = self.buffers[self.root(i)]
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
        for i, buf in enumerate(self.buffers):  # owner() follows these: no loop
            seen, piece = {i}, buf
            while piece.piece_of is not None:
                piece = self.buffers[self.root(piece.piece_of)]
                _require(piece.id not in seen, f"buffer {i}: piece_of", "no loop", buf.piece_of)
                seen.add(piece.id)
        owner_of: dict[int, int] = {}  # workspace -> the step it belongs to
        for i, step in enumerate(self.steps):
            at = f"step {i}"
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
                self._check_not_constant(at, a)
            _require(step.device in DEVICES, f"{at}: device", f"one of {DEVICES}", step.device)
            if step.kind == "copy":
                _require(len(step.args) == 2, f"{at}: args", "[source, destination]", step.args)
                source, destination = (self.buffers[a] for a in step.args)
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
            _require(
                isinstance(step.workspaces, list)
                and all(_index(w, n) for w in step.workspaces)
                and (step.kind == "kernel" or not step.workspaces),
                f"{at}: workspaces",
                "buffer ids (of a kernel launch)",
                step.workspaces,
            )
            for w in step.workspaces:
                buf = self.buffers[w]
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
        for name in ("inputs", "outputs"):
            ids = getattr(self, name)
            _require(
                isinstance(ids, list) and all(_index(b, n) for b in ids), name, "buffer ids", ids
            )
        for b in self.inputs:
            kind = self.buffers[b].kind
            _require(kind == "input", f"inputs: buffer {b}", "an input buffer", kind)

    def _check_not_constant(self, at: str, output: int) -> None:
        """Launch ``at`` may write buffer ``output``: it is no constant, nor a view or
        a piece of one. Every stream reads the same constants, uploaded once: a launch
        writing one would race the others and change the weights of every later call."""
        written = self.buffers[self.owner(output)]
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


def _aligned(nbytes: int, alignment: int = 64) -> int:
    return max(alignment, (nbytes + alignment - 1) // alignment * alignment)


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
