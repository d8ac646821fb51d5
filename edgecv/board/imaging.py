"""Images in and results out: preprocessing, top-k classes, detections, drawing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import EdgecvError


def opencv():
    """OpenCV, imported on first use: a board that only runs tensors needs none."""
    try:
        import cv2
    except ImportError:
        raise EdgecvError(
            "decoding, resizing and drawing images needs OpenCV, which is not installed: "
            "pip install 'edgecv[images]' (or feed tensors: `edgecv run PKG --input x.npy`)"
        ) from None
    return cv2


def read_image(path: str | Path) -> np.ndarray:
    """Read an image file as an HxWx3 uint8 BGR array (OpenCV's convention)."""
    cv2 = opencv()
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        raise EdgecvError(f"cannot read image {path}: missing or not an image OpenCV can decode")
    return image


_WANTED = "pass an HxWx3 uint8 BGR image, as cv2.imread returns"


def bgr_image(image: Any) -> np.ndarray:
    """``image`` as the HxWx3 uint8 BGR array :func:`preprocess` takes.

    Converted as OpenCV converts an image it reads (``cv2.IMREAD_COLOR``): a grayscale
    image (HxW or HxWx1) has its channel repeated; a 4-channel one is BGRA (OpenCV's
    order, what ``cv2.IMREAD_UNCHANGED`` reads) and loses its alpha. Anything else is
    one :class:`~edgecv.board.errors.EdgecvError` naming what was given and what to pass: not
    an array, an empty image, another number of channels, and any dtype but uint8 (a
    float image may hold 0-1 or 0-255 values, and preprocessing cannot tell which).
    An image that is already right is returned as it is, without a copy.
    """
    if not isinstance(image, np.ndarray):
        hint = ""
        if image is None:
            hint = " (cv2.imread returns None for a file it cannot read)"
        elif isinstance(image, (str, Path)):
            hint = " (a file name: read it with edgecv.board.imaging.read_image or cv2.imread)"
        raise EdgecvError(
            f"the image is {type(image).__name__}, not a NumPy array{hint}: {_WANTED}"
        )
    shape = image.shape
    if image.ndim not in (2, 3):
        raise EdgecvError(f"the image is {image.ndim}-d, shape {shape}: {_WANTED}")
    if image.size == 0:
        raise EdgecvError(f"the image is empty, shape {shape}: {_WANTED}")
    channels = 1 if image.ndim == 2 else shape[2]
    if channels not in (1, 3, 4):
        raise EdgecvError(
            f"the image has {channels} channels, shape {shape}: {_WANTED} (or grayscale "
            "HxW, or BGRA HxWx4)"
        )
    if image.dtype != np.uint8:
        raise EdgecvError(_dtype_message(image.dtype))
    image = np.ascontiguousarray(image)  # OpenCV takes a view only in C order
    if channels == 3:
        return image
    cv2 = opencv()
    return cv2.cvtColor(image, cv2.COLOR_GRAY2BGR if channels == 1 else cv2.COLOR_BGRA2BGR)


def _dtype_message(dtype: np.dtype) -> str:
    """Why an image of ``dtype`` is refused, and how to make it uint8."""
    if dtype.kind == "f":
        how = (
            "np.clip(image * 255, 0, 255).round().astype(np.uint8) for values in [0, 1], "
            "image.clip(0, 255).astype(np.uint8) for values in [0, 255]"
        )
    elif dtype == np.uint16:
        how = "(image >> 8).astype(np.uint8), as cv2.imread does with a 16-bit image"
    else:
        how = "image.astype(np.uint8) where its values are 0-255 pixels"
    return (
        f"the image has dtype {dtype}, predict() takes uint8 pixels (0-255): convert it "
        f"({how}), or call run() with a tensor you prepared"
    )


def preprocess(image_bgr: np.ndarray, spec: dict[str, Any], shape: tuple[int, ...]) -> np.ndarray:
    """BGR uint8 image -> the model's NCHW float input, as the manifest's
    ``preprocessing`` section describes (:class:`edgecv.board.processing.Preprocessing`):
    stretched to the input size, or letterboxed (:func:`letterbox_geometry`), in the
    model's colour order, times ``scale``, less ``mean``, over ``std`` (grayscale and
    BGRA images converted first: :func:`bgr_image`)."""
    height, width = shape[2], shape[3]
    cv2 = opencv()
    image_bgr = bgr_image(image_bgr)
    if spec.get("resize", "stretch") == "letterbox":
        resized = letterbox(image_bgr, (height, width), float(spec.get("pad", 114.0)))
    else:
        resized = cv2.resize(image_bgr, (width, height), interpolation=cv2.INTER_LINEAR)
    rgb = resized[:, :, ::-1] if spec.get("color", "RGB") == "RGB" else resized
    x = rgb.astype(np.float32) * np.float32(spec.get("scale", 1.0))
    x = (x - np.asarray(spec["mean"], np.float32)) / np.asarray(spec["std"], np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def letterbox_geometry(
    image_hw: tuple[int, int], input_hw: tuple[int, int]
) -> tuple[float, tuple[int, int], tuple[int, int]]:
    """(ratio, (new_h, new_w), (top, left)): the image scaled by ``ratio`` (aspect
    kept, the largest that fits) to new_h x new_w, placed at (top, left) of the input
    (centred, the odd pixel of the border at the bottom/right, as Ultralytics does)."""
    ratio = min(input_hw[0] / image_hw[0], input_hw[1] / image_hw[1])
    new_h, new_w = int(round(image_hw[0] * ratio)), int(round(image_hw[1] * ratio))
    top = int(round((input_hw[0] - new_h) / 2 - 0.1))
    left = int(round((input_hw[1] - new_w) / 2 - 0.1))
    return ratio, (new_h, new_w), (top, left)


def letterbox(image: np.ndarray, input_hw: tuple[int, int], pad: float) -> np.ndarray:
    """``image`` resized into ``input_hw`` with its aspect kept, on a ``pad`` border."""
    cv2 = opencv()
    _, (new_h, new_w), (top, left) = letterbox_geometry(image.shape[:2], input_hw)
    out = np.full((input_hw[0], input_hw[1], image.shape[2]), pad, dtype=image.dtype)
    if (new_h, new_w) != image.shape[:2]:
        image = cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    out[top : top + new_h, left : left + new_w] = image
    return out


def unletterbox(
    boxes: np.ndarray, image_hw: tuple[int, int], input_hw: tuple[int, int]
) -> np.ndarray:
    """x1, y1, x2, y2 boxes in letterboxed input pixels -> the original image's pixels,
    clipped to it (the inverse of :func:`letterbox`)."""
    ratio, _, (top, left) = letterbox_geometry(image_hw, input_hw)
    out = np.asarray(boxes, np.float64).reshape(-1, 4).copy()
    out[:, 0::2] = np.clip((out[:, 0::2] - left) / ratio, 0.0, image_hw[1] - 1.0)
    out[:, 1::2] = np.clip((out[:, 1::2] - top) / ratio, 0.0, image_hw[0] - 1.0)
    return out


def top_k(logits: np.ndarray, classes: list[str], k: int = 5) -> list[tuple[str, float]]:
    """The k most probable classes (softmax of the logits) of the first batch item."""
    z = logits.reshape(logits.shape[0], -1)[0].astype(np.float64)
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")[:k]
    return [(classes[i] if i < len(classes) else f"class {i}", float(probs[i])) for i in order]


@dataclass
class Detection:
    label: str
    score: float
    box: tuple[float, float, float, float]  # x1, y1, x2, y2 in original image pixels


def detections(
    outputs: list[np.ndarray],
    classes: list[str],
    input_hw: tuple[int, int],
    image_hw: tuple[int, int],
    threshold: float = 0.5,
) -> list[Detection]:
    """GluonCV detector outputs (ids, scores, boxes) -> detections above ``threshold``.
    One output of rows ``[B, N, 6]`` is ``box_nms``'s own (id, score, x1, y1, x2, y2:
    GluonCV's layout, a graph ending in the NMS). A row with a NaN or infinite id, score
    or box (a model gone wrong: untrained or overflowing weights) is no detection: NaN
    passes no comparison and has no int."""
    if len(outputs) == 1 and outputs[0].ndim == 3 and outputs[0].shape[-1] == 6:
        rows = outputs[0]
        outputs = [rows[..., 0:1], rows[..., 1:2], rows[..., 2:6]]
    if len(outputs) < 3:
        shapes = ", ".join(str(list(o.shape)) for o in outputs)
        raise EdgecvError(
            f"the gluoncv decoder reads a detector's ids, scores and boxes (or box_nms's "
            f"rows [B, N, 6]), found outputs {shapes}; deploy with --decoder tensor to "
            f"get the outputs as they are"
        )
    ids, scores, boxes = (o[0] for o in outputs[:3])
    ids, scores, boxes = ids.reshape(-1), scores.reshape(-1), boxes.reshape(-1, 4)
    n = min(len(ids), len(scores), len(boxes))
    ids, scores, boxes = ids[:n], scores[:n], boxes[:n]
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(ids) & np.isfinite(scores) & np.isfinite(boxes).all(axis=1)
        kept = np.flatnonzero(finite & (ids >= 0) & (scores >= threshold))
    sy, sx = image_hw[0] / input_hw[0], image_hw[1] / input_hw[1]
    found = []
    for cid, score, box in zip(ids[kept], scores[kept], boxes[kept]):
        label = classes[int(cid)] if int(cid) < len(classes) else f"class {int(cid)}"
        x1, y1, x2, y2 = (float(v) for v in box)
        height, width = image_hw
        # Boxes may reach past the image (or be garbage from untrained weights): clip.
        x1, x2 = (min(max(v * sx, 0.0), width - 1.0) for v in (x1, x2))
        y1, y2 = (min(max(v * sy, 0.0), height - 1.0) for v in (y1, y2))
        found.append(Detection(label, float(score), (x1, y1, x2, y2)))
    return found


BOX_BGR = (0, 200, 255)  # boxes and their labels' backgrounds


def draw_label(
    image: np.ndarray,
    text: str,
    corner: tuple[int, int],
    color: tuple[int, int, int] = (0, 0, 0),
    background: tuple[int, int, int] = BOX_BGR,
    scale: float = 0.5,
) -> tuple[int, int]:
    """Draw ``text`` on a filled rectangle whose top-left is ``corner`` (moved inside the
    image), in place: readable on any photo. Returns the rectangle's size."""
    cv2 = opencv()
    font = cv2.FONT_HERSHEY_SIMPLEX
    (width, height), baseline = cv2.getTextSize(text, font, scale, 1)
    width, height = width + 6, height + baseline + 4
    x = min(max(corner[0], 0), max(image.shape[1] - width, 0))
    y = min(max(corner[1], 0), max(image.shape[0] - height, 0))
    cv2.rectangle(image, (x, y), (x + width - 1, y + height - 1), background, cv2.FILLED)
    cv2.putText(image, text, (x + 3, y + height - baseline - 2), font, scale, color, 1, cv2.LINE_AA)
    return width, height


def draw(image_bgr: np.ndarray, found: list[Detection], fps: float | None = None) -> np.ndarray:
    """A copy of the image with boxes, labels and (optionally) the frame rate drawn on it.

    Each label sits on a box-coloured tab above its box (inside it at the image's top
    edge); the frame rate is green on black in the top-left corner, drawn last.
    """
    cv2 = opencv()
    out = image_bgr.copy()
    for det in found:
        x1, y1, x2, y2 = (int(round(v)) for v in det.box)
        cv2.rectangle(out, (x1, y1), (x2, y2), BOX_BGR, 2)
        text = f"{det.label} {det.score:.2f}"
        (_, height), baseline = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, 0.5, 1)
        above = y1 - 1 - (height + baseline + 4)
        draw_label(out, text, (x1 - 1, above if above >= 0 else y1 + 1))
    if fps is not None:
        draw_label(out, f"{fps:.1f} FPS", (4, 4), (0, 255, 0), (0, 0, 0), scale=0.6)
    return out
