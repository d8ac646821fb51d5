"""A model's outputs -> results, as its :class:`~edgecv.board.processing.Decoder` says: top-k
classes, or :class:`~edgecv.board.imaging.Detection` boxes in the original image's pixels.

Detectors: GluonCV's (ids, scores, boxes) and torchvision's (boxes, labels, scores; the
integer one is the labels, as SSD, RetinaNet and FCOS export boxes, scores, labels; rows
past the kept ones, in edgecv's fixed-size outputs, have score -1 and label -1) in input
pixels of a stretched image; Ultralytics' raw head ``[1, 4+C, N]`` (cx, cy, w, h,
C class scores, no objectness) decoded here with per-class NMS as Ultralytics does, and
its end-to-end head ``[1, N, 6]`` (x1, y1, x2, y2, score, class), both in letterboxed
input pixels. NumPy only (board side).
"""

from __future__ import annotations

import numpy as np

from .imaging import Detection, detections, top_k, unletterbox
from .processing import Processing

# Ultralytics' limits: at most this many boxes into NMS and out of it; the offset that
# keeps classes apart in one NMS (larger than any image side)
MAX_NMS = 30000
MAX_DETECTIONS = 300
CLASS_OFFSET = 7680.0


def nms(boxes: np.ndarray, scores: np.ndarray, iou: float) -> np.ndarray:
    """Greedy NMS: indices of the kept ``boxes`` (x1, y1, x2, y2), best score first; a box
    is dropped when its IoU with a kept one is above ``iou`` (ties: the lower index first)."""
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    order = np.argsort(-np.asarray(scores, np.float64), kind="stable")
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    kept = []
    while order.size:
        best, rest = order[0], order[1:]
        kept.append(best)
        x1 = np.maximum(boxes[best, 0], boxes[rest, 0])
        y1 = np.maximum(boxes[best, 1], boxes[rest, 1])
        x2 = np.minimum(boxes[best, 2], boxes[rest, 2])
        y2 = np.minimum(boxes[best, 3], boxes[rest, 3])
        inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
        union = areas[best] + areas[rest] - inter
        with np.errstate(invalid="ignore", divide="ignore"):
            overlap = np.where(union > 0, inter / union, 0.0)
        order = rest[overlap <= iou]
    return np.asarray(kept, dtype=np.int64)


