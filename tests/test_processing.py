"""Pre- and post-processing a model file does not carry (edgecv/board/processing.py,
edgecv/board/decoders.py): the decoders on crafted outputs against NumPy computed here
(Ultralytics' raw head with known boxes, NMS's kept indices exact, the letterbox mapped
back), the presets' preprocessing against a hand computation on scikit-image's
astronaut, the sidecar's and flags' errors (one line), and the manifest round trip."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
import skimage.data
from helpers import assert_one_error_line, run_cli

from edgecv.board.decoders import decode, nms, ultralytics_raw
from edgecv.board.errors import EdgecvError, PackageError
from edgecv.board.imaging import detections, letterbox, preprocess, unletterbox
from edgecv.board.processing import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Decoder,
    Preprocessing,
    Processing,
    coco80,
    from_manifest,
    preset,
    read_sidecar,
    resolve,
    to_manifest,
)


def astronaut_bgr() -> np.ndarray:
    return np.ascontiguousarray(skimage.data.astronaut()[:, :, ::-1])  # 512 x 512


def reference_nms(boxes, scores, iou):
    """The IoU matrix at once, then the sorted boxes walked keeping those no kept box
    overlaps more than ``iou``."""
    b = np.asarray(boxes, np.float64)
    x1 = np.maximum(b[:, None, 0], b[None, :, 0])
    y1 = np.maximum(b[:, None, 1], b[None, :, 1])
    x2 = np.minimum(b[:, None, 2], b[None, :, 2])
    y2 = np.minimum(b[:, None, 3], b[None, :, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    matrix = inter / (area[:, None] + area[None, :] - inter)
    kept: list[int] = []
    for i in sorted(range(len(b)), key=lambda i: (-scores[i], i)):
        if all(matrix[i, j] <= iou for j in kept):
            kept.append(i)
    return kept


def test_nms_keeps_the_indices_a_reference_keeps():
    rng = np.random.RandomState(0)
    corners = rng.uniform(0, 200, (300, 2))
    boxes = np.concatenate([corners, corners + rng.uniform(5, 60, (300, 2))], axis=1)
    scores = rng.uniform(0, 1, 300)
    for iou in (0.3, 0.5, 0.7):
        assert nms(boxes, scores, iou).tolist() == reference_nms(boxes, scores, iou)


def raw_head() -> np.ndarray:
    """[1, 4+3, 6]: anchor 1 overlaps anchor 0 (IoU 0.82, class 0: suppressed), anchor 2
    is anchor 1's box for class 1 (kept: NMS is per class), anchor 4 is under the 0.25
    confidence, anchor 5 overlaps anchor 0 by 0.43 (kept)."""
    rows = [  # cx, cy, w, h, class 0, 1, 2
        [100, 100, 50, 50, 0.9, 0.1, 0.0],
        [105, 100, 50, 50, 0.8, 0.0, 0.1],
        [105, 100, 50, 50, 0.0, 0.85, 0.1],
        [300, 200, 40, 80, 0.0, 0.1, 0.6],
        [50, 50, 10, 10, 0.0, 0.1, 0.2],
        [120, 100, 50, 50, 0.7, 0.0, 0.0],
    ]
    return np.asarray(rows, np.float32).T[None]


def test_the_ultralytics_raw_head_decodes_to_known_boxes():
    boxes, scores, classes = ultralytics_raw(raw_head(), confidence=0.25, iou=0.7)
    np.testing.assert_allclose(scores, [0.9, 0.85, 0.7, 0.6], rtol=1e-6)
    assert classes.tolist() == [0, 1, 0, 2]
    expected = [[75, 75, 125, 125], [80, 75, 130, 125], [95, 75, 145, 125], [280, 160, 320, 240]]
    np.testing.assert_allclose(boxes, expected)
    # a lower IoU threshold suppresses anchor 5 too (0.43 > 0.4)
    assert ultralytics_raw(raw_head(), 0.25, 0.4)[2].tolist() == [0, 1, 2]


def test_letterbox_boxes_map_back_to_the_image():
    image_hw, input_hw = (480, 640), (320, 320)  # ratio 0.5, 320 x 240 at top 40
    boxes = np.array([[100.0, 50.0, 300.0, 200.0], [0.0, 0.0, 639.0, 479.0]])
    by_hand = boxes * 0.5 + [0, 40, 0, 40]
    np.testing.assert_allclose(unletterbox(by_hand, image_hw, input_hw), boxes)
    image = np.random.RandomState(1).randint(0, 255, (*image_hw, 3)).astype(np.uint8)
    boxed = letterbox(image, input_hw, 114.0)
    assert (boxed[:40] == 114).all() and (boxed[280:] == 114).all()
    np.testing.assert_array_equal(boxed[40:280], cv2.resize(image, (320, 240)))


def test_ultralytics_detections_land_on_the_original_image():
    processing = preset("ultralytics")
    found = decode([raw_head()], processing, (320, 416), (640, 640))  # ratio 0.769
    ratio, left = 320 / 640, (416 - 320) // 2  # the image is 320 x 320 at left 48
    assert [d.label for d in found] == ["person", "bicycle", "person", "car"]
    first = (np.array([75, 75, 125, 125]) - [left, 0, left, 0]) / ratio
    np.testing.assert_allclose(found[0].box, first)
    # the end-to-end head: rows as given, best first, above the confidence
    e2e = np.array([[[10, 10, 50, 50, 0.3, 2], [0, 0, 20, 20, 0.9, 0], [1, 1, 2, 2, 0.1, 1]]])
    found = decode([e2e], preset("ultralytics-nms"), (320, 416), (640, 640))
    assert [(d.label, d.score) for d in found] == [("person", 0.9), ("car", 0.3)]
    np.testing.assert_allclose(found[0].box, [0, 0, 0, 40])  # x clipped at the image


def test_torchvision_detections_scale_back_from_the_stretched_input():
    boxes = np.array([[10.0, 20.0, 110.0, 220.0], [0, 0, 5, 5]], np.float32)
    labels, scores = np.array([3, 1], np.int64), np.array([0.8, 0.4], np.float32)
    processing = Processing(Preprocessing(), Decoder("torchvision"), ("bg", "a", "b", "c"))
    found = decode([boxes, labels, scores], processing, (320, 320), (640, 960))
    assert len(found) == 1 and found[0].label == "c"
    np.testing.assert_allclose(found[0].box, [30, 40, 330, 440])


def test_the_presets_preprocess_as_computed_by_hand():
    image = astronaut_bgr()
    rgb = image[:, :, ::-1].astype(np.float32)
    torchvision = preset("torchvision").preprocessing.as_dict()
    x = preprocess(image, torchvision, (1, 3, 224, 224))
    small = cv2.resize(image, (224, 224))[:, :, ::-1].astype(np.float32) / 255
    by_hand = (small - np.float32(IMAGENET_MEAN)) / np.float32(IMAGENET_STD)
    np.testing.assert_allclose(x[0], by_hand.transpose(2, 0, 1), rtol=1e-5, atol=1e-5)
    # ultralytics: 512 x 512 -> 320 x 320 centred in 320 x 416 on 114 grey, RGB / 255
    x = preprocess(image, preset("ultralytics").preprocessing.as_dict(), (1, 3, 320, 416))
    canvas = np.full((320, 416, 3), 114.0, np.float32)
    canvas[:, 48:368] = cv2.resize(rgb, (320, 320))
    np.testing.assert_allclose(x[0], canvas.transpose(2, 0, 1) / 255, atol=1.5 / 255)
    assert np.all(x[0, :, :, :48] == np.float32(114 * np.float32(1 / 255)))
    bgr = Preprocessing(color="BGR", scale=1.0)
    np.testing.assert_array_equal(
        preprocess(image, bgr.as_dict(), (1, 3, 512, 512))[0], image.transpose(2, 0, 1)
    )


def test_a_sidecar_sets_fields_and_flags_override_them(tmp_path):
    names = tmp_path / "names.txt"
    names.write_text("cat\ndog\n")
    sidecar = tmp_path / "model.json"
    fields = {"preset": "ultralytics", "color": "bgr", "scale": "1/255", "iou": 0.5}
    sidecar.write_text(json.dumps({**fields, "classes": str(names)}))
    read = read_sidecar(sidecar)
    assert read.preprocessing.color == "BGR" and read.preprocessing.resize == "letterbox"
    assert read.decoder == Decoder("ultralytics", iou=0.5) and read.classes == ("cat", "dog")
    flagged = resolve(str(sidecar), {"mean": "1,2,3", "decoder": "ultralytics-nms"})
    assert flagged.preprocessing.mean == (1.0, 2.0, 3.0)
    assert flagged.decoder.kind == "ultralytics-nms" and flagged.preprocessing.color == "BGR"
    assert resolve(None, {}) is None and len(coco80()) == 80


@pytest.mark.parametrize(
    "fields, fragment",
    [
        ({"mena": [0, 0, 0]}, "unknown field(s) 'mena'"),
        ({"mean": [0, 0]}, "`mean` should be 3 numbers"),
        ({"color": "HSV"}, "`color` should be one of RGB, BGR"),
        ({"resize": "crop"}, "`resize` should be one of stretch, letterbox"),
        ({"decoder": "yolo"}, "`decoder` should be one of"),
        ({"iou": 2}, "`iou` should be within 0-1"),
        ({"preset": "yolo"}, "unknown preprocessing preset `yolo`"),
    ],
)
def test_a_bad_sidecar_is_one_line_naming_the_field(tmp_path, fields, fragment):
    sidecar = tmp_path / "bad.json"
    sidecar.write_text(json.dumps(fields))
    with pytest.raises(EdgecvError, match=None) as raised:
        read_sidecar(sidecar)
    assert fragment in str(raised.value) and "\n" not in str(raised.value)


def test_deploy_refuses_a_bad_sidecar_before_reading_the_model(tmp_path):
    sidecar = tmp_path / "bad.json"
    sidecar.write_text('{"colour": "RGB"}')
    result = run_cli("deploy", tmp_path / "absent.onnx", "--preprocess", sidecar)
    assert_one_error_line(result, "unknown field(s) 'colour'")
    result = run_cli("deploy", tmp_path / "absent.onnx", "--scale", "x")
    assert_one_error_line(result, "`scale` should be a number")


def test_the_manifest_sections_round_trip():
    for name in ("imagenet", "torchvision", "torchvision-detection", "ultralytics"):
        processing = preset(name)
        manifest = json.loads(json.dumps({"model": {"task": "x"}, **to_manifest(processing)}))
        assert from_manifest(manifest) == processing, name
    # a package from before decoders: its task says how, its classes are its own
    old = {
        "model": {"task": "detection"},
        "preprocessing": {
            "color": "RGB",
            "scale": 1 / 255,
            "mean": [0.485, 0.456, 0.406],
            "std": [0.229, 0.224, 0.225],
            "resize": "stretch",
        },
        "classes": ["a"],
    }
    read = from_manifest(old)
    assert read.decoder.kind == "gluoncv" and read.classes == ("a",)
    assert read.preprocessing == preset("imagenet").preprocessing
    with pytest.raises(PackageError, match="`decoder` should be one of"):
        from_manifest({**old, "decoder": {"kind": "yolo"}})


def test_box_nms_rows_decode_as_gluoncvs_three_outputs():
    """A graph ending in box_nms has one output of rows (id, score, x1, y1, x2, y2): the
    gluoncv decoder reads it as it reads the three outputs GluonCV's detectors split it
    into; another output count is one error naming what it found and what to deploy."""
    rows = np.array([[[1, 0.9, 10, 20, 30, 40], [0, 0.7, 5, 5, 50, 60], [-1, -1, 0, 0, 0, 0],
                      [2, 0.2, 1, 1, 2, 2]]], np.float32)  # fmt: skip
    split = [rows[..., 0:1], rows[..., 1:2], rows[..., 2:6]]
    names = ["cat", "dog", "car"]
    one = detections([rows], names, (64, 64), (128, 256), 0.5)
    assert one == detections(split, names, (64, 64), (128, 256), 0.5)
    assert [(d.label, round(d.score, 3)) for d in one] == [("dog", 0.9), ("cat", 0.7)]
    assert one[0].box == (40.0, 40.0, 120.0, 80.0)  # scaled from 64x64 to 128 x 256
    with pytest.raises(EdgecvError, match=r"found outputs \[1, 4, 5\], \[1, 4\].*--decoder tensor"):
        detections([rows[..., :5], rows[..., 0]], names, (64, 64), (128, 256))
