"""The divergence probe (edgecv.testing.probe_divergence) names the stage where edgecv
first departs from MXNet: a small model whose one convolution weight is changed in the
weights edgecv deploys only must be reported at that convolution, and nowhere before."""

from __future__ import annotations

import numpy as np
import pytest
from graph_tuner.small_model import SHAPE, export_small_model

from edgecv._mxnet import import_mxnet
from edgecv.pipelines import BuildOptions
from edgecv.testing import probe_divergence  # the probe is part of edgecv.testing


def test_probe_names_the_stage_whose_weight_was_changed(tmp_path):
    mx = import_mxnet()
    symbol, params = export_small_model(tmp_path / "small")
    weights = mx.nd.load(str(params))
    # the 1x1 convolution of the concatenation's first branch, deep enough that the
    # stages before it (conv, BatchNorm, residual add, depthwise, LeakyReLU) must match
    (name,) = [k for k in weights if k.endswith("conv3_weight")]
    edited = weights[name].asnumpy()
    edited[2, 5, 0, 0] += 0.01 * float(np.abs(edited).max())  # one weight, 1% of the range
    weights[name] = mx.nd.array(edited)
    mx.nd.save(str(tmp_path / "edited.params"), weights)
    x = np.random.RandomState(0).standard_normal(SHAPE).astype(np.float32)
    report = probe_divergence(
        symbol,
        params,
        {"data": x},
        edgecv_params=tmp_path / "edited.params",
        ops=["Convolution", "elemwise_add", "LeakyReLU", "Concat", "FullyConnected"],
        options=BuildOptions(layout="NCHW", tuning=None, check_on=None),
    )
    layer = name.removeprefix("arg:").removesuffix("_weight")
    first = report.first
    assert first is not None and first.name == f"{layer}_fwd_output", report.table()
    assert first.op == "Convolution" and first.ratio > 100 * report.factor, report.table()
    before = report.stages[: report.stages.index(first)]
    # the stages before it were compared, MXNet's drift measured there, and none departs:
    # a probe that flagged rounding would name the first convolution instead
    assert [s.op for s in before] == [
        "Convolution",
        "Convolution",
        "elemwise_add",
        "Convolution",
        "LeakyReLU",
    ], report.table()
    assert all(0 < s.mxnet_drift and s.max_abs_diff <= 4 * s.mxnet_drift for s in before)
    # the edit shows downstream too, and the branch beside it (conv4) still matches
    after = {s.op: s for s in report.stages[report.stages.index(first) + 1 :]}
    assert after["Concat"].departs and after["FullyConnected"].departs, report.table()
    # Gluon numbers the block (small0, small1, ...) by the blocks made before it here
    block = layer.removesuffix("conv3")
    (sibling,) = [s for s in report.stages if s.name == f"{block}conv4_fwd_output"]
    assert not sibling.departs, report.table()
    assert f"first departure: {layer}_fwd_output" in report.table()


