"""paste_masks: the NumPy reference against what bilinear resizing must give (constant
and linear masks), the TE kernel against the reference on the CPU and, scheduled by the
GPU rules for `deeplens`, on Intel's OpenCL CPU runtime; boxes at and over the image's
border, tiny, inverted and larger-than-the-image boxes, padding rows."""

from __future__ import annotations

import numpy as np
import pytest
from kernels import run_cpu, run_opencl
from tvm import te

from edgecv.board.runtime.opencl_devices import opencl_devices
from edgecv.ops.paste_masks import paste_masks
from edgecv.ops.paste_masks_reference import paste_masks_reference
from edgecv.profiles import load_profile
from edgecv.testing import assert_close

HAVE_INTEL = any(d.matches("intel(r) opencl") for d in opencl_devices())
H, W, SIDE = 40, 50, 30
BOXES = [
    (0, 0, 0, 0),  # a padding row's box (its score below): nothing
    (-3, -2, 10, 12),  # over the top-left border
    (30, 20, 60, 45),  # over the bottom-right border
    (5, 5, 5, 5),  # one pixel
    (10, 30, 8, 35),  # inverted (x2 < x1): nothing
    (0, 0, 49, 39),  # the whole image exactly
    (-20, -20, 100, 100),  # larger than the image on every side
    (49, 39, 49, 39),  # the last pixel
    (50, 10, 60, 20),  # right of the image: nothing
]
SCORES = [-1.0, 0.3, 0.2, 0.1, 0.9, 0.5, 0.4, 0.6, 0.7]


def _func(count: int, height: int = H, width: int = W):
    masks = te.placeholder((count, 1, SIDE, SIDE), "float32", name="masks")
    boxes = te.placeholder((count, 4), "int64", name="boxes")
    scores = te.placeholder((count,), "float32", name="scores")
    out = paste_masks(masks, boxes, scores, height, width)
    return te.create_prim_func([masks, boxes, scores, out])


def _inputs(seed: int = 0):
    rng = np.random.RandomState(seed)
    masks = rng.rand(len(BOXES), 1, SIDE, SIDE).astype(np.float32)
    return masks, np.array(BOXES, np.int64), np.array(SCORES, np.float32)


def test_reference_pastes_a_constant_mask_into_the_clipped_box():
    masks, boxes, scores = _inputs()
    out = paste_masks_reference(np.ones_like(masks), boxes, scores, H, W)
    for row, (x1, y1, x2, y2) in enumerate(BOXES):
        expected = np.zeros((H, W), np.float32)
        if scores[row] >= 0:
            expected[max(y1, 0) : max(y2 + 1, 0), max(x1, 0) : max(x2 + 1, 0)] = 1
        np.testing.assert_array_equal(out[row], expected, err_msg=f"box {BOXES[row]}")


def test_reference_resizes_bilinearly_with_half_pixel_centres():
    """A mask linear along x resizes to the line through the source coordinates
    ``(d + 0.5) * S / w - 0.5`` (clamped to the mask): what align_corners=False means."""
    ramp = np.tile(np.arange(SIDE, dtype=np.float32), (SIDE, 1))[None, None]
    box = np.array([[2, 3, 2 + 44, 3 + 20]], np.int64)  # 45 columns
    out = paste_masks_reference(ramp, box, np.zeros(1, np.float32), H, W)
    source = np.clip((np.arange(45) + 0.5) * SIDE / 45 - 0.5, 0, SIDE - 1)
    np.testing.assert_allclose(out[0, 3, 2:47], source[: W - 2], rtol=0, atol=1e-5)
    assert not out[0, :, :2].any() and not out[0, :3].any()


def test_cpu_matches_reference():
    masks, boxes, scores = _inputs()
    ours = run_cpu(_func(len(BOXES)), [masks, boxes, scores, np.zeros((len(BOXES), H, W), "f")])
    ref = paste_masks_reference(masks, boxes, scores, H, W)
    assert_close(ours[3], ref, "paste_masks")
    assert not ours[3][[0, 4, 8]].any()  # the padding row and the boxes outside: all 0
    assert (ours[3][6] > 0).all()  # larger than the image: every pixel


def test_random_boxes_match_reference():
    rng = np.random.RandomState(1)
    count = 64
    masks = rng.rand(count, 1, SIDE, SIDE).astype(np.float32)
    corner = rng.randint(-10, W + 5, (count, 2))
    size = rng.randint(0, 70, (count, 2))
    boxes = np.concatenate([corner, corner + size], 1).astype(np.int64)
    scores = rng.uniform(-1, 1, count).astype(np.float32)
    ours = run_cpu(_func(count), [masks, boxes, scores, np.zeros((count, H, W), "f")])[3]
    assert_close(ours, paste_masks_reference(masks, boxes, scores, H, W), "paste_masks")


def test_deeplens_schedules_it_as_an_injective_kernel():
    """The GPU rules' injective rule takes it (not the safe rule); it runs on Intel's
    OpenCL CPU runtime, the DeepLens stand-in, and matches the reference."""
    from edgecv.schedules.gpu import default_rules, safe_rule
    from edgecv.schedules.stage import ScheduleOrder

    profile = load_profile("deeplens")
    target = profile.tvm_target()
    order = ScheduleOrder(target, default_rules(target), safe_rule())
    func = _func(len(BOXES))
    chosen = next(c for c in order.attempts(func) if c.func is not None)
    assert chosen.rule == "gpu.Injective", chosen.rule
    if not HAVE_INTEL:
        pytest.skip("Intel's OpenCL CPU runtime is not installed")
    masks, boxes, scores = _inputs()
    arrays = [masks, boxes, scores, np.zeros((len(BOXES), H, W), np.float32)]
    ours = run_opencl(chosen.func, arrays, "intel", "deeplens")[3]
    assert_close(ours, paste_masks_reference(masks, boxes, scores, H, W), "OpenCL paste_masks")


def test_bad_shapes():
    masks = te.placeholder((3, 1, 28, 28), "float32")
    with pytest.raises(ValueError, match=r"boxes must be \(3, 4\)"):
        paste_masks(masks, te.placeholder((2, 4), "int64"), te.placeholder((3,), "float32"), 8, 8)
    with pytest.raises(ValueError, match=r"masks must be \(K, 1, S, S\)"):
        paste_masks(te.placeholder((3, 2, 28, 28), "float32"), te.placeholder((3, 4), "int64"),
                    te.placeholder((3,), "float32"), 8, 8)  # fmt: skip
