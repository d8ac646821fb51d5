"""What ``predict()`` takes and what it keeps (issue 49, item 7).

``run()`` checks its tensors; ``predict()`` takes an image and had no checks of its
own: a grayscale image raised IndexError, a BGRA one a broadcasting ValueError, None or
an empty image a cv2.error, and a float image in [0, 1] was preprocessed as if it were
0-255 pixels, silently wrong. Grayscale and BGRA images are now converted as OpenCV
converts them on reading (``cv2.IMREAD_COLOR``), anything else is one EdgecvError line
saying what was given and what to pass. A detector's NaN score or class id (a model
gone wrong) is no detection, never a crash in ``int()``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_run_faults import quick_package

import edgecv
from edgecv.board.errors import EdgecvError
from edgecv.board.imaging import Detection, detections


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return edgecv.load(quick_package("cpu", tmp_path_factory))


def image(seed: int, shape=(24, 32, 3)) -> np.ndarray:
    return np.random.RandomState(seed).randint(0, 256, shape).astype(np.uint8)


def assert_same(a: list, b: list) -> None:
    assert [label for label, _ in a] == [label for label, _ in b]
    np.testing.assert_array_equal([p for _, p in a], [p for _, p in b])


def test_grayscale_images_are_predicted_as_their_three_channel_copies(model):
    gray = image(0, (24, 32))
    want = model.predict(np.repeat(gray[:, :, None], 3, axis=2))
    assert_same(model.predict(gray), want)
    assert_same(model.predict(gray[:, :, None]), want)


def test_a_bgra_image_is_predicted_without_its_alpha(model):
    bgra = image(1, (24, 32, 4))
    assert_same(model.predict(bgra), model.predict(np.ascontiguousarray(bgra[:, :, :3])))


def test_a_strided_view_is_predicted_as_its_copy(model):
    bgr = image(2)
    flipped = bgr[:, :, ::-1]  # an RGB image turned BGR, the usual way
    assert_same(model.predict(flipped), model.predict(np.ascontiguousarray(flipped)))


@pytest.mark.parametrize(
    ("value", "fragments"),
    [
        (None, ["None", "cv2.imread returns None"]),
        ([[1, 2], [3, 4]], ["list", "NumPy array"]),
        ("photo.jpg", ["str", "read_image"]),
        (Path("photo.jpg"), ["Path", "read_image"]),
        (np.zeros((0, 0, 3), np.uint8), ["empty", "(0, 0, 3)"]),
        (np.zeros((24, 0), np.uint8), ["empty"]),
        (np.zeros((24, 32, 2), np.uint8), ["2 channels", "HxWx3"]),
        (np.zeros((1, 24, 32, 3), np.uint8), ["4-d", "HxWx3"]),
        (np.zeros((24, 32, 3), np.float32), ["float32", "[0, 1]", "* 255", "run()"]),
        (np.zeros((24, 32, 3), np.uint16), ["uint16", ">> 8"]),
        (np.zeros((24, 32, 3), bool), ["bool", "uint8"]),
    ],
    ids=["None", "list", "str", "path", "empty", "no-cols", "2ch", "4d", "float", "u16", "bool"],
)
def test_what_is_no_image_is_one_clear_error(model, value, fragments):
    with pytest.raises(EdgecvError) as err:
        model.predict(value)
    message = str(err.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    with pytest.raises(EdgecvError):
        model.preprocess(value)


def test_a_float_image_in_0_1_is_refused_not_scaled_wrong(model):
    """The same picture as uint8 0-255 and as float 0-1: the float one is not taken as
    0-255 pixels (an almost black image); it is refused, naming the conversion."""
    bgr = image(3)
    with pytest.raises(EdgecvError, match="uint8"):
        model.predict(bgr.astype(np.float32) / 255)
    assert model.predict(bgr)


def outputs_with(ids: list, scores: list, boxes: list) -> list[np.ndarray]:
    """A detector's outputs (ids, scores, boxes), batch of one."""
    return [
        np.asarray(ids, np.float32).reshape(1, -1, 1),
        np.asarray(scores, np.float32).reshape(1, -1, 1),
        np.asarray(boxes, np.float32).reshape(1, -1, 4),
    ]


def test_nan_scores_class_ids_and_boxes_are_no_detections():
    nan, inf = float("nan"), float("inf")
    box = [10, 20, 30, 40]
    outputs = outputs_with(
        [0, 1, nan, 1, inf, 0, -1, 1],
        [0.9, nan, 0.8, 0.7, 0.9, 0.6, 0.9, 0.2],
        [box, box, box, [nan, 0, 5, 5], box, [inf, 0, 5, 5], box, box],
    )
    found = detections(outputs, ["cat", "dog"], (100, 100), (200, 100), threshold=0.5)
    assert found == [Detection("cat", pytest.approx(0.9), (10.0, 40.0, 30.0, 80.0))]
    assert detections(outputs, ["cat", "dog"], (100, 100), (200, 100), threshold=-1.0)[-1] == (
        Detection("dog", pytest.approx(0.2), (10.0, 40.0, 30.0, 80.0))
    )
