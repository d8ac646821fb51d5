"""Costs the graph tuner predicts for what its budget left unmeasured
(edgecv/graph_tuner/predict.py), on made-up measurements with a known answer."""

from __future__ import annotations

import math

import pytest

from edgecv.graph_tuner.predict import (
    FALLBACK_BANDWIDTH,
    ConvWork,
    predict_convs,
    predict_transforms,
)

PLAIN, PACKED = "NCHW", "NCHW8c"


def test_a_candidate_follows_its_measured_sibling_by_the_ratio_seen_on_its_kind():
    # packed runs at half the plain time on 3x3 convolutions, the same on 1x1 ones
    work = {
        "a": ConvWork("kxk", 100),
        "b": ConvWork("kxk", 300),
        "c": ConvWork("kxk", 50),
        "d": ConvWork("1x1", 80),
        "e": ConvWork("1x1", 10),
    }
    convs = [(n, layout, "direct", f"{n}-{layout}") for n in work for layout in (PLAIN, PACKED)]
    times = {"a-NCHW": 1.0, "a-NCHW8c": 0.5, "b-NCHW": 3.0, "b-NCHW8c": 1.5, "c-NCHW": 0.7}
    times.update({"d-NCHW": 2.0, "d-NCHW8c": 2.0, "e-NCHW": 0.4})
    predicted = predict_convs(convs, times, work)
    assert set(predicted) == {"c-NCHW8c", "e-NCHW8c"}
    assert predicted["c-NCHW8c"] == pytest.approx(0.35)  # 0.7 x 0.5
    assert predicted["e-NCHW8c"] == pytest.approx(0.4)  # 0.4 x 1.0


def test_a_convolution_with_nothing_measured_takes_the_rate_of_its_kind():
    work = {"a": ConvWork("kxk", 100), "b": ConvWork("kxk", 400), "d": ConvWork("1x1", 100)}
    convs = [(n, PLAIN, "direct", n) for n in work]
    times = {"a": 1.0, "d": 4.0}  # 3x3 at 100 MACs/s, 1x1 at 25
    assert predict_convs(convs, times, work) == {"b": pytest.approx(4.0)}
    only_1x1 = {"d": 4.0}
    assert predict_convs(convs, only_1x1, work)["b"] == pytest.approx(16.0)  # any kind's rate
    assert predict_convs(convs, {}, work)["a"] == math.inf  # nothing to go by


def test_a_transform_takes_the_bandwidth_of_its_direction():
    transforms = {
        ((1, 8, 10, 10), PLAIN, PACKED): "p1",
        ((1, 8, 20, 20), PLAIN, PACKED): "p2",
        ((1, 8, 10, 10), PACKED, PLAIN): "u1",
        ((1, 8, 20, 20), PACKED, PLAIN): "u2",
    }
    times = {"p1": 3200 / 1e9, "u1": 3200 / 2e9}  # 3200 bytes at 1 and 2 GB/s
    predicted = predict_transforms(transforms, times)
    assert predicted == {"p2": pytest.approx(12800 / 1e9), "u2": pytest.approx(12800 / 2e9)}
    assert predict_transforms(transforms, {})["p1"] == pytest.approx(3200 / FALLBACK_BANDWIDTH)


def test_convolutions_are_measured_taking_turns_by_kind_most_work_first():
    """The budget's batches take the convolutions' candidate groups by kind in turn, so
    the first ones measured give a ratio for every kind (measure._batches)."""
    from edgecv.graph_tuner.measure import _batches

    work = {
        "big3x3": ConvWork("kxk", 900),
        "small3x3": ConvWork("kxk", 300),
        "mid3x3": ConvWork("kxk", 600),
        "big1x1": ConvWork("1x1", 500),
        "small1x1": ConvWork("1x1", 100),
        "dw": ConvWork("depthwise", 50),
    }
    convs = [(n, layout, "direct", f"{n}:{layout}") for n in work for layout in (PLAIN, PACKED)]
    convs.append(("big3x3", PACKED, "winograd4", "big3x3:w4"))
    shapes = {"t1": ((1, 8, 4, 4), PLAIN, PACKED), "t2": ((1, 8, 8, 8), PACKED, PLAIN)}
    missing = [key for *_, key in convs if key != "mid3x3:NCHW"] + list(shapes)
    groups, transforms = _batches(missing, convs, work, shapes)
    assert [g[0].split(":")[0] for g in groups] == [
        "big3x3",
        "big1x1",
        "dw",
        "mid3x3",
        "small1x1",
        "small3x3",
    ]
    assert groups[0] == ["big3x3:NCHW", "big3x3:NCHW8c", "big3x3:w4"]  # a conv's together
    assert groups[3] == ["mid3x3:NCHW8c"]  # only what is missing
    assert transforms == ["t2", "t1"]  # the largest first


