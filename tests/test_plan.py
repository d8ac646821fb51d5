"""The static plan: extraction from Relax and the liveness-based memory plan."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

from edgecv.board.plan import Buffer, Plan, Step
from edgecv.lowering import lower, memory_plan
from edgecv.lowering.memory_plan import SLOT_MATCH_RANGES


def live_ranges(plan: Plan) -> dict[int, tuple[int, int]]:
    """From the launch writing each buffer to the last one reading it (through views);
    a concatenation written in place lives from its first piece's launch, and every
    buffer as long as what it is a piece of is read (it is those bytes); a launch's
    workspaces live at that launch."""
    ranges: dict[int, list[int]] = {}
    for index, step in enumerate(plan.steps):
        for arg in [] if step.elided else step.args + step.workspaces:
            root = plan.root(arg)
            ranges.setdefault(root, [index, index])[1] = index
    end = len(plan.steps)
    for out in plan.outputs:
        ranges.setdefault(plan.root(out), [end, end])[1] = end
    for buf in plan.buffers:  # a piece's range joins what it is a piece of
        piece = buf
        while piece.id in ranges and piece.piece_of is not None:
            whole = ranges.setdefault(plan.root(piece.piece_of), list(ranges[piece.id]))
            whole[0] = min(whole[0], ranges[piece.id][0])
            whole[1] = max(whole[1], ranges[piece.id][1])
            piece = plan.buffers[plan.root(piece.piece_of)]
    return {k: (a, b) for k, (a, b) in ranges.items()}


def piece_within(plan: Plan, a: Buffer, b: Buffer) -> bool:
    """Whether ``a`` is (through nested concatenations) a piece of ``b``, at the bytes
    of ``b`` it should be."""
    while a.piece_of is not None:
        a = plan.buffers[plan.root(a.piece_of)]
        if a.id == b.id:
            return True
    return False


def written_over(plan: Plan, a: int, b: int, index: int) -> bool:
    """Whether launch ``index`` writes its output ``b`` over its input ``a``, read there
    only element for element (and on the same device)."""
    step = plan.steps[index]
    roots = [plan.root(arg) for arg in step.args[: len(step.args) - step.num_outputs]]
    return (
        step.args[-1] == b
        and step.num_outputs == 1
        and a in roots
        and all(p in step.elementwise_inputs for p, r in enumerate(roots) if r == a)
        and plan.buffers[a].device == plan.buffers[b].device
    )


def assert_no_overlap(plan: Plan) -> None:
    ranges = live_ranges(plan)
    temps = [b for b in plan.buffers if b.kind == "temp" and b.id in ranges]
    for b in temps:
        assert plan.storage_sizes[b.storage] >= b.offset + b.nbytes
    for i, a in enumerate(temps):
        for b in temps[i + 1 :]:
            apart = a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset
            if a.storage == b.storage and not apart:
                if piece_within(plan, a, b) or piece_within(plan, b, a):
                    continue
                (s1, e1), (s2, e2) = ranges[a.id], ranges[b.id]
                handed_over = e1 == s2 and written_over(plan, a.id, b.id, s2)
                assert e1 < s2 or e2 < s1 or handed_over, (
                    f"buffers {a.id} and {b.id} share a slot while both live"
                )


def chain_module(n: int) -> relax.Function:
    bb = relax.BlockBuilder()
    x = relax.Var("data", relax.TensorType((1, 8, 16, 16), "float32"))
    w = relax.const(np.ones((8, 8, 3, 3), np.float32))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for _ in range(n):
                y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(y, w, padding=1)))
            flat = bb.emit(relax.op.reshape(y, (1, -1)))
            gv = bb.emit_output(relax.Tuple([flat, y]))
        bb.emit_func_output(gv)
    return bb.get()


def test_chain_reuses_two_slots_and_views_reshape():
    lowered = lower(chain_module(6))
    plan = lowered.plan
    assert len(plan.steps) == 6  # conv+relu fused per layer; the reshape became a view
    assert plan.buffers[plan.outputs[0]].kind == "view"
    assert plan.root(plan.outputs[0]) == plan.root(plan.outputs[1])
    assert len(plan.storage_sizes) == 2  # ping-pong
    assert sum(plan.storage_sizes) <= 1.3 * memory_plan.live_bytes_lower_bound(plan)
    assert len(lowered.constants) == 1  # the shared weight is stored once
    assert_no_overlap(plan)


def test_a_small_tensor_does_not_pin_a_large_slot_another_large_one_needs():
    """x -> big1 -> s1 -> small -> big2, small read again with big2: given big1's freed
    slot, small would keep it and big2 would need a slot of its own (2 MB); the plan
    keeps small apart and big2 takes big1's slot (1 MB and two small slots)."""
    mb, kb = 1 << 20, 1 << 12
    buffers = [
        Buffer(0, (1,), "float32", "input", "x"),
        Buffer(1, (mb // 4,), "float32", "temp"),  # big1 = a(x)
        Buffer(2, (kb // 4,), "float32", "temp"),  # s1 = b(big1): big1 dies
        Buffer(3, (kb // 4,), "float32", "temp"),  # small = c(s1)
        Buffer(4, (mb // 4,), "float32", "temp"),  # big2 = d(small)
        Buffer(5, (kb // 4,), "float32", "temp"),  # out = e(big2, small)
    ]
    steps = [
        Step("a", [0, 1]),
        Step("b", [1, 2]),
        Step("c", [2, 3]),
        Step("d", [3, 4]),
        Step("e", [4, 3, 5]),
    ]
    plan = Plan(buffers, steps, inputs=[0], outputs=[5])
    memory_plan.plan_memory(plan)
    assert sum(plan.storage_sizes) <= mb + 3 * kb, plan.storage_sizes
    assert plan.buffers[1].storage == plan.buffers[4].storage
    assert_no_overlap(plan)


def test_buffers_at_offsets_reach_the_live_lower_bound_where_slots_cannot():
    """a (128 KB, dead at once), then b (64 KB) takes a's freed slot and lives on with c
    (128 KB), which finds no free slot: slots need 256 KB. At offsets in one slot, c goes
    where a was and b beside it: 192 KB, the most live at one launch."""
    kb = 1024 // 4
    buffers = [
        Buffer(0, (1,), "float32", "input", "x"),
        Buffer(1, (128 * kb,), "float32", "temp"),  # a = p(x), read by nothing
        Buffer(2, (64 * kb,), "float32", "temp"),  # b = q(x)
        Buffer(3, (128 * kb,), "float32", "temp"),  # c = r(b)
    ]
    steps = [Step("p", [0, 1]), Step("q", [0, 2]), Step("r", [2, 3])]
    plan = Plan(buffers, steps, inputs=[0], outputs=[3])
    assert min(sum(memory_plan.assign_slots(plan, r)[0]) for r in SLOT_MATCH_RANGES) == 256 * 1024
    memory_plan.plan_memory(plan)
    assert plan.storage_sizes == [192 * 1024] == [memory_plan.live_bytes_lower_bound(plan)]
    assert (plan.buffers[3].offset, plan.buffers[2].offset) == (0, 128 * 1024)
    assert_no_overlap(plan)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_random_plans_never_share_live_storage(data):
    n_steps = data.draw(st.integers(1, 12))
    buffers = [Buffer(0, (4,), "float32", "input", "x")]
    steps = []
    for _ in range(n_steps):
        n_in = data.draw(st.integers(1, 3))
        ins = [data.draw(st.integers(0, len(buffers) - 1)) for _ in range(n_in)]
        size = data.draw(st.integers(1, 64))
        out = Buffer(len(buffers), (size,), "float32", "temp")
        buffers.append(out)
        elementwise = data.draw(st.lists(st.integers(0, n_in - 1), unique=True))
        steps.append(Step("k", ins + [out.id], elementwise_inputs=elementwise))
    outputs = [buffers[-1].id]
    plan = Plan(buffers, steps, [0], outputs)
    memory_plan.plan_memory(plan)
    assert_no_overlap(plan)
    assert sum(plan.storage_sizes) >= memory_plan.live_bytes_lower_bound(plan)


def run_plan(plan: Plan, x: np.ndarray, planned: bool) -> list[np.ndarray]:
    """Execute a plan of made-up kernels: a ``k`` launch writes ``index + sum of its
    inputs`` (each input repeated to the output's length: element-wise where sizes
    match), a launch with ``pieces`` the concatenation of its inputs. ``planned``: in
    the planned slots (elided launches skipped), else each buffer on its own. A launch
    scribbles over its workspaces before reading its inputs and after writing its
    output, as a kernel using them as scratch may: bytes shared with a live tensor
    change the result."""
    slots = [np.full(size // 4, np.nan, np.float32) for size in plan.storage_sizes]

    def scribble(step: Step, value: int) -> None:
        for w in step.workspaces if planned else []:
            buf = plan.buffers[w]
            slots[buf.storage].view(np.uint8)[buf.offset : buf.offset + buf.nbytes] = value

    own: dict[int, np.ndarray] = {}

    def array(buffer_id: int) -> np.ndarray:
        buf = plan.buffers[plan.root(buffer_id)]
        if buf.kind == "input":
            return x
        if not planned:
            return own.setdefault(buf.id, np.full(buf.shape, np.nan, np.float32))
        start = buf.offset // 4
        return slots[buf.storage][start : start + buf.shape[0]]

    for index, step in enumerate(plan.steps):
        if planned and step.elided:
            continue
        scribble(step, 0xFF)  # a NaN pattern
        *inputs, out = [array(a).copy() for a in step.args]
        if step.pieces:
            value = np.concatenate(inputs)
        else:
            value = index + sum(np.resize(i, out.shape) for i in inputs)
        array(step.args[-1])[:] = value
        scribble(step, 0x7F)
    return [array(o).copy() for o in plan.outputs]


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_random_plans_with_concats_compute_what_they_compute_unplanned(data):
    """Kernels, element-wise inputs, views and concatenations of earlier buffers
    (nested ones, repeated or viewed inputs, unaligned offsets, launches on two devices)
    planned, then run in their slots: the outputs are those of running without sharing."""
    buffers = [Buffer(0, (16,), "float32", "input", "x")]
    steps = []
    for _ in range(data.draw(st.integers(1, 12))):
        device = data.draw(st.sampled_from(["cpu", "cpu", "gpu"]))
        if len(buffers) > 1 and data.draw(st.integers(0, 4)) == 0:  # a reshape: a view
            source = buffers[data.draw(st.integers(1, len(buffers) - 1))]
            buffers.append(
                Buffer(
                    len(buffers),
                    source.shape,
                    "float32",
                    "view",
                    view_of=source.id,
                    device=source.device,
                )
            )
        if len(buffers) > 2 and data.draw(st.booleans()):
            ins = data.draw(st.lists(st.integers(1, len(buffers) - 1), min_size=2, max_size=3))
            sizes = [buffers[i].shape[0] for i in ins]
            out = Buffer(len(buffers), (sum(sizes),), "float32", "temp", device=device)
            pieces = [4 * sum(sizes[:k]) for k in range(len(ins))]
            steps.append(Step("concat", ins + [out.id], device=device, pieces=pieces))
        else:
            n_in = data.draw(st.integers(1, 3))
            ins = [data.draw(st.integers(0, len(buffers) - 1)) for _ in range(n_in)]
            size = data.draw(st.sampled_from([16, 32, 48, 5]))  # 5 floats: unaligned
            out = Buffer(len(buffers), (size,), "float32", "temp", device=device)
            same = [p for p in range(n_in) if buffers[ins[p]].shape == (size,)]
            elementwise = data.draw(st.lists(st.sampled_from(same), unique=True)) if same else []
            steps.append(Step("k", ins + [out.id], device=device, elementwise_inputs=elementwise))
        buffers.append(out)
    outputs = sorted({buffers[-1].id, data.draw(st.integers(1, len(buffers) - 1))})
    for step in steps:  # device workspaces (a few bytes to past an alignment), after the rest
        for nbytes in data.draw(st.lists(st.sampled_from([4, 64, 200, 1028]), max_size=2)):
            buffers.append(Buffer(len(buffers), (nbytes,), "uint8", "temp", device=step.device))
            step.workspaces.append(buffers[-1].id)
    plan = Plan(buffers, steps, [0], outputs)
    memory_plan.plan_memory(plan)
    assert_no_overlap(plan)
    x = np.arange(16, dtype=np.float32)
    for got, want in zip(run_plan(plan, x, True), run_plan(plan, x, False), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_concat_of_a_concat_places_each_piece_at_its_summed_offset():
    """``outer = concat(a, inner)``, ``inner = concat(b, c)``: c lands 16 + 32 floats
    into outer's slot; both concatenations are elided."""
    buffers = [Buffer(0, (16,), "float32", "input", "x")]
    buffers += [Buffer(i, (n,), "float32", "temp") for i, n in ((1, 16), (2, 32), (3, 16))]
    buffers += [Buffer(4, (48,), "float32", "temp"), Buffer(5, (64,), "float32", "temp")]
    steps = [
        Step("k", [0, 1]),
        Step("k", [0, 2]),
        Step("k", [0, 3]),
        Step("concat", [2, 3, 4], pieces=[0, 128]),
        Step("concat", [1, 4, 5], pieces=[0, 64]),
    ]
    plan = Plan(buffers, steps, [0], [5])
    memory_plan.plan_memory(plan)
    assert [s.elided for s in plan.steps] == [False, False, False, True, True]
    assert [plan.buffers[i].offset for i in (1, 2, 3, 4, 5)] == [0, 64, 192, 64, 0]
    assert len({plan.buffers[i].storage for i in (1, 2, 3, 4, 5)}) == 1
    x = np.arange(16, dtype=np.float32)
    np.testing.assert_array_equal(run_plan(plan, x, True)[0], run_plan(plan, x, False)[0])


def test_a_plan_written_and_read_back_runs_the_same_launches_to_the_same_result():
    """What a package relies on: plan.json read back holds the same steps and buffers,
    and the executor running it computes what the plan computed before writing, which
    is the model's answer (NumPy's conv + ReLU chain)."""
    import tvm

    from edgecv.board.runtime.cpu import CPUBackend
    from edgecv.board.runtime.executor import Executor
    from edgecv.codegen.llvm import build_cpu

    lowered = lower(chain_module(2))
    again = Plan.from_json(lowered.plan.to_json())
    assert again.steps == lowered.plan.steps and again.buffers == lowered.plan.buffers
    assert (again.inputs, again.outputs) == (lowered.plan.inputs, lowered.plan.outputs)
    assert again.storage_sizes == lowered.plan.storage_sizes
    backend = CPUBackend(build_cpu(lowered.kernels, tvm.target.Target({"kind": "llvm"})))
    x = np.random.RandomState(0).rand(1, 8, 16, 16).astype(np.float32)
    before = Executor(lowered.plan, backend, lowered.constants).run([x])
    after = Executor(again, backend, lowered.constants).run([x])
    expected = x
    for _ in range(2):  # 3x3 convolutions of all-ones weights, padding 1, then ReLU
        padded = np.pad(expected, ((0, 0), (0, 0), (1, 1), (1, 1)))
        window = sum(padded[:, :, i : i + 16, j : j + 16] for i in range(3) for j in range(3))
        expected = np.maximum(np.repeat(window.sum(axis=1, keepdims=True), 8, axis=1), 0)
    for got, want in zip(after, before, strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(after[1], expected, rtol=1e-5)
    np.testing.assert_allclose(after[0], expected.reshape(1, -1), rtol=1e-5)


def test_an_arena_past_a_gpu_allocation_limit_is_not_chosen():
    """Two 80 MB tensors live together on the GPU: one 160 MB arena would pass the
    128 MB a single OpenCL allocation is promised; the plan takes two slots."""
    mb = (1 << 20) // 4
    buffers = [
        Buffer(0, (1,), "float32", "input", "x", device="gpu"),
        Buffer(1, (80 * mb,), "float32", "temp", device="gpu"),
        Buffer(2, (80 * mb,), "float32", "temp", device="gpu"),
        Buffer(3, (1,), "float32", "temp", device="gpu"),
    ]
    steps = [Step("p", [0, 1], device="gpu"), Step("q", [0, 2], device="gpu")]
    steps.append(Step("r", [1, 2, 3], device="gpu"))
    plan = Plan(buffers, steps, inputs=[0], outputs=[3])
    memory_plan.plan_memory(plan)
    assert sorted(plan.storage_sizes)[-2:] == [80 << 20, 80 << 20]
    assert_no_overlap(plan)


def workspace_plan() -> Plan:
    """On the GPU: a = p(x) (256 KB, read once), b = q(a) (4 KB), c = r(b) with a 256 KB
    device workspace (added from the launches' sizes, as the build does): a is dead at
    r, so the workspace can take its bytes."""
    kb = 1024
    buffers = [
        Buffer(0, (1,), "float32", "input", "x", device="gpu"),
        Buffer(1, (64 * kb,), "float32", "temp", device="gpu"),  # a
        Buffer(2, (kb,), "float32", "temp", device="gpu"),  # b
        Buffer(3, (kb,), "float32", "temp", device="gpu"),  # c
    ]
    steps = [Step(k, args, device="gpu") for k, args in (("p", [0, 1]), ("q", [1, 2]))]
    steps.append(Step("r", [2, 3], device="gpu"))
    plan = Plan(buffers, steps, inputs=[0], outputs=[3])
    assert memory_plan.add_workspaces(plan, {"r": [256 * kb], "q": []}) == [4]
    return plan


def test_a_workspace_is_a_temp_of_its_launch_sharing_the_bytes_of_a_dead_tensor():
    plan = workspace_plan()
    workspace = plan.buffers[4]
    assert plan.steps[2].workspaces == [4] and plan.steps[0].workspaces == []
    assert (workspace.kind, workspace.dtype, workspace.shape) == ("temp", "uint8", (256 << 10,))
    assert workspace.device == "gpu"
    first, last = memory_plan.lifetimes(plan)
    assert first[4] == last[4] == 2  # live at its launch alone
    memory_plan.plan_memory(plan)
    assert workspace.storage is not None
    assert_no_overlap(plan)
    a = plan.buffers[1]
    shared = a.storage == workspace.storage and a.offset < workspace.offset + workspace.nbytes
    assert shared and workspace.offset < a.offset + a.nbytes  # in a's bytes: a is dead there
    # at r: b, c and the workspace live; at q: a and b. The plan is that peak, where the
    # workspace on its own (as the runtime allocated it before) would add 256 KB
    peak = (256 + 4 + 4) << 10
    assert (
        memory_plan.live_bytes_lower_bound(plan)
        == memory_plan.live_bytes_lower_bound(plan, "gpu")
        == peak
    )
    assert sum(plan.storage_sizes) == peak
    assert memory_plan.live_bytes_lower_bound(plan, "cpu") == 0
    for match_range in SLOT_MATCH_RANGES:  # the slot plans too give it a slot of a's
        sizes, _, storage = memory_plan.assign_slots(plan, match_range)
        assert 4 in storage and sizes[storage[4]] >= 256 << 10
        assert len(sizes) == 3 or storage[4] == storage[1]


def test_a_workspace_is_never_an_output_donor_or_piece():
    """A launch whose input dies there writes its output over it; its workspace takes
    other bytes. A concatenation's launch that is elided gets no workspaces, and a
    concatenation of a workspace-using kernel's output still writes it in place."""
    buffers = [Buffer(0, (16,), "float32", "input", "x", device="gpu")]
    buffers += [Buffer(i, (n,), "float32", "temp", device="gpu") for i, n in ((1, 16), (2, 16))]
    buffers += [Buffer(i, (128,), "float32", "temp", device="gpu") for i in (3, 4)]
    buffers.append(Buffer(5, (256,), "float32", "temp", device="gpu"))
    steps = [
        Step("k", [0, 1], device="gpu"),
        Step("add", [1, 2], device="gpu", elementwise_inputs=[0]),  # 2 over 1
        Step("k", [0, 3], device="gpu"),
        Step("k", [0, 4], device="gpu"),
        Step("concat", [3, 4, 5], device="gpu", pieces=[0, 512]),  # GPU-aligned pieces
    ]
    plan = Plan(buffers, steps, [0], [2, 5])
    added = memory_plan.add_workspaces(plan, {"add": [64], "k": [128], "concat": [1024]})
    assert [s.workspaces for s in plan.steps] == [[6], [7], [8], [9], []]
    assert added == [6, 7, 8, 9]
    memory_plan.plan_memory(plan)
    assert plan.steps[4].elided and plan.buffers[3].piece_of == 5
    assert memory_plan.written_over(plan, 1) == 1  # the output took the dying input's bytes
    for w in added:
        assert plan.buffers[w].piece_of is None
        assert all(w not in (memory_plan.written_over(plan, i),) for i in range(len(plan.steps)))
    assert_no_overlap(plan)
    again = memory_plan.add_workspaces(plan, {"add": [64]})  # launches that have theirs keep them
    assert again == [] and plan.steps[1].workspaces == [7]


def test_workspaces_go_only_to_gpu_kernel_launches():
    buffers = [Buffer(0, (4,), "float32", "input", "x")]
    buffers.append(Buffer(1, (4,), "float32", "temp"))
    buffers += [Buffer(i, (4,), "float32", "temp", device="gpu") for i in (2, 3)]
    steps = [
        Step("k", [0, 1]),  # on the CPU: TVM's runtime gives its kernels scratch memory
        Step("copy", [1, 2], device="gpu", kind="copy"),
        Step("k", [2, 3], device="gpu"),
    ]
    plan = Plan(buffers, steps, [0], [3])
    assert memory_plan.add_workspaces(plan, {"k": [8], "copy": [8]}) == [4]
    assert [s.workspaces for s in plan.steps] == [[], [], [4]]


def test_workspaces_survive_a_json_round_trip_and_an_old_plan_loads_without_them():
    import json

    plan = workspace_plan()
    memory_plan.plan_memory(plan)
    again = Plan.from_json(plan.to_json())
    assert again.steps == plan.steps and again.buffers == plan.buffers
    assert again.storage_sizes == plan.storage_sizes
    assert again.steps[2].workspaces == [4]
    assert memory_plan.live_bytes_lower_bound(again) == memory_plan.live_bytes_lower_bound(plan)
    raw = json.loads(plan.to_json())
    # launches without workspaces are written as before (earlier runtimes read them)
    assert ["workspaces" in s for s in raw["steps"]] == [False, False, True]
    del raw["steps"][2]["workspaces"]  # a plan written before workspaces were planned
    old = Plan.from_json(json.dumps(raw))
    assert [s.workspaces for s in old.steps] == [[], [], []]


def test_a_plan_whose_workspaces_are_not_its_launchs_temps_is_refused():
    import json

    import pytest

    from edgecv.board.plan import FormatError

    plan = workspace_plan()
    memory_plan.plan_memory(plan)
    good = json.loads(plan.to_json())
    cases = {
        "an input": ([0], "workspace 0"),
        "a launch argument": ([3], "workspace 3"),
        "no buffer": ([9], "workspaces"),
        "not a list": (4, "workspaces"),
    }
    for workspaces, field in cases.values():  # keyed by what each is
        raw = json.loads(json.dumps(good))
        raw["steps"][2]["workspaces"] = workspaces
        with pytest.raises(FormatError, match=f"step 2: {field}"):
            Plan.from_json(json.dumps(raw))
    raw = json.loads(json.dumps(good))
    raw["steps"][1]["workspaces"] = [4]  # one workspace of two launches
    with pytest.raises(FormatError, match="step 2: workspace 4 should be a buffer of this"):
        Plan.from_json(json.dumps(raw))
    raw = json.loads(json.dumps(good))
    raw["steps"][2]["device"] = "cpu"  # its launch on another device than it
    with pytest.raises(FormatError, match="step 2: workspace 4 should be a temp buffer on the cpu"):
        Plan.from_json(json.dumps(raw))


def test_the_runtime_refuses_plan_workspaces_its_launches_do_not_fit():
    import pytest

    from edgecv.board.errors import PackageError
    from edgecv.board.runtime.backend import planned_workspaces
    from edgecv.board.runtime.opencl import CLTensor

    views = [CLTensor(None, (n,), "uint8") for n in (64, 128)]  # views of plan storage
    assert planned_workspaces("k", views, [64, 100]) == views
    for sizes in ([64], [64, 200], [64, 100, 4]):
        with pytest.raises(PackageError, match="different builds"):
            planned_workspaces("k", views, sizes)
