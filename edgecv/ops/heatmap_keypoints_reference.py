"""NumPy reference of turning per-box keypoint heatmaps into keypoints, as torchvision's
Keypoint R-CNN does after its detections (``heatmaps_to_keypoints``), written for
clarity.

Semantics (torchvision 0.29, ``roi_heads._onnx_heatmaps_to_keypoints``, the form its
ONNX export writes and ONNX Runtime computes):

- ``maps`` is ``(K, J, S, S)``: each detection's ``J`` heatmaps; ``boxes`` ``(K, 4)``
  float ``x1, y1, x2, y2`` in the image's pixels; ``scores`` ``(K,)``, a row with a
  negative score (edgecv's padding) giving keypoints and scores 0.
- A box's size is ``w = max(x2 - x1, 1)``, ``h = max(y2 - y1, 1)``; each heatmap is
  resized to ``ceil(h)`` rows and ``ceil(w)`` columns, bicubic (``a = -0.75``,
  ``align_corners=False``: the source coordinate ``(d + 0.5) * S / n - 0.5``, the four
  taps clamped to the map), and its first largest pixel (row-major) ``(x_i, y_i)`` is
  the keypoint ``x = (x_i + 0.5) * w / ceil(w) + x1``, ``y = (y_i + 0.5) * h / ceil(h)
  + y1``, visibility 1; its score is the resized map's value there.
- The outputs are keypoints ``(K, 3, J)`` (x, y, visibility: the layout of
  torchvision's loop, transposed after it) and scores ``(K, J)``, float32.
"""

from __future__ import annotations

import numpy as np

CUBIC_A = -0.75  # PyTorch's bicubic, and ONNX Resize's cubic_coeff_a as PyTorch exports it


def cubic_weights(t: np.ndarray, a: float = CUBIC_A) -> np.ndarray:
    """The four taps' weights (at offsets -1, 0, 1, 2) for fractions ``t`` in [0, 1)."""

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], -1)


def resize_bicubic(image: np.ndarray, rows: int, columns: int) -> np.ndarray:
    """``image (S, T)`` resized to ``(rows, columns)``: bicubic, ``align_corners=False``,
    taps outside the image clamped to its edge (PyTorch's ``interpolate``, ONNX's
    ``half_pixel`` cubic)."""

    def matrix(n_in: int, n_out: int) -> np.ndarray:
        source = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
        base = np.floor(source)
        weights = cubic_weights(source - base)
        out = np.zeros((n_out, n_in))
        for tap in range(4):
            index = np.clip(base.astype(np.int64) + tap - 1, 0, n_in - 1)
            np.add.at(out, (np.arange(n_out), index), weights[:, tap])
        return out

    return matrix(image.shape[0], rows) @ image @ matrix(image.shape[1], columns).T


def heatmap_keypoints_reference(
    maps: np.ndarray, boxes: np.ndarray, scores: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Keypoints ``(K, 3, J)`` and their scores ``(K, J)`` (module docstring)."""
    count, joints = maps.shape[:2]
    keypoints = np.zeros((count, 3, joints), np.float32)
    values = np.zeros((count, joints), np.float32)
    for k in range(count):
        if scores[k] < 0:
            continue
        x1, y1, x2, y2 = (float(v) for v in boxes[k])
        width, height = max(x2 - x1, 1.0), max(y2 - y1, 1.0)
        columns, rows = int(np.ceil(width)), int(np.ceil(height))
        for j in range(joints):
            resized = resize_bicubic(maps[k, j].astype(np.float64), rows, columns)
            y, x = np.unravel_index(int(np.argmax(resized)), resized.shape)
            keypoints[k, :, j] = [(x + 0.5) * width / columns + x1,
                                  (y + 0.5) * height / rows + y1, 1]  # fmt: skip
            values[k, j] = resized[y, x]
    return keypoints, values
