"""Per-box masks pasted into the image, as torchvision's Mask R-CNN does after its
detections: fixed-size, ``(K, 1, S, S)`` masks -> ``(K, height, width)``.

The semantics are :mod:`.paste_masks_reference`'s. torchvision (and its ONNX export, a
``Loop`` over the detections) resizes each mask to its box's size, a shape per box;
here each output pixel samples its box's resized mask directly (the bilinear source
coordinate of the pixel's offset in the box), so the shape is the image's whatever the
boxes. The coordinates are computed as ONNX Runtime's ``Resize`` computes them from
output sizes (``(d + 0.5) / (n / S) - 0.5`` in float32), so the two agree to rounding.

It is one ``te.compute`` of gathers and selects: one source for every target, a plain
injective kernel to the GPU schedulers.
"""

from __future__ import annotations

from tvm import te, tirx


def _check(masks_shape, boxes_shape, scores_shape, height: int, width: int) -> None:
    count = masks_shape[0]
    if len(masks_shape) != 4 or masks_shape[1] != 1 or masks_shape[2] != masks_shape[3]:
        raise ValueError(f"paste_masks: masks must be (K, 1, S, S), found {tuple(masks_shape)}")
    if tuple(boxes_shape) != (count, 4) or tuple(scores_shape) != (count,):
        raise ValueError(
            f"paste_masks: boxes must be ({count}, 4) and scores ({count},) for masks "
            f"{tuple(masks_shape)}, found {tuple(boxes_shape)} and {tuple(scores_shape)}"
        )
    if height < 1 or width < 1:
        raise ValueError(f"paste_masks: the image {height}x{width} must be at least 1x1")


def paste_masks(
    masks: te.Tensor, boxes: te.Tensor, scores: te.Tensor, height: int, width: int
) -> te.Tensor:
    """``masks (K, 1, S, S)`` float, ``boxes (K, 4)`` integer, ``scores (K,)`` ->
    ``(K, height, width)``; see :mod:`.paste_masks_reference`."""
    shapes = [[int(d) for d in t.shape] for t in (masks, boxes, scores)]
    _check(*shapes, height, width)
    side = shapes[0][2]
    dtype = masks.dtype
    zero, one, half = (tirx.const(v, dtype) for v in (0.0, 1.0, 0.5))
    last = tirx.const(side - 1, "int64")

    def taps(offset, lo, hi):
        """The two source indices and the weight of the second, for ``offset`` pixels
        into a box edge ``lo..hi`` (the mask resized to ``max(hi - lo + 1, 1)``)."""
        size = tirx.max(hi - lo + tirx.const(1, "int64"), tirx.const(1, "int64"))
        scale = size.astype(dtype) / tirx.const(side, dtype)
        source = (offset.astype(dtype) + half) / scale - half
        source = tirx.min(tirx.max(source, zero), last.astype(dtype))
        low = tirx.min(tirx.floor(source).astype("int64"), last)
        return low, tirx.min(low + tirx.const(1, "int64"), last), source - low.astype(dtype)

    def pixel(k, y, x):
        x1, y1, x2, y2 = (boxes[k, i].astype("int64") for i in range(4))
        y, x = y.astype("int64"), x.astype("int64")
        inside = tirx.all(
            x >= x1, x <= x2, y >= y1, y <= y2, scores[k] >= tirx.const(0, scores.dtype)
        )
        r0, r1, fy = taps(y - y1, y1, y2)
        c0, c1, fx = taps(x - x1, x1, x2)
        top = masks[k, 0, r0, c0] * (one - fx) + masks[k, 0, r0, c1] * fx
        bottom = masks[k, 0, r1, c0] * (one - fx) + masks[k, 0, r1, c1] * fx
        return tirx.Select(inside, top * (one - fy) + bottom * fy, zero)

    return te.compute((shapes[0][0], height, width), pixel, name="paste_masks")
