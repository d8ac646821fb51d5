"""NumPy reference of MXNet's ``_contrib_box_nms`` (first output), written for clarity.

Semantics (checked against MXNet 1.9.1's operator, see tests/ops/test_box_nms.py):

- ``data`` is ``(..., N, K)``; leading dimensions are batches, each row a box with a
  score at ``score_index``, four coordinates from ``coord_start`` and, when
  ``id_index >= 0``, a class id.
- A box is valid when ``score > valid_thresh`` (compared in float32) and, when
  ``id_index >= 0``, its id differs from ``background_id`` (default -1, so rows with
  id -1 are dropped).
- Valid boxes are sorted by score, descending; equal scores keep their input order
  (a stable sort). Only the first ``topk`` (all when ``topk < 0``) take part.
- Greedy suppression in that order: a kept box removes every later box whose IoU with
  it is above ``overlap_thresh``, of the same class unless ``force_suppress`` or
  ``id_index < 0``. Classes compare as integers, the ids truncated toward zero (1.2 and
  1.7 are one class, -0.5 and 0.3 another); the background test compares the float id.
  IoU uses widths ``max(0, x2 - x1)`` (no +1); a zero union gives 0.
- The output has the input's shape: kept rows, in sorted order, first; then rows of
  -1. Kept rows are converted from ``in_format`` to ``out_format`` (corner is
  ``x1, y1, x2, y2``; center is ``cx, cy, w, h``).
"""

from __future__ import annotations

import numpy as np

FORMATS = ("corner", "center")


def check_box_nms_attrs(
    num_fields: int,
    coord_start: int,
    score_index: int,
    id_index: int,
    in_format: str,
    out_format: str,
) -> None:
    """Raise ValueError naming the attribute when one does not fit the data."""
    if in_format not in FORMATS:
        raise ValueError(f"box_nms: in_format must be one of {FORMATS}, found {in_format!r}")
    if out_format not in FORMATS:
        raise ValueError(f"box_nms: out_format must be one of {FORMATS}, found {out_format!r}")
    if not 0 <= coord_start <= num_fields - 4:
        raise ValueError(
            f"box_nms: coord_start={coord_start} needs 4 coordinates inside rows of "
            f"{num_fields} values (expected 0..{num_fields - 4})"
        )
    if not 0 <= score_index < num_fields:
        raise ValueError(f"box_nms: score_index={score_index} is outside rows of {num_fields}")
    if id_index >= num_fields:
        raise ValueError(f"box_nms: id_index={id_index} is outside rows of {num_fields}")


def to_corner(box: np.ndarray, fmt: str) -> np.ndarray:
    if fmt == "corner":
        return box
    cx, cy, w, h = box[..., 0], box[..., 1], box[..., 2], box[..., 3]
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1)


def from_corner(box: np.ndarray, fmt: str) -> np.ndarray:
    if fmt == "corner":
        return box
    x1, y1, x2, y2 = box[..., 0], box[..., 1], box[..., 2], box[..., 3]
    return np.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], axis=-1)


def iou(a: np.ndarray, b: np.ndarray) -> float:
    """IoU of two corner boxes, the way MXNet computes it (float32, no +1)."""
    iw = max(np.float32(0), min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(np.float32(0), min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    area_a = max(np.float32(0), a[2] - a[0]) * max(np.float32(0), a[3] - a[1])
    area_b = max(np.float32(0), b[2] - b[0]) * max(np.float32(0), b[3] - b[1])
    union = area_a + area_b - inter
    return float(inter / union) if union > 0 else 0.0


def box_nms_reference(
    data: np.ndarray,
    overlap_thresh: float = 0.5,
    valid_thresh: float = 0.0,
    topk: int = -1,
    coord_start: int = 2,
    score_index: int = 1,
    id_index: int = -1,
    background_id: int = -1,
    force_suppress: bool = False,
    in_format: str = "corner",
    out_format: str = "corner",
) -> np.ndarray:
    """MXNet ``box_nms`` in plain NumPy (see the module docstring)."""
    data = np.asarray(data)
    check_box_nms_attrs(data.shape[-1], coord_start, score_index, id_index, in_format, out_format)
    batches = data.reshape(-1, data.shape[-2], data.shape[-1])
    out = np.full_like(batches, -1)
    thresh = np.float32(valid_thresh)
    for b, rows in enumerate(batches):
        valid = [
            i
            for i in range(rows.shape[0])
            if rows[i, score_index] > thresh
            and (id_index < 0 or rows[i, id_index] != background_id)
        ]
        order = sorted(valid, key=lambda i: -rows[i, score_index])  # sorted() is stable
        if topk >= 0:
            order = order[:topk]
        boxes = to_corner(rows[:, coord_start : coord_start + 4], in_format)
        kept: list[int] = []
        for i in order:
            suppressed = any(
                (force_suppress or id_index < 0 or int(rows[k, id_index]) == int(rows[i, id_index]))
                and iou(boxes[k], boxes[i]) > overlap_thresh
                for k in kept
            )
            if not suppressed:
                kept.append(i)
        for pos, i in enumerate(kept):
            out[b, pos] = rows[i]
            if in_format != out_format:
                out[b, pos, coord_start : coord_start + 4] = from_corner(
                    to_corner(rows[i, coord_start : coord_start + 4], in_format), out_format
                )
    return out.reshape(data.shape)