def test_a_budget_is_not_overrun_by_kernels_slower_than_the_first_batch(monkeypatch):
    """Batches are sized at twice the rate seen so far, and none is started that would
    end well past the budget: kernels 1.5 s each in the first batch and 3 s after it
    (SqueezeNet's on Intel's runtime) spend a 90 s budget by at most a batch's margin,
    where sizing at the rate seen took 162 s (measure._measure_within)."""
    from edgecv.graph_tuner import measure

    clock = [0.0]
    monkeypatch.setattr(measure.time, "perf_counter", lambda: clock[0])

    class SlowingMeter:
        costs_key = "made-up"
        timed = 0

        def time(self, kernels, progress):
            for _ in kernels:
                clock[0] += 1.5 if self.timed < measure.FIRST_BATCH else 3.0
                self.timed += 1
            return dict.fromkeys(kernels, 1e-3)

    groups = [[f"k{i}"] for i in range(200)]
    wanted = {f"k{i}": object() for i in range(200)}  # stands for a kernel to build
    meter = SlowingMeter()
    measured = measure._measure_within((groups, []), wanted, {}, meter, lambda m: None, 90.0)
    assert measure.FIRST_BATCH < len(measured) < 200
    assert clock[0] <= 90.0 * 1.25, clock[0]
    # the sizing alone: what is left at twice the rate so far, nothing when too little
    assert measure._next_size(24.0, 16, 90.0) == 22  # 66 s left at 3 s a kernel
    assert measure._next_size(85.0, 38, 90.0) == 0  # 5 s: not even 8 at 2.2 s a kernel
    assert measure._next_size(95.0, 40, 90.0) == 0
    assert measure._next_size(1.0, 16, 90.0) == measure.LARGEST_BATCH


def test_the_convolutions_a_plan_is_in_doubt_about_are_measured_first():
    """After a batch the plan is solved on measured and predicted costs; the groups whose
    unmeasured candidate the plan chose, or one within DOUBT_MARGIN of its choice, go
    first, the most time at stake first; a convolution whose unmeasured candidate is
    predicted far slower goes last (measure._in_doubt_first)."""
    from edgecv.graph_tuner.graph import LayoutGraph, LayoutNode
    from edgecv.graph_tuner.measure import _in_doubt_first

    g = LayoutGraph()
    x = g.add(LayoutNode("data", "input", shape=(1, 3, 8, 8)))
    for name in ("a", "b", "c", "e", "f"):
        x = g.add(LayoutNode(name, "conv", (x,), (1, 8, 8, 8), (PLAIN, PACKED)))
    g.add(LayoutNode("out", "fixed", (x,), (1, 8, 8, 8)))
    work = {
        "a": ConvWork("kxk", 900),
        "b": ConvWork("kxk", 300),
        "c": ConvWork("kxk", 30),
        "e": ConvWork("1x1", 100),
        "f": ConvWork("1x1", 100),
    }
    convs = [(n, layout, "direct", f"{n}:{layout}") for n in work for layout in (PLAIN, PACKED)]
    transforms = {((1, 8, 8, 8), PLAIN, PACKED): "pack", ((1, 8, 8, 8), PACKED, PLAIN): "unpack"}
    # packed halves a 3x3's time and makes a 1x1 four times slower
    measured = {"a:NCHW": 2.0, "a:NCHW8c": 1.0, "b:NCHW": 1.0, "c:NCHW": 0.1}
    measured.update({"e:NCHW": 1.0, "e:NCHW8c": 4.0, "f:NCHW": 1.0, "pack": 1e-3})
    measured["unpack"] = 1e-3
    groups = [["f:NCHW8c"], ["c:NCHW8c"], ["b:NCHW8c"]]
    queue: list[str] = []
    _in_doubt_first(g, convs, transforms, work, {})(measured, groups, queue)
    assert groups == [["b:NCHW8c"], ["c:NCHW8c"], ["f:NCHW8c"]]
