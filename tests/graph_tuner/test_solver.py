"""The layout solver against brute force on small random graphs with synthetic costs."""

from __future__ import annotations

import itertools
import random

import pytest

from edgecv.graph_tuner.graph import LayoutGraph, LayoutNode
from edgecv.graph_tuner.solver import evaluate, iterated_greedy, solve

LAYOUTS = ("NCHW", "NCHW8c", "NCHW16c")


class TableCosts:
    """Random but fixed kernel times per (convolution, layout) and per transform."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.kernels: dict[tuple[str, str], float] = {}
        self.transforms: dict[tuple, float] = {}

    def kernel(self, node: LayoutNode, layout: str) -> float:
        key = (node.name, layout)
        if key not in self.kernels:
            self.kernels[key] = self.rng.uniform(1.0, 10.0)
        return self.kernels[key]

    def transform(self, shape, src, dst) -> float:
        key = (shape, src, dst)
        if key not in self.transforms:
            self.transforms[key] = self.rng.uniform(0.1, 4.0)
        return self.transforms[key]


def _conv(g: LayoutGraph, name: str, source: int, channels: int, rng, weights=True) -> int:
    cands = tuple(lay for lay in LAYOUTS if channels % max(1, int(lay[4:-1] or 1)) == 0)
    inputs = (source, g.add(LayoutNode(f"{name}.w", "const", shape=(channels, 1, 1, 1))))
    shape = (1, channels, 8, 8)
    if rng.random() < 0.3:  # a conv without the plain candidate (a model where all pack)
        cands = cands[1:] or cands
    return g.add(LayoutNode(name, "conv", inputs if weights else (source,), shape, cands, "conv2d"))


def _follow(g: LayoutGraph, name: str, source: int) -> int:
    return g.add(LayoutNode(name, "follow", (source,), g.nodes[source].shape, op="relu"))


def random_graph(seed: int, kind: str) -> LayoutGraph:
    """A chain, a chain of residual diamonds, or concatenations of branches."""
    rng = random.Random(seed)
    g = LayoutGraph()
    x = g.add(LayoutNode("data", "input", shape=(1, 3, 8, 8)))
    x = _conv(g, "stem", x, 16, rng)
    for k in range(rng.randint(2, 3)):
        if kind == "chain":
            x = _follow(g, f"r{k}", _conv(g, f"c{k}", x, rng.choice([8, 12, 16, 32]), rng))
        elif kind == "diamond":
            channels = g.nodes[x].shape[1]
            branch = _conv(g, f"b{k}a", x, rng.choice([8, 16]), rng)
            branch = _conv(g, f"b{k}b", _follow(g, f"r{k}", branch), channels, rng)
            args = (branch, x) if rng.random() < 0.5 else (x, branch)
            x = g.add(LayoutNode(f"add{k}", "binary", args, g.nodes[x].shape, op="add"))
        else:  # concat of 2-3 branches, some with odd channel counts
            branches = [
                _conv(g, f"b{k}{j}", x, rng.choice([4, 8, 12, 16]), rng)
                for j in range(rng.randint(2, 3))
            ]
            channels = sum(g.nodes[b].shape[1] for b in branches)
            x = g.add(LayoutNode(f"cat{k}", "concat", tuple(branches), (1, channels, 8, 8)))
    g.add(LayoutNode("flatten", "fixed", (x,), (1, g.nodes[x].shape[1] * 64), op="reshape"))
    return g


def brute_force(g: LayoutGraph, costs) -> float:
    convs = g.convs()
    return min(
        evaluate(g, dict(zip(convs, combo, strict=True)), costs).total
        for combo in itertools.product(*(g.choices(i) for i in convs))
    )


@pytest.mark.parametrize("kind", ["chain", "diamond", "concat"])
@pytest.mark.parametrize("seed", range(12))
def test_dp_matches_brute_force(kind, seed):
    g = random_graph(seed, kind)
    costs = TableCosts(seed)
    plan = solve(g, costs)
    assert plan.solver == "dp"
    assert plan.total == pytest.approx(brute_force(g, costs), rel=1e-12)
    # The plan's own total is what evaluating its layouts gives.
    assert evaluate(g, plan.layouts, costs).total == pytest.approx(plan.total, rel=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_greedy_when_states_explode(seed):
    g = random_graph(seed, "concat")
    costs = TableCosts(seed)
    plan = solve(g, costs, max_states=1)
    assert plan.solver == "iterated-greedy"
    best = brute_force(g, costs)
    assert plan.total >= best - 1e-9
    assert plan.total <= min(evaluate(g, s, costs).total for s in _uniform(g)) + 1e-9


def _uniform(g):
    from edgecv.graph_tuner.solver import uniform_plans

    return uniform_plans(g).values()


class FixedCosts:
    def __init__(self, kernels, transform):
        self.kernels, self.seconds = kernels, transform

    def kernel(self, node, layout):
        return self.kernels[node.name][layout]

    def transform(self, shape, src, dst):
        return self.seconds


def _two_convs() -> LayoutGraph:
    g = LayoutGraph()
    x = g.add(LayoutNode("data", "input", shape=(1, 3, 8, 8)))
    a = g.add(LayoutNode("a", "conv", (x,), (1, 8, 8, 8), ("NCHW", "NCHW8c")))
    b = g.add(LayoutNode("b", "conv", (a,), (1, 8, 8, 8), ("NCHW", "NCHW8c")))
    g.add(LayoutNode("out", "fixed", (b,), (1, 8, 8, 8)))
    return g


def test_evaluate_by_hand():
    """a packed, b plain: a's output goes 8c -> NCHW once; b's output is plain already;
    a's input (3 channels) stays plain: 2 + 5 + one transform of 1."""
    g = _two_convs()
    costs = FixedCosts({"a": {"NCHW": 4, "NCHW8c": 2}, "b": {"NCHW": 5, "NCHW8c": 1}}, 1.0)
    plan = evaluate(g, {1: "NCHW8c", 2: "NCHW"}, costs)
    assert plan.total == 8.0
    assert [(t.producer, t.consumer, t.src, t.dst) for t in plan.transforms] == [
        (1, 2, "NCHW8c", "NCHW")
    ]
    # Both packed: the transform moves to the output: 2 + 1 + 1.
    assert solve(g, costs).layouts == {1: "NCHW8c", 2: "NCHW8c"}
    assert solve(g, costs).total == 4.0


def test_transform_cost_decides():
    """Packing b alone saves 1 but costs two transforms of 3: all plain wins."""
    g = _two_convs()
    costs = FixedCosts({"a": {"NCHW": 4, "NCHW8c": 4.5}, "b": {"NCHW": 5, "NCHW8c": 4}}, 3.0)
    plan = solve(g, costs)
    assert plan.layouts == {1: "NCHW", 2: "NCHW"} and plan.total == 9.0
    assert iterated_greedy(g, costs).total == 9.0
