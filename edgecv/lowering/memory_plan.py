"""The memory plan: where every intermediate buffer of a :class:`~edgecv.board.plan.Plan`
lives, decided once at build time so an inference allocates nothing.

Only the build runs this (after plan extraction, again after placement and device
copies): a board reads the slots and offsets it wrote into the plan
(:attr:`~edgecv.board.plan.Buffer.storage`, :attr:`~edgecv.board.plan.Buffer.offset`,
:attr:`~edgecv.board.plan.Plan.storage_sizes`) and never plans memory itself. Concatenations
whose inputs can be written straight into their output are elided, GPU kernels' device
workspaces become temp buffers live at their launch alone, and each buffer gets a
storage slot (several slot plans and one arena plan made, the smallest kept).
"""

from __future__ import annotations

from collections.abc import Iterator

from ..board.plan import PIECE_ALIGNMENT, Buffer, Plan, Step

# How much larger (or smaller, to be grown) than a tensor a free slot the memory plan may
# give it, tried in turn (None: any); the plan keeps the smallest total. Measured on the
# seven zoo models' deeplens plans: 16 takes 10-22% off SSD-512 MobileNet and SqueezeNet,
# none is best for ResNet-50 and MobileNet (16: +0.2-1.9%).
SLOT_MATCH_RANGES = (None, 64, 16, 8)
# The largest single slot an arena plan may put on a GPU: OpenCL promises one allocation
# of a quarter of the device's memory and at least 128 MB (CL_DEVICE_MAX_MEM_ALLOC_SIZE);
# a larger arena leaves the choice to the plans of several slots.
ARENA_GPU_LIMIT = 128 << 20


def write_pieces_in_place(plan: Plan, alignments: dict[str, int]) -> dict[int, int]:
    """Decide which concatenations need not run: those whose every input is a temp
    buffer written by a kernel launch on the concatenation's device, at an aligned
    offset, and a piece of no other. Such inputs become pieces of the output (each
    producer writes its range of the output) and the launch is elided. Returns each
    piece's byte offset in the buffer it is a piece of."""
    pieces: dict[int, int] = {}
    writer: dict[int, Step] = {}
    for step in plan.steps:
        step.elided = False
        for out in step.args[len(step.args) - step.num_outputs :]:
            writer[out] = step
    for buf in plan.buffers:
        buf.piece_of = None
    for step in plan.steps:
        inputs = step.args[: len(step.args) - step.num_outputs]
        output = plan.buffers[step.args[-1]]
        roots = [plan.root(a) for a in inputs]  # a reshaped input: the bytes it views
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
            plan.buffers[r].kind == "temp"
            and plan.buffers[r].piece_of is None
            and r in writer
            and writer[r].kind == "kernel"
            and writer[r].device == step.device == plan.buffers[r].device
            for r in roots
        ):
            for r, offset in zip(roots, step.pieces, strict=True):
                plan.buffers[r].piece_of = output.id
                pieces[r] = offset
            step.elided = True
    return pieces


def add_workspaces(
    plan: Plan, sizes: dict[str, list[int]], alignments: dict[str, int] | None = None
) -> list[int]:
    """Give every GPU kernel launch that runs (not a concatenation :func:`plan_memory`
    elides with ``alignments``) a temp buffer for each of its kernel's device
    workspaces, of ``sizes[kernel]`` bytes
    (:attr:`~edgecv.board.plan.Launch.workspaces`), recorded in
    :attr:`~edgecv.board.plan.Step.workspaces`; :func:`plan_memory` then places them.
    Launches that already have theirs keep them. Returns the new buffers' ids."""
    write_pieces_in_place(plan, alignments or PIECE_ALIGNMENT)  # which launches run
    added: list[int] = []
    for step in plan.steps:
        if step.kind != "kernel" or step.device != "gpu" or step.elided or step.workspaces:
            continue
        ids = []  # a new list: steps copied with dataclasses.replace share the old one
        for i, size in enumerate(sizes.get(step.kernel, [])):
            name = f"{step.kernel}:workspace{i}"
            ids.append(len(plan.buffers))
            plan.buffers.append(Buffer(ids[-1], (size,), "uint8", "temp", name, device="gpu"))
        step.workspaces = ids
        added += ids
    return added


