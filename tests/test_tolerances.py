"""The tolerance helpers of edgecv.testing against forward passes whose conditioning is
known: loosening follows the reference's own drift under rounding-level noise."""

from __future__ import annotations

import numpy as np
import pytest

from edgecv.testing import (
    TOLERANCES,
    detection_loosening,
    match_detections,
    reference_drift,
    rounding_loosening,
)


def test_a_well_conditioned_reference_keeps_the_table():
    x = np.random.RandomState(0).uniform(1, 2, (4, 8)).astype(np.float32)
    assert rounding_loosening(lambda a: [a * 2, np.tanh(a)], [x]) == [1.0, 1.0]


def test_a_reference_that_amplifies_rounding_loosens_by_its_own_drift():
    x = np.random.RandomState(0).uniform(1, 2, (4, 8)).astype(np.float32)

    def cancelling(a):  # the difference of two large, nearly equal terms: 1e3x the noise
        return [(a.astype(np.float64) * 1e3 - np.floor(a * 1e3)).astype(np.float32), a]

    wide, plain = rounding_loosening(cancelling, [x])
    _, atol = TOLERANCES["float32"]
    assert plain == 1.0
    # inputs moved by ~1e-7 move the output by ~1e-4 of its scale (about 1): 4x that
    assert 4 * 1e-5 / atol < wide < 4 * 1e-3 / atol


def test_integer_outputs_stay_exact():
    x = np.arange(6, dtype=np.float32)
    assert rounding_loosening(lambda a: [np.argsort(-a)], [x]) == [1.0]


def test_detection_rows_that_swap_are_not_counted_as_drift():
    """Two detections whose scores tie within rounding swap places under input noise:
    the reference's ids and boxes then change row by row, but as sets they do not."""
    boxes_of = np.array([[0, 0, 10, 10], [5, 5, 50, 50]], np.float32)

    def detector(x):
        order = np.argsort(-x, kind="stable")
        ids = order.astype(np.float32).reshape(1, 2, 1)
        return [ids, x[order].reshape(1, 2, 1), boxes_of[order].reshape(1, 2, 4)]

    x = np.array([0.5, np.nextafter(np.float32(0.5), np.float32(1))], np.float32)
    # a seed whose noise swaps the two rows: row by row that looks like drift
    seed = next(s for s in range(50) if reference_drift(detector, [x], seed=s)[1][0] == 1.0)
    assert reference_drift(detector, [x], seed=seed)[1][2] == 40.0
    assert detection_loosening(detector, [x], box_scale=50.0, seed=seed) == 1.0


def test_tied_detections_in_another_order_match_whatever_their_last_bits():
    """Two rows whose scores tie, in the other order, with scores and boxes that differ
    in their last bits the other way round: the same detections. (A third row is
    invalid: the output is not full, so the tie was not cut by its length.)"""
    none = [-1.0, -1, -1, -1]
    ref = [
        np.array([[[4.0], [4.0], [-1]]]),
        np.array([[[0.5], [0.5 + 2e-7], [-1]]]),
        np.array([[[10.0, 10, 50, 50], [200, 30, 260, 90], none]]),
    ]
    # ours ranks the first box higher, by the last bit of its score
    ours = [
        ref[0].copy(),
        np.array([[[0.5 + 2e-7], [0.5], [-1]]]),
        np.array([[[10, 10, 50, 50.0001], [200.0001, 30, 260, 90], none]]),
    ]
    ref, ours = ([a.astype(np.float32) for a in x] for x in (ref, ours))
    assert match_detections(ours, ref, box_scale=300.0) == 2
    wrong = [ref[0], ours[1], np.array([[[200.0, 30, 260, 90], [10, 10, 50, 80], none]])]
    with pytest.raises(AssertionError):
        match_detections([a.astype(np.float32) for a in wrong], ref, box_scale=300.0)


def test_a_tie_is_a_chain_of_rows_each_tied_with_the_one_before():
    """YOLOv3's random-weight output: scores 0.33711, 0.337098, 0.337098 (MXNet). The
    first and third are 1.2e-5 apart, beyond one tolerance (1e-5 + 1e-5 * 0.337), but
    each ties with its neighbour: one run, so the last two may come in either order."""
    a, b, c, none = [10.0, 10, 50, 50], [200, 30, 260, 90], [53, 280, 84, 304], [-1] * 4
    ids = np.array([[[0.0], [0.0], [0.0], [-1]]])
    ref = [ids, np.array([[[0.33711], [0.337098], [0.337098], [-1]]]), np.array([[a, b, c, none]])]
    ours = [
        ids.copy(),
        np.array([[[0.33711], [0.337099], [0.337098], [-1]]]),
        np.array([[a, c, b, none]]),
    ]
    ref, ours = ([a.astype(np.float32) for a in x] for x in (ref, ours))
    assert match_detections(ours, ref, box_scale=416.0) == 3
    # scores 1e-4 apart are no tie: the same swap is a mismatch
    spread = np.array([[[0.3372], [0.3371], [0.3370], [-1]]], np.float32)
    with pytest.raises(AssertionError, match="rows 1:2"):
        match_detections([ours[0], spread, ours[2]], [ref[0], spread, ref[2]], box_scale=416.0)


