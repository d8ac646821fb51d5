"""Per-box keypoint heatmaps turned into keypoints, as torchvision's Keypoint R-CNN does
after its detections: fixed-size, ``(K, J, S, S)`` heatmaps -> keypoints ``(K, 3, J)``
and their scores ``(K, J)``.

The semantics are :mod:`.heatmap_keypoints_reference`'s. torchvision (and its ONNX
export, a ``Loop`` over the detections) resizes each box's heatmaps to the box's size, a
shape per box, and takes each one's argmax; here the argmax runs over a fixed grid as
large as the largest box (``height x width``: the image's), the pixels outside the box's
resized size skipped, each pixel's bicubic value computed from the heatmap where it is
read. Coordinates are computed as ONNX Runtime's ``Resize`` computes them from output
sizes (``(d + 0.5) / (n / S) - 0.5`` in float32), so the two agree to rounding; a tie
takes the first pixel in row-major order, as ONNX's ``ArgMax`` does.

Three ``te.compute`` stages: the heatmaps resized along x (separable: 4 + 4 taps a
pixel, not 16), the argmax (a reduction of (index, value) pairs over the rows resized
from them) and the keypoints from it.
"""

from __future__ import annotations

from tvm import te, tirx

from .heatmap_keypoints_reference import CUBIC_A


def _check(maps_shape, boxes_shape, scores_shape, height: int, width: int) -> None:
    count = maps_shape[0]
    if len(maps_shape) != 4 or maps_shape[2] != maps_shape[3]:
        raise ValueError(
            f"heatmap_keypoints: heatmaps must be (K, J, S, S), found {tuple(maps_shape)}"
        )
    if tuple(boxes_shape) != (count, 4) or tuple(scores_shape) != (count,):
        raise ValueError(
            f"heatmap_keypoints: boxes must be ({count}, 4) and scores ({count},) for "
            f"heatmaps {tuple(maps_shape)}, found {tuple(boxes_shape)} and {tuple(scores_shape)}"
        )
    if height < 1 or width < 1:
        raise ValueError(f"heatmap_keypoints: the largest box {height}x{width} must be 1x1 or more")


def _cubic(t, dtype: str) -> list:
    """The four taps' weights for the fraction ``t`` (see the reference)."""
    a = tirx.const(CUBIC_A, dtype)
    one, two, three = (tirx.const(v, dtype) for v in (1.0, 2.0, 3.0))
    five, four, eight = (tirx.const(v, dtype) for v in (5.0, 4.0, 8.0))

    def near(x):
        return ((a + two) * x - (a + three)) * x * x + one

    def far(x):
        return ((a * x - five * a) * x + eight * a) * x - four * a

    return [far(t + one), near(t), near(one - t), far(two - t)]


def heatmap_keypoints(
    maps: te.Tensor, boxes: te.Tensor, scores: te.Tensor, height: int, width: int
) -> tuple[te.Tensor, te.Tensor]:
    """``maps (K, J, S, S)``, ``boxes (K, 4)``, ``scores (K,)`` -> keypoints ``(K, 3,
    J)`` and scores ``(K, J)``; boxes at most ``height x width`` (module docstring)."""
    shapes = [[int(d) for d in t.shape] for t in (maps, boxes, scores)]
    _check(*shapes, height, width)
    count, joints, side, _ = shapes[0]
    dtype = maps.dtype
    one, half = tirx.const(1.0, dtype), tirx.const(0.5, dtype)

    def extent(k, lo, hi):
        """The box's side (at least 1) and its resized map's length, ``ceil`` of it."""
        size = tirx.max(boxes[k, hi] - boxes[k, lo], one)
        return size, tirx.ceil(size)

    def taps(d, length):
        """The four clamped source indices and weights of output pixel ``d``."""
        scale = length / tirx.const(side, dtype)
        source = (d.astype(dtype) + half) / scale - half
        base = tirx.floor(source)
        weights = _cubic(source - base, dtype)
        first = base.astype("int32")
        index = [tirx.min(tirx.max(first + (t - 1), 0), side - 1) for t in range(4)]
        return index, weights

    # separable: each heatmap row resized along x first (K, J, S, width), then 4 rows
    # of that per pixel: 4 + 4 taps a pixel where the 2-D sum reads 16
    def along_x(k, j, r, x):
        columns, wx = taps(x, extent(k, 0, 2)[1])
        total = tirx.const(0.0, dtype)
        for c, b in zip(columns, wx, strict=True):
            total = total + b * maps[k, j, r, c]
        return total

    wide = te.compute((count, joints, side, width), along_x, name="heatmap_columns")

    def value(k, j, y, x):
        rows, wy = taps(y, extent(k, 1, 3)[1])
        total = tirx.const(0.0, dtype)
        for r, a in zip(rows, wy, strict=True):
            total = total + a * wide[k, j, r, x]
        return total

    def combine(x, y):  # (index, value) pairs: the larger value, the first index on ties
        take = tirx.any(y[1] > x[1], tirx.all(y[1] == x[1], y[0] < x[0]))
        return tirx.Select(take, y[0], x[0]), tirx.Select(take, y[1], x[1])

    def identity(index_dtype, value_dtype):
        return tirx.const(-1, index_dtype), tirx.min_value(value_dtype)

    argmax = te.comm_reducer(combine, identity, name="argmax")
    ry, rx = te.reduce_axis((0, height), "ry"), te.reduce_axis((0, width), "rx")

    def best(k, j):
        columns = extent(k, 0, 2)[1].astype("int32")
        inside = tirx.all(ry < extent(k, 1, 3)[1].astype("int32"), rx < columns)
        # a select, not the reduction's ``where``: TVM dropped that for a tuple reduction
        candidate = tirx.Select(inside, value(k, j, ry, rx), tirx.min_value(dtype))
        return argmax((ry * columns + rx, candidate), axis=[ry, rx])

    position, peak = te.compute((count, joints), best, name="keypoint_argmax")
    valid = lambda k: scores[k] >= tirx.const(0, scores.dtype)  # noqa: E731

    def keypoint(k, field, j):
        (width_k, columns), (height_k, rows) = extent(k, 0, 2), extent(k, 1, 3)
        wide = columns.astype("int32")
        x = ((position[k, j] % wide).astype(dtype) + half) * (width_k / columns) + boxes[k, 0]
        y = ((position[k, j] // wide).astype(dtype) + half) * (height_k / rows) + boxes[k, 1]
        coordinate = tirx.Select(field == 0, x, tirx.Select(field == 1, y, one))
        return tirx.Select(valid(k), coordinate, tirx.const(0.0, dtype))

    points = te.compute((count, 3, joints), keypoint, name="heatmap_keypoints")
    values = te.compute(
        (count, joints),
        lambda k, j: tirx.Select(valid(k), peak[k, j], tirx.const(0.0, dtype)),
        name="keypoint_scores",
    )
    return points, values