def plan_memory(plan: Plan, alignments: dict[str, int] | None = None) -> None:
    """Assign every temp buffer a storage slot, reusing slots of dead buffers.

    Liveness runs over launches: a buffer is live from the step that writes it to
    the last step that reads it (through any view). Graph outputs live to the end.
    A freed slot is reused by the next buffer on the same device that it fits best
    (smallest slot that is large enough, else the largest free slot, grown); the
    plan is made once per :data:`SLOT_MATCH_RANGES` (how far a slot's size may be
    from the buffer's), once more with every buffer at an offset in one slot per
    device (:func:`_arena`: on the seven zoo models' deeplens plans it reaches the
    live lower bound, 27.3 MB for SSD-512 ResNet-50 where slots took 32.8), and the
    smallest kept. A launch's output takes over the slot of an input read only element
    for element (:attr:`~edgecv.board.plan.Step.elementwise_inputs`) that dies at that launch:
    the output is written in place, as the input's cache lines are still hot, not into
    a fresh slot.
    Concatenations whose inputs can be written straight into their output are elided
    first: each input (a piece) lives in the output's slot at its offset, and that
    slot from the first piece's launch to the last read of the output or a piece,
    where the input's offset is a multiple of its device's ``alignments`` (bytes,
    default :data:`~edgecv.board.plan.PIECE_ALIGNMENT`). A launch's workspaces
    (:attr:`~edgecv.board.plan.Step.workspaces`) live at that launch alone, placed like its
    outputs but never over an input.
    """
    alignments = alignments or PIECE_ALIGNMENT
    pieces = write_pieces_in_place(plan, alignments)
    # the smallest of the plans made with each match range (none first: it wins ties)
    # and the arena's (one slot per device, buffers at offsets)
    plans = [(*assign_slots(plan, r), {}) for r in SLOT_MATCH_RANGES]
    arena = _arena(plan, alignments)
    if all(size <= ARENA_GPU_LIMIT for size, d in zip(*arena[:2], strict=True) if d == "gpu"):
        plans.append(arena)
    sizes, devices, storage, base = min(plans, key=lambda made: sum(made[0]))
    for buf in plan.buffers:
        if buf.id in storage:
            buf.storage = storage[buf.id]
    for buf in plan.buffers:  # pieces: in their owner's slot, at their offset
        if buf.kind == "temp":
            buf.offset, piece = 0, buf
            while piece.piece_of is not None:
                buf.offset += pieces[piece.id]
                piece = plan.buffers[plan.root(piece.piece_of)]
            buf.storage = piece.storage
            buf.offset += base.get(piece.id, 0)
    plan.storage_sizes = sizes
    plan.storage_devices = devices


