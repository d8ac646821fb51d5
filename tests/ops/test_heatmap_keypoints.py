"""heatmap_keypoints: the NumPy reference against what bicubic resizing and the argmax
must give (a single peak, a constant map's first pixel), the TE kernel against the
reference on the CPU, and its schedule for `deeplens`; boxes at the image's border,
tiny (under a pixel), fractional and as large as the image, padding rows."""

from __future__ import annotations

import numpy as np
import pytest
from kernels import run_cpu
from tvm import te

from edgecv.ops.heatmap_keypoints import heatmap_keypoints
from edgecv.ops.heatmap_keypoints_reference import heatmap_keypoints_reference, resize_bicubic
from edgecv.profiles import load_profile
from edgecv.testing import assert_close

SIZE, JOINTS, SIDE = 64, 5, 16
BOXES = [
    (0, 0, 0, 0),  # a padding row's box (its score below): keypoints and scores 0
    (0, 0, 0.5, 0.5),  # under a pixel: sides clamped to 1
    (3.2, 4.1, 50.7, 60.3),  # fractional corners
    (0, 0, 64, 64),  # the whole image
    (60.5, 10, 64, 63.9),  # at the right border, thin
    (5.5, 6.5, 7.25, 8.75),  # tiny
]
SCORES = [-1.0, 0.3, 0.2, 0.1, 0.9, 0.5]


def _func(count: int):
    maps = te.placeholder((count, JOINTS, SIDE, SIDE), "float32", name="maps")
    boxes = te.placeholder((count, 4), "float32", name="boxes")
    scores = te.placeholder((count,), "float32", name="scores")
    points, values = heatmap_keypoints(maps, boxes, scores, SIZE, SIZE)
    return te.create_prim_func([maps, boxes, scores, points, values])


def _run(maps, boxes, scores):
    count = len(boxes)
    outs = [np.zeros((count, 3, JOINTS), np.float32), np.zeros((count, JOINTS), np.float32)]
    return run_cpu(_func(count), [maps, boxes, scores, *outs])[3:]


def _inputs(seed: int = 0):
    rng = np.random.RandomState(seed)
    maps = rng.standard_normal((len(BOXES), JOINTS, SIDE, SIDE)).astype(np.float32)
    return maps, np.array(BOXES, np.float32), np.array(SCORES, np.float32)


def test_bicubic_resize_keeps_constants_and_samples():
    """Cubic weights sum to 1 (a constant stays) and are (0, 1, 0, 0) on a sample (a
    resize to the same size is the identity; to twice the size, an interpolation whose
    every other pixel pair averages near the samples)."""
    rng = np.random.RandomState(2)
    image = rng.standard_normal((SIDE, SIDE))
    np.testing.assert_allclose(resize_bicubic(np.full((SIDE, SIDE), 3.0), 23, 41), 3.0)
    np.testing.assert_allclose(resize_bicubic(image, SIDE, SIDE), image, atol=1e-12)
    double = resize_bicubic(image, 2 * SIDE, 2 * SIDE)
    assert np.abs(double[1:-1:2, 1:-1:2] - image[:-1, :-1]).mean() < 0.5


def test_reference_finds_a_peak_and_the_first_of_ties():
    maps = np.zeros((2, JOINTS, SIDE, SIDE), np.float32)
    maps[0, :, 4, 12] = 10.0  # one peak: the keypoint near its box position
    boxes = np.array([[10, 20, 42, 52], [0, 0, 9.5, 9.5]], np.float32)
    points, values = heatmap_keypoints_reference(maps, boxes, np.ones(2, np.float32))
    # the map's pixel (12, 4) covers box x 10 + 32 * (12..13) / 16: around 34-36
    assert 34 <= points[0, 0, 0] <= 36 and 28 <= points[0, 1, 0] <= 30, points[0, :, 0]
    assert (values[0] > 5).all()
    # a constant map: every pixel ties; the first (row-major) is the keypoint
    np.testing.assert_allclose(points[1, :2, 0], [0.5 * 9.5 / 10, 0.5 * 9.5 / 10])
    assert (points[:, 2] == 1).all()


def test_cpu_matches_reference():
    maps, boxes, scores = _inputs()
    points, values = _run(maps, boxes, scores)
    ref_points, ref_values = heatmap_keypoints_reference(maps, boxes, scores)
    assert_close(points, ref_points, "keypoints", scale=SIZE)
    assert_close(values, ref_values, "keypoint scores")
    assert not points[0].any() and not values[0].any()  # the padding row


def test_random_boxes_match_reference():
    rng = np.random.RandomState(1)
    count = 24
    maps = rng.standard_normal((count, JOINTS, SIDE, SIDE)).astype(np.float32)
    corner = rng.uniform(0, SIZE - 1, (count, 2))
    far = np.minimum(corner + rng.uniform(0, SIZE, (count, 2)), SIZE)
    boxes = np.concatenate([corner, far], 1).astype(np.float32)
    scores = rng.uniform(-1, 1, count).astype(np.float32)
    points, values = _run(maps, boxes, scores)
    ref_points, ref_values = heatmap_keypoints_reference(maps, boxes, scores)
    assert_close(points, ref_points, "keypoints", scale=SIZE)
    assert_close(values, ref_values, "keypoint scores")


def test_deeplens_schedules_it():
    """A GPU rule or the safe rule schedules it for `deeplens` (a kernel no rule took
    would run on the CPU: placement's fallback)."""
    from edgecv.schedules.gpu import default_rules, safe_rule
    from edgecv.schedules.stage import ScheduleOrder

    target = load_profile("deeplens").tvm_target()
    order = ScheduleOrder(target, default_rules(target), safe_rule())
    chosen = next(c for c in order.attempts(_func(len(BOXES))) if c.func is not None)
    assert chosen.rule.startswith(("gpu.", "dlight.")), chosen.rule


def test_bad_shapes():
    maps = te.placeholder((3, 17, 56, 56), "float32")
    with pytest.raises(ValueError, match=r"boxes must be \(3, 4\)"):
        heatmap_keypoints(maps, te.placeholder((2, 4), "float32"),
                          te.placeholder((3,), "float32"), 8, 8)  # fmt: skip
    with pytest.raises(ValueError, match=r"heatmaps must be \(K, J, S, S\)"):
        heatmap_keypoints(te.placeholder((3, 17, 56), "float32"), te.placeholder((3, 4), "float32"),
                          te.placeholder((3,), "float32"), 8, 8)  # fmt: skip
