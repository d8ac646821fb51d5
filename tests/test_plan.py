"""The static plan: extraction from Relax and the liveness-based memory plan."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

from edgecv.lowering import lower
from edgecv.package_format import Buffer, Plan, Step


def live_ranges(plan: Plan) -> dict[int, tuple[int, int]]:
    ranges: dict[int, list[int]] = {}
    for index, step in enumerate(plan.steps):
        for arg in step.args:
            root = plan.root(arg)
            ranges.setdefault(root, [index, index])[1] = index
    for out in plan.outputs:
        ranges[plan.root(out)][1] = len(plan.steps)
    return {k: (a, b) for k, (a, b) in ranges.items()}


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
        assert plan.storage_sizes[b.storage] >= b.nbytes
    for i, a in enumerate(temps):
        for b in temps[i + 1 :]:
            if a.storage == b.storage:
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
    assert sum(plan.storage_sizes) <= 1.3 * plan.live_bytes_lower_bound()
    assert len(lowered.constants) == 1  # the shared weight is stored once
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
    plan.plan_memory()
    assert_no_overlap(plan)
    assert sum(plan.storage_sizes) >= plan.live_bytes_lower_bound()


def test_plan_json_roundtrip():
    plan = lower(chain_module(2)).plan
    again = Plan.from_json(plan.to_json())
    assert again.to_json() == plan.to_json()
