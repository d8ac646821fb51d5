"""NumPy reference of pasting per-box masks into the image, as torchvision's Mask R-CNN
does after its detections (``paste_masks_in_image``), written for clarity.

Semantics (torchvision 0.29, ``roi_heads._onnx_paste_mask_in_image``, the form its ONNX
export writes and ONNX Runtime computes):

- ``masks`` is ``(K, 1, S, S)``: each detection's mask already padded by torchvision's
  one pixel of zeros; ``boxes`` ``(K, 4)`` integer ``x1, y1, x2, y2``, already expanded
  by the padding's scale and truncated toward zero, in the image's pixels; ``scores``
  ``(K,)``, a row with a negative score (edgecv's padding) pasting nothing.
- A box's mask is resized to ``h = max(y2 - y1 + 1, 1)`` rows and ``w = max(x2 - x1 +
  1, 1)`` columns, bilinear with ``align_corners=False`` (a source coordinate ``(d + 0.5)
  * S / n - 0.5`` clamped to ``[0, S - 1]``), and written at rows ``y1..y2`` and columns
  ``x1..x2``, the part outside the ``height x width`` image cut off; everything else is 0.
- The output is ``(K, height, width)`` float32.
"""

from __future__ import annotations

import numpy as np


def resize_bilinear(image: np.ndarray, rows: int, columns: int) -> np.ndarray:
    """``image (S, T)`` resized to ``(rows, columns)``: bilinear, ``align_corners=False``
    (PyTorch's ``interpolate``, ONNX's ``half_pixel``), the source clamped at the edges."""

    def taps(n_in: int, n_out: int):
        source = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
        source = np.clip(source, 0, n_in - 1)
        low = np.minimum(np.floor(source).astype(np.int64), n_in - 1)
        high = np.minimum(low + 1, n_in - 1)
        return low, high, source - low

    y0, y1, fy = taps(image.shape[0], rows)
    x0, x1, fx = taps(image.shape[1], columns)
    top = image[y0][:, x0] * (1 - fx) + image[y0][:, x1] * fx
    bottom = image[y1][:, x0] * (1 - fx) + image[y1][:, x1] * fx
    return top * (1 - fy)[:, None] + bottom * fy[:, None]


def paste_masks_reference(
    masks: np.ndarray, boxes: np.ndarray, scores: np.ndarray, height: int, width: int
) -> np.ndarray:
    """The masks pasted into ``(K, height, width)`` (module docstring)."""
    out = np.zeros((len(masks), height, width), np.float32)
    for k, (mask, box, score) in enumerate(zip(masks, boxes, scores, strict=True)):
        if score < 0:
            continue
        x1, y1, x2, y2 = (int(v) for v in box)
        resized = resize_bilinear(mask[0].astype(np.float64), max(y2 - y1 + 1, 1),
                                  max(x2 - x1 + 1, 1))  # fmt: skip
        top, bottom = max(y1, 0), min(y2 + 1, height)
        left, right = max(x1, 0), min(x2 + 1, width)
        if top < bottom and left < right:
            out[k, top:bottom, left:right] = resized[top - y1 : bottom - y1, left - x1 : right - x1]
    return out
