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


def preprocess(image_bgr: np.ndarray, spec: dict[str, Any], shape: tuple[int, ...]) -> np.ndarray:
    """BGR uint8 image -> the model's NCHW float input, as the manifest describes."""
    height, width = shape[2], shape[3]
    cv2 = opencv()
    resized = cv2.resize(image_bgr, (width, height), interpolation=cv2.INTER_LINEAR)
    rgb = resized[:, :, ::-1] if spec.get("color", "RGB") == "RGB" else resized
    x = rgb.astype(np.float32) * np.float32(spec.get("scale", 1.0))
    x = (x - np.asarray(spec["mean"], np.float32)) / np.asarray(spec["std"], np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


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
    """GluonCV detector outputs (ids, scores, boxes) -> detections above ``threshold``."""
    ids, scores, boxes = (o[0] for o in outputs[:3])
    sy, sx = image_hw[0] / input_hw[0], image_hw[1] / input_hw[1]
    found = []
    for cid, score, box in zip(
        ids.reshape(-1),
        scores.reshape(-1),
        boxes.reshape(-1, 4),
    ):
        if cid < 0 or score < threshold:
            continue
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