def _arena(
    plan: Plan, alignments: dict[str, int]
) -> tuple[list[int], list[str], dict[int, int], dict[int, int]]:
    """(slot sizes, slot devices, buffer id -> slot, buffer id -> byte offset): one
    slot per device, every buffer at an offset in it, placed largest first at the
    lowest offset free of the buffers live at the same time (greedy by size). A
    launch's output takes its element-wise input's place as in :func:`assign_slots`
    (the two share a place and their lifetimes join)."""
    first, last = lifetimes(plan)
    group: dict[int, int] = {}  # owner -> the owner whose place it shares
    temps = [b for b in first if plan.buffers[b].kind == "temp"]

    def place_of(b: int) -> int:
        while group.get(b, b) != b:
            b = group[b]
        return b

    for index, step in enumerate(plan.steps):
        if step.elided or step.num_outputs != 1:
            continue
        out = plan.buffers[step.args[-1]]
        if out.kind != "temp" or out.id != plan.owner(out.id) or first.get(out.id) != index:
            continue
        for donor in _elementwise_donors(plan, step, out):
            if (
                donor.id == plan.owner(donor.id)
                and last.get(donor.id) == index
                and _aligned(plan.buffers[place_of(donor.id)].nbytes) >= _aligned(out.nbytes)
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
    for head in sorted(span, key=lambda h: (-plan.buffers[h].nbytes, h)):
        buf = plan.buffers[head]
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
    storage = {b: slots[plan.buffers[b].device] for b in temps}
    offsets = {b: base[place_of(b)] for b in temps}
    return sizes, devices, storage, offsets


def assign_slots(
    plan: Plan, match_range: int | None
) -> tuple[list[int], list[str], dict[int, int]]:
    """(slot sizes, slot devices, buffer id -> slot) of every temp buffer, as
    :func:`plan_memory` describes; a free slot goes to a buffer only within
    ``match_range`` of its size (None: any), else a new slot is made, since a small
    tensor in a large slot pins the whole slot while it lives."""
    _, last_use = lifetimes(plan)
    end = len(plan.steps)
    for buf in plan.buffers:
        if buf.kind == "temp":
            buf.storage = None
    sizes: list[int] = []
    devices: list[str] = []
    free: list[int] = []
    storage: dict[int, int] = {}
    for index, step in enumerate(plan.steps):
        if step.elided:
            continue
        # the buffers this launch makes: its outputs, its workspaces
        outputs = step.args[len(step.args) - step.num_outputs :]
        for arg, output in [(a, True) for a in outputs] + [(w, False) for w in step.workspaces]:
            buf = plan.buffers[plan.owner(arg)]
            if buf.kind != "temp" or buf.id in storage:
                continue
            need = _aligned(buf.nbytes)
            donor = None
            if output and buf.id == arg:
                donor = _donor(plan, step, index, buf, last_use, sizes)
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
            root = plan.buffers[plan.owner(arg)]
            if root.kind == "temp" and last_use.get(root.id, index) <= index:
                if root.storage is not None and root.storage not in free:
                    free.append(root.storage)
                last_use[root.id] = end + 1  # freed once
    return sizes, devices, storage


def _donor(
    plan: Plan, step: Step, index: int, out: Buffer, last_use: dict[int, int], sizes: list[int]
) -> Buffer | None:
    """The input of ``step`` whose slot ``out`` can take over, if any: a temp buffer
    on ``out``'s device, in a slot large enough, read by this launch only through
    element-wise positions, and never read after it."""
    if step.num_outputs != 1:
        return None
    for root in _elementwise_donors(plan, step, out):
        if (
            root.storage is not None
            and last_use.get(root.id) == index
            and sizes[root.storage] >= _aligned(out.nbytes)
        ):
            return root
    return None


def _elementwise_donors(plan: Plan, step: Step, out: Buffer) -> Iterator[Buffer]:
    """The inputs of ``step`` whose bytes its output ``out`` may be written over (if
    they die there): temp buffers on ``out``'s device that the launch reads only at
    element-wise positions (:attr:`~edgecv.board.plan.Step.elementwise_inputs`)."""
    num_inputs = len(step.args) - step.num_outputs
    for position in step.elementwise_inputs:
        root = plan.buffers[plan.root(step.args[position])]
        others = {p for p in range(num_inputs) if plan.root(step.args[p]) == root.id} - set(
            step.elementwise_inputs
        )
        if root.kind == "temp" and root.device == out.device and not others:
            yield root


def written_over(plan: Plan, index: int) -> int | None:
    """The input (root buffer) launch ``index`` writes its output over, if any."""
    step = plan.steps[index]
    output = plan.buffers[step.args[-1]]
    for position in step.elementwise_inputs:
        donor = plan.buffers[plan.root(step.args[position])]
        if donor.kind == "temp" == output.kind and donor.storage is not None:
            pieces = donor.piece_of is not None or output.piece_of is not None
            same = donor.storage == output.storage and donor.offset == output.offset
            if same and donor.id != output.id and not pieces:
                return donor.id
    return None


def lifetimes(plan: Plan) -> tuple[dict[int, int], dict[int, int]]:
    """(first, last): per buffer owning bytes (:meth:`Plan.owner`), the first and the
    last launch that runs and reads or writes it; a graph output lives to the end,
    a workspace at its launch only."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for index, step in enumerate(plan.steps):
        if step.elided:
            continue
        for arg in step.args + step.workspaces:
            root = plan.owner(arg)
            first.setdefault(root, index)
            last[root] = index
    for out in plan.outputs:
        last[plan.owner(out)] = len(plan.steps)
    return first, last


def live_bytes_lower_bound(plan: Plan, device: str | None = None) -> int:
    """The largest total size of intermediate buffers live at one launch (on
    ``device`` only, when given); an input a launch writes its output over counts
    until the launch before."""
    first, last = lifetimes(plan)
    for index in range(len(plan.steps)):
        donor = written_over(plan, index)
        if donor is not None:
            last[donor] = index - 1
    peak = 0
    for index in range(len(plan.steps)):
        live = sum(
            plan.buffers[b].nbytes
            for b in first
            if plan.buffers[b].kind == "temp"
            and first[b] <= index <= last[b]
            and device in (None, plan.buffers[b].device)
        )
        peak = max(peak, live)
    return peak


def _aligned(nbytes: int, alignment: int = 64) -> int:
    return max(alignment, (nbytes + alignment - 1) // alignment * alignment)


def memory_facts(plan: Plan) -> dict[str, int]:
    """What the manifest's ``build`` records of a planned ``plan``: its storage and the
    most of it live at one launch, GPU kernels' device workspaces included
    (:attr:`~edgecv.board.plan.Step.workspaces`); those alone, as they would take unshared;
    the launches writing their output over an input; the concatenations whose inputs
    are written into their output as made (elided)."""
    return {
        "intermediate_bytes": sum(plan.storage_sizes),
        "live_bytes_lower_bound": live_bytes_lower_bound(plan),
        "workspace_bytes": sum(
            plan.buffers[w].nbytes for step in plan.steps for w in step.workspaces
        ),
        "launches_in_place": sum(written_over(plan, i) is not None for i in range(len(plan.steps))),
        "concats_in_place": sum(step.elided for step in plan.steps),
    }