def test_a_tie_cut_at_the_end_of_a_full_output_is_compared_by_score():
    """Every row valid and the last three tie: the output was cut inside the tie, and
    which tied candidates made it in is rounding's choice. Those rows compare by
    score only (and are counted); rows before them still compare exactly."""
    scores = np.array([[[0.9], [0.5], [0.5], [0.5]]])
    ref = [
        np.array([[[1.0], [2.0], [3.0], [4.0]]]),
        scores,
        np.array([[[0, 0, 9, 9], [10, 10, 50, 50], [60, 60, 90, 90], [5, 5, 8, 8]]]),
    ]
    ours = [
        np.array([[[1.0], [7.0], [2.0], [3.0]]]),
        scores.copy(),
        np.array([[[0, 0, 9, 9], [1, 1, 5, 5], [10, 10, 50, 50], [60, 60, 90, 90]]]),
    ]
    ref, ours = ([a.astype(np.float32) for a in x] for x in (ref, ours))
    cut: list[int] = []
    assert match_detections(ours, ref, box_scale=300.0, cut=cut) == 4
    assert cut == [3]
    wrong_first = [ours[0], ours[1], ours[2].copy()]
    wrong_first[2][0, 0] = [1, 0, 9, 9]
    with pytest.raises(AssertionError, match="rows 0:1"):
        match_detections(wrong_first, ref, box_scale=300.0, cut=[])
    with pytest.raises(AssertionError, match="rows 1:4"):  # strict unless asked
        match_detections(ours, ref, box_scale=300.0)
    # not full (the last row invalid): the tie was not cut, its rows must match as a set
    ref[0][0, 3], ours[0][0, 3] = -1.0, -1.0
    ref[1][0, 3], ours[1][0, 3] = -1.0, -1.0
    with pytest.raises(AssertionError):
        match_detections(ours, ref, box_scale=300.0, cut=[])


def test_roi_align_rows_of_a_negative_batch_index_are_compared_as_zero(tmp_path):
    """GluonCV's FPN detectors mask the ROIs of other pyramid levels with batch index
    -1; MXNet's CPU ROIAlign reads outside the feature map for them (its output for
    those rows changes from run to run) and edgecv's gives zeros. The reference graph
    of `compare_with_mxnet` zeroes those rows and keeps MXNet's values for the others,
    and an edgecv deploy of such a graph matches it."""
    import edgecv
    from edgecv._mxnet import import_mxnet
    from edgecv.deploy import deploy
    from edgecv.testing import compare_with_mxnet, with_defined_roi_align

    mx = import_mxnet()
    S = mx.sym
    rois = np.array(
        [[-1, -1, -1, -1, -1], [0, 1, 2, 12, 9], [-1, 3, 3, 8, 8], [0, 0, 0, 15, 15]], np.float32
    )
    pooled = S.contrib.ROIAlign(
        S.var("data"), S.var("rois"), pooled_size=(2, 2), spatial_scale=0.5, sample_ratio=2
    )
    net = S.relu(pooled) + 1
    shape = (1, 3, 8, 8)
    x = np.random.RandomState(0).normal(size=shape).astype(np.float32)
    original = net.bind(mx.cpu(), {"data": mx.nd.array(x), "rois": mx.nd.array(rois)})
    defined = mx.sym.load_json(with_defined_roi_align(net.tojson()))
    assert defined.list_arguments() == net.list_arguments()
    rewritten = defined.bind(mx.cpu(), {"data": mx.nd.array(x), "rois": mx.nd.array(rois)})
    want, got = original.forward()[0].asnumpy(), rewritten.forward()[0].asnumpy()
    valid = rois[:, 0] >= 0
    np.testing.assert_array_equal(got[valid], want[valid])
    np.testing.assert_array_equal(got[~valid], 1.0)  # relu(0) + 1
    plain = S.relu(S.var("data")).tojson()
    assert with_defined_roi_align(plain) == plain

    prefix = tmp_path / "fpn_level"
    net.save(f"{prefix}-symbol.json")
    mx.nd.save(f"{prefix}-0000.params", {"arg:rois": mx.nd.array(rois)})
    package = deploy(
        f"{prefix}-symbol.json",
        tmp_path / "pkg",
        "cpu",
        params=f"{prefix}-0000.params",
        input_shape=shape,
        host="native",
    )
    ours = edgecv.load(package).run(x)
    compare_with_mxnet(ours, f"{prefix}-symbol.json", f"{prefix}-0000.params", {"data": x})