def test_probe_compares_a_block_called_twice(tmp_path):
    """A block applied to two inputs (an FPN's RPN head on each pyramid level) gives two
    nodes one name, which MXNet cannot pick an internal output by: both are compared."""
    mx = import_mxnet()
    nn = mx.gluon.nn

    class Shared(mx.gluon.HybridBlock):
        def __init__(self):
            super().__init__()
            with self.name_scope():
                self.stem = nn.Conv2D(4, 3, padding=1)
                self.head = nn.Conv2D(2, 1)

        def hybrid_forward(self, F, x):
            y = self.stem(x)
            pooled = F.Pooling(y, kernel=(2, 2), stride=(2, 2), pool_type="max")
            return F.concat(self.head(y).flatten(), self.head(pooled).flatten(), dim=1)

    from user_models import _export

    symbol, params = _export(Shared(), (1, 3, 8, 8), tmp_path / "shared", seed=0)
    x = np.random.RandomState(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    report = probe_divergence(
        symbol,
        params,
        {"data": x},
        ops=["Convolution"],
        options=BuildOptions(layout="NCHW", tuning=None, check_on=None),
    )
    heads = [s for s in report.stages if "conv1" in s.name]
    assert len(heads) == 2 and heads[0].name != heads[1].name, report.table()
    assert report.first is None and all(s.scale > 0 and not s.departs for s in heads)


def test_a_stage_where_mxnet_writes_nan_is_compared_by_position():
    """MXNet leaves NaN where it reads memory it never wrote (a mask R-CNN stage did):
    NaN at the same positions compares equal, NaN only on one side departs, and the
    stage's scale is that of its finite values (it was NaN: a ZeroDivisionError)."""
    from edgecv.testing.probe.stages import _compare_stage, _drift

    ref = np.array([[np.nan, 1.0, 2.0], [3.0, np.nan, 0.0]], np.float32)
    ours = ref.copy()
    ours[0, 1] = np.nextafter(np.float32(1.0), np.float32(2.0))
    moved = [_drift("Convolution", {}, "s", ref.copy(), ref)]
    same = _compare_stage("s", "Convolution", {}, ours, ref, moved, 4.0)
    assert same.scale == 3.0 and np.isfinite(same.ratio) and not same.departs
    ours[1, 2] = np.nan
    assert _compare_stage("s", "Convolution", {}, ours, ref, moved, 4.0).departs


def _argsort_graph() -> dict:
    return {
        "nodes": [
            {"op": "null", "name": "data", "inputs": []},
            {
                "op": "Activation",
                "name": "act0",
                "attrs": {"act_type": "relu"},
                "inputs": [[0, 0, 0]],
            },
            {"op": "argsort", "name": "argsort0", "attrs": {"axis": "-1"}, "inputs": [[1, 0, 0]]},
            {
                "op": "slice_axis",
                "name": "first0",
                "attrs": {"axis": "-1", "begin": "0", "end": "3"},
                "inputs": [[2, 0, 0]],
            },
        ]
    }


@pytest.mark.parametrize("mxnet_order", ["its own", "another"])
def test_a_sort_that_gives_mxnets_answer_on_mxnets_input_is_a_tie(mxnet_order):
    """The mask R-CNN case: an argsort of near-equal scores whose inputs differ from
    MXNet's by rounding. Run alone on MXNet's input, edgecv's argsort gives MXNet's
    order, so the stage is a tie and the stage reading it follows the tie; if it did not
    (another order than MXNet's on the same input), the stage still departs."""
    from edgecv.testing.probe.report import StageDifference
    from edgecv.testing.probe.ties import _rerun_discrete

    mx = import_mxnet()
    # exact ties too: MXNet's std::sort leaves their order unspecified
    values = np.random.RandomState(0).randint(0, 6, (2, 64)).astype(np.float32)
    ref = mx.nd.argsort(mx.nd.array(values), axis=-1).asnumpy()
    if mxnet_order == "another":
        ref = ref[:, ::-1].copy()
    result = [
        StageDifference("act0_output", "Activation", 0.0, 0.0, 0.0, False),
        StageDifference("argsort0_output", "argsort", 9.0, 0.0, 1e6, True, False, False),
        StageDifference("first0_output", "slice_axis", 9.0, 0.0, 1e6, True),
    ]
    base = [values, ref, ref[:, :3]]
    anchors = {"argsort0_output": ["act0_output"]}
    _rerun_discrete(
        mx, _argsort_graph(), result, base, anchors, {"act0_output": values}, "cpu", None
    )
    sort, first = result[1], result[2]
    if mxnet_order == "its own":
        assert sort.tie and not sort.departs
        assert first.follows_tie == "argsort0_output" and not first.departs
    else:
        assert not sort.tie and sort.departs and first.departs and first.follows_tie is None


def test_passes_split_stages_by_bytes_and_give_one_passs_report(tmp_path):
    """A model whose stage outputs do not fit in memory at once (a mask head on 1,000
    ROIs: 6 GB) is probed in passes, each deploying the graph cut at its own stages:
    the report is the one a single pass gives, stage for stage."""
    from edgecv.testing.probe.divergence import _output_bytes, _passes

    assert _passes([4, 4, 4, 9, 1, 1], 8) == [(0, 2), (2, 3), (3, 4), (4, 6)]
    assert _passes([3, 3], 100) == [(0, 2)]
    symbol, params = export_small_model(tmp_path / "small")
    x = np.random.RandomState(0).standard_normal(SHAPE).astype(np.float32)
    ops = ["Convolution", "elemwise_add", "Concat", "FullyConnected"]
    options = BuildOptions(layout="NCHW", tuning=None, check_on=None)
    whole = probe_divergence(symbol, params, {"data": x}, ops=ops, options=options)
    # four convolutions' outputs a pass: the eight stages take two passes (two deploys;
    # the second's four stages, concatenation and dense included, fit one pass)
    mx = import_mxnet()
    internals = mx.sym.load(str(symbol)).get_internals()
    names = [s.name for s in whole.stages]
    limit = 4 * _output_bytes(mx, internals, names[:1], {"data": SHAPE})[0]
    assert _passes(_output_bytes(mx, internals, names, {"data": SHAPE}), limit) == [(0, 4), (4, 8)]
    split = probe_divergence(
        symbol, params, {"data": x}, ops=ops, options=options, pass_bytes=limit
    )
    assert [s.name for s in split.stages] == names
    for a, b in zip(split.stages, whole.stages, strict=True):
        assert (a.max_abs_diff, a.mxnet_drift, a.departs) == (
            b.max_abs_diff,
            b.mxnet_drift,
            b.departs,
        )
    assert split.first is None and len(names) == 8


def test_kept_rows_are_matched_within_the_tolerance_in_every_field():
    """Rows (NMS keep lists) match when every field is within the tolerance, in any
    order; -1 rows are padding. The k-d tree that matches 80,000 rows gives the
    pair-by-pair answer, a field exactly at the tolerance included, and a row holding
    NaN (compared pair by pair: a k-d tree cannot hold it) matches nothing."""
    from edgecv.testing.probe.stages import _unmatched_rows

    def pairwise(ours, ref, tol):
        a, b = (r[~(r == -1).all(1)] for r in (ours, ref))
        return tuple(
            int((~(np.abs(x[:, None] - y[None]) <= tol).all(-1).any(1)).sum())
            for x, y in ((b, a), (a, b))
        )

    rng = np.random.RandomState(0)
    ours = np.round(rng.rand(400, 6) * 16) / 4  # quarters: the shifts below are exact
    ref = ours.copy()
    moved = rng.choice(400, 60, replace=False)
    ref[moved[:20], 2] += 0.25  # exactly the tolerance: still a match
    ref[moved[20:40], 3] += 0.5  # past it in one field
    ref[moved[40:], :] += 0.125  # within it in every field
    ref = np.concatenate([ref[rng.permutation(400)], -np.ones((30, 6))])
    expected = pairwise(ours, ref, 0.25)
    assert _unmatched_rows(ours, ref, 0.25) == expected
    assert 0 < expected[0] <= 20 and 0 < expected[1] <= 20  # the 20 moved past it, at most
    ref[0, 0] = np.nan
    assert _unmatched_rows(ours, ref, 0.25) == pairwise(ours, ref, 0.25)