def ultralytics_raw(
    head: np.ndarray, confidence: float, iou: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ultralytics' raw head ``[1, 4+C, N]`` -> (boxes x1y1x2y2, scores, classes) after
    per-class NMS, in input pixels, best first: each anchor's best class, those above
    ``confidence``, at most :data:`MAX_NMS` into NMS and :data:`MAX_DETECTIONS` out."""
    rows = np.asarray(head, np.float32)[0].T  # N x (4 + C)
    if rows.shape[1] < 5:
        raise ValueError(f"an Ultralytics head has 4 + classes rows, got {rows.shape[1]}")
    scores_all = rows[:, 4:]
    classes = scores_all.argmax(axis=1)
    scores = scores_all[np.arange(len(rows)), classes]
    with np.errstate(invalid="ignore"):
        keep = np.flatnonzero(np.isfinite(rows).all(axis=1) & (scores > confidence))
    keep = keep[np.argsort(-scores[keep], kind="stable")][:MAX_NMS]
    cx, cy, w, h = (rows[keep, i].astype(np.float64) for i in range(4))
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    shifted = boxes + classes[keep, None] * CLASS_OFFSET
    chosen = nms(shifted, scores[keep], iou)[:MAX_DETECTIONS]
    return boxes[chosen], scores[keep][chosen].astype(np.float64), classes[keep][chosen]


def _found(boxes, scores, classes, names, threshold: float) -> list[Detection]:
    out = []
    for box, score, cid in zip(boxes, scores, classes):
        if not (np.isfinite(score) and score >= threshold and np.isfinite(cid) and cid >= 0):
            continue
        label = names[int(cid)] if int(cid) < len(names) else f"class {int(cid)}"
        out.append(Detection(label, float(score), tuple(float(v) for v in box)))
    return out


def _stretch_back(boxes: np.ndarray, image_hw, input_hw) -> np.ndarray:
    out = np.asarray(boxes, np.float64).reshape(-1, 4).copy()
    out[:, 0::2] = np.clip(out[:, 0::2] * image_hw[1] / input_hw[1], 0.0, image_hw[1] - 1.0)
    out[:, 1::2] = np.clip(out[:, 1::2] * image_hw[0] / input_hw[0], 0.0, image_hw[0] - 1.0)
    return out


def decode_detections(
    outputs: list[np.ndarray],
    processing: Processing,
    input_hw: tuple[int, int],
    image_hw: tuple[int, int],
    threshold: float | None = None,
) -> list[Detection]:
    """A detector's outputs -> detections scored ``threshold`` or more (the decoder's
    ``confidence`` for Ultralytics, 0.5 otherwise, when ``None``), best first for the
    Ultralytics heads."""
    kind, names = processing.decoder.kind, list(processing.classes or ())
    letterboxed = processing.preprocessing.resize == "letterbox"

    def back(boxes):
        if letterboxed:
            return unletterbox(boxes, image_hw, input_hw)
        return _stretch_back(boxes, image_hw, input_hw)

    if kind == "ultralytics":
        floor = processing.decoder.confidence if threshold is None else threshold
        boxes, scores, classes = ultralytics_raw(outputs[0], floor, processing.decoder.iou)
        return _found(back(boxes), scores, classes, names, floor)
    threshold = (
        (processing.decoder.confidence if kind == "ultralytics-nms" else 0.5)
        if (threshold is None)
        else threshold
    )
    if kind == "ultralytics-nms":
        rows = np.asarray(outputs[0], np.float64).reshape(-1, 6)
        order = np.argsort(-rows[:, 4], kind="stable")
        rows = rows[order]
        return _found(back(rows[:, :4]), rows[:, 4], rows[:, 5], names, threshold)
    if kind == "torchvision":
        boxes, labels, scores = (np.asarray(o) for o in outputs[:3])
        if np.issubdtype(scores.dtype, np.integer) and not np.issubdtype(labels.dtype, np.integer):
            labels, scores = scores, labels  # SSD, RetinaNet, FCOS: (boxes, scores, labels)
        n = min(len(boxes.reshape(-1, 4)), labels.size, scores.size)
        boxes = boxes.reshape(-1, 4)[:n]
        labels = labels.reshape(-1)[:n].astype(np.float64)
        return _found(back(boxes), scores.reshape(-1)[:n], labels, names, threshold)
    # GluonCV's, as every package before decoders had it
    return detections(outputs, names, input_hw, image_hw, threshold)


def decode(
    outputs: list[np.ndarray],
    processing: Processing,
    input_hw: tuple[int, int],
    image_hw: tuple[int, int],
    threshold: float | None = None,
    k: int = 5,
) -> list[Detection] | list[tuple[str, float]] | list[np.ndarray]:
    """Results of one image: top-k ``(label, probability)`` for a classifier, detections
    for a detector, the outputs themselves for ``tensor``."""
    kind, names = processing.decoder.kind, list(processing.classes or ())
    if kind == "logits":
        return top_k(outputs[0], names, k)
    if kind == "probabilities":
        p = np.asarray(outputs[0], np.float64).reshape(outputs[0].shape[0], -1)[0]
        order = np.argsort(-p, kind="stable")[:k]
        return [(names[i] if i < len(names) else f"class {i}", float(p[i])) for i in order]
    if kind == "tensor":
        return outputs
    return decode_detections(outputs, processing, input_hw, image_hw, threshold)


__all__ = ["decode", "decode_detections", "nms", "ultralytics_raw"]
