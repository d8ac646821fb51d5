"""Choosing every convolution's layout: exact dynamic programming, or iterated greedy
when the graph's branches make the DP's state space explode.

The cost of a plan is the sum of its convolutions' kernel times in their chosen
layouts plus the time of every layout transform the plan makes Relax insert (one per
edge whose producer's layout differs from what the consumer needs; see
:meth:`~.graph.LayoutGraph.resolve`). Other kernels take the same time in every
layout and are left out of the sum.

The DP walks the nodes in topological order. Its state is the layout of every *live*
node: processed, with a consumer still to come. On a chain one node is live; across a
residual block two (the shortcut and the branch); across a concat every branch: the
state carries every input's layout, as TVM 0.6's graph tuner did, and is exact. When
the number of states at some step passes ``max_states``, the solver starts over with
iterated greedy: from each uniform plan (all plain, all of one packing) and from each
convolution's own best, change one convolution at a time while the total drops.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from .graph import INVALID, LayoutGraph, LayoutNode, convertible, is_packed, plain

# States at one step beyond which the DP gives way to iterated greedy. ResNet-50 needs
# 9, SSD's heads a few hundred; tens of thousands would take seconds in Python.
MAX_STATES = 20_000


class Costs(Protocol):
    """Seconds per call: of a convolution in a layout, of a transform between two."""

    def kernel(self, node: LayoutNode, layout: str) -> float: ...

    def transform(self, shape: tuple[int, ...], src: str, dst: str) -> float: ...


@dataclass(frozen=True)
class Transform:
    """A layout transform a plan inserts: the tensor of ``producer`` (its logical
    ``shape``) converted from ``src`` to ``dst`` for ``consumer``."""

    producer: int
    consumer: int
    shape: tuple[int, ...]
    src: str
    dst: str
    seconds: float


@dataclass
class LayoutPlan:
    """A layout per convolution (node index -> layout) and what it costs.

    ``solver`` is ``"dp"`` or ``"iterated-greedy"``; ``states`` the most DP states at
    one step (the last count before giving up, for greedy).
    """

    layouts: dict[int, str]
    total: float
    solver: str = ""
    states: int = 0
    kernels: dict[int, float] = field(default_factory=dict)
    transforms: list[Transform] = field(default_factory=list)


def evaluate(graph: LayoutGraph, layouts: dict[int, str], costs: Costs) -> LayoutPlan:
    """The cost of ``layouts`` (convolutions missing from it run plain), with every
    kernel time and transform it implies."""
    out: list[str] = []
    plan = LayoutPlan(dict(layouts), 0.0)
    for index, node in enumerate(graph.nodes):
        choice = layouts.get(index, plain(node.rank)) if node.kind == "conv" else ""
        current = [out[i] for i in node.inputs]
        needed, layout = graph.resolve(index, current, choice)
        out.append(layout)
        if layout == INVALID:
            plan.total = float("inf")
        if node.kind == "conv":
            plan.layouts[index] = layout
            plan.kernels[index] = costs.kernel(node, layout)
            plan.total += plan.kernels[index]
        for i, src, dst in zip(node.inputs, current, needed, strict=True):
            if src != dst and graph.nodes[i].kind != "const":
                seconds = _transform_cost(costs, graph.nodes[i].shape, src, dst)
                plan.transforms.append(Transform(i, index, graph.nodes[i].shape, src, dst, seconds))
                plan.total += seconds
    return plan


def solve(graph: LayoutGraph, costs: Costs, max_states: int = MAX_STATES) -> LayoutPlan:
    """The cheapest plan: by the DP when its states stay within ``max_states`` at
    every step, else by iterated greedy (see the module docstring)."""
    layouts, states = _dynamic_programming(graph, costs, max_states)
    if layouts is not None:
        plan = evaluate(graph, layouts, costs)
        plan.solver, plan.states = "dp", states
        return plan
    plan = iterated_greedy(graph, costs)
    plan.states = states
    return plan


def _transform_cost(costs: Costs, shape, src: str, dst: str) -> float:
    return costs.transform(shape, src, dst) if convertible(src, dst) else float("inf")


def _step_cost(graph, costs, index, current, choice) -> tuple[float, str]:
    node = graph.nodes[index]
    needed, layout = graph.resolve(index, current, choice)
    if layout == INVALID:
        return float("inf"), layout
    total = costs.kernel(node, layout) if node.kind == "conv" else 0.0
    for i, src, dst in zip(node.inputs, current, needed, strict=True):
        if src != dst and graph.nodes[i].kind != "const":
            total += _transform_cost(costs, graph.nodes[i].shape, src, dst)
    return total, layout


def _dynamic_programming(
    graph: LayoutGraph, costs: Costs, max_states: int
) -> tuple[dict[int, str] | None, int]:
    users = graph.consumers()
    last_use = [max(u) if u else -1 for u in users]
    live: list[int] = []
    # state (layouts of `live`, in order) -> (cost so far, previous state, choice)
    states: dict[tuple[str, ...], float] = {(): 0.0}
    steps: list[dict[tuple[str, ...], tuple[tuple[str, ...], str]]] = []
    most = 1
    for index, node in enumerate(graph.nodes):
        position = {n: k for k, n in enumerate(live)}
        keep = [k for k, n in enumerate(live) if last_use[n] > index]
        new_live = [live[k] for k in keep] + ([index] if users[index] else [])
        new_states: dict[tuple[str, ...], float] = {}
        back: dict[tuple[str, ...], tuple[tuple[str, ...], str]] = {}
        choices = graph.choices(index)
        for state, so_far in states.items():
            current = [state[position[i]] for i in node.inputs]
            for choice in choices:
                cost, layout = _step_cost(graph, costs, index, current, choice)
                kept = tuple(state[k] for k in keep)
                new = (*kept, layout) if users[index] else kept
                total = so_far + cost
                if total == float("inf"):  # a plan Relax cannot apply
                    continue
                if new not in new_states or total < new_states[new]:
                    new_states[new] = total
                    back[new] = (state, choice)
        if not new_states:  # every plan up to here is inapplicable or has no cost
            raise RuntimeError(f"no layout plan can reach {node.kind} node {node.name}")
        most = max(most, len(new_states))
        if len(new_states) > max_states:
            return None, most
        states, live = new_states, new_live
        steps.append(back)
    # Every node is consumed or an output sink: one final state, the empty tuple.
    state = min(states, key=states.get)
    layouts: dict[int, str] = {}
    for index in range(len(graph.nodes) - 1, -1, -1):
        state, choice = steps[index][state]
        if graph.nodes[index].kind == "conv":
            layouts[index] = choice
    return layouts, most


def uniform_plans(graph: LayoutGraph) -> dict[str, dict[int, str]]:
    """Per layout: every convolution in it where it is a candidate and Relax can apply
    it (:func:`repaired`), in its first candidate (plain, where plain is one) elsewhere."""
    convs = graph.convs()
    names = sorted({c for i in convs for c in graph.choices(i)}, key=lambda c: (len(c), c))
    return {
        name: repaired(
            graph, {i: name if name in graph.choices(i) else graph.choices(i)[0] for i in convs}
        )
        for name in names
    }


def repaired(graph: LayoutGraph, layouts: dict[int, str]) -> dict[int, str]:
    """``layouts`` with the packed convolutions nearest above each node Relax could not
    convert (:data:`~.graph.INVALID`) put back in their first candidate, until none is
    left: an SSD-VGG packed everywhere but before its L2 normalization."""
    layouts = dict(layouts)
    while (bad := first_invalid(graph, layouts)) is not None:
        above = _packed_convs_above(graph, layouts, bad)
        if not above:
            break
        for index in above:
            layouts[index] = graph.choices(index)[0]
    return layouts


def first_invalid(graph: LayoutGraph, layouts: dict[int, str]) -> int | None:
    """The first node (in topological order) whose layout ``layouts`` makes invalid."""
    out: list[str] = []
    for index, node in enumerate(graph.nodes):
        choice = layouts.get(index, plain(node.rank)) if node.kind == "conv" else ""
        _, layout = graph.resolve(index, [out[i] for i in node.inputs], choice)
        if layout == INVALID:
            return index
        out.append(layout)
    return None


def _packed_convs_above(graph: LayoutGraph, layouts: dict[int, str], index: int) -> set[int]:
    found, seen, stack = set(), set(), list(graph.nodes[index].inputs)
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        if graph.nodes[i].kind == "conv":
            if is_packed(layouts.get(i, "")):
                found.add(i)
        else:
            stack.extend(graph.nodes[i].inputs)
    return found


def iterated_greedy(
    graph: LayoutGraph, costs: Costs, starts: Iterable[dict[int, str]] | None = None
) -> LayoutPlan:
    """Local search over single-convolution changes from several starting plans; the
    best local optimum found."""
    convs = graph.convs()
    if starts is None:
        own_best = {
            i: min(graph.choices(i), key=lambda c: costs.kernel(graph.nodes[i], c)) for i in convs
        }
        starts = [*uniform_plans(graph).values(), own_best]
    best: LayoutPlan | None = None
    for start in starts:
        layouts = dict(start)
        total = evaluate(graph, layouts, costs).total
        improved = True
        while improved:
            improved = False
            for i in convs:
                for choice in graph.choices(i):
                    if choice == layouts[i]:
                        continue
                    trial = {**layouts, i: choice}
                    cost = evaluate(graph, trial, costs).total
                    if cost < total - 1e-12:
                        layouts, total, improved = trial, cost, True
        if best is None or total < best.total:
            best = evaluate(graph, layouts, costs)
    assert best is not None
    best.solver = "iterated-greedy"
    return best
