"""``_contrib_box_decode``: anchor-relative box regressions -> corner boxes.

MXNet 1.9.1 semantics (checked against its operator in tests/ops/test_box_decode.py):
``anchors`` (``(1, N, 4)``, broadcast over the batch) are in ``format`` (corner
``x1, y1, x2, y2`` or center ``cx, cy, w, h``); with the anchor's center and size,

    cx = d0 * std0 * aw + acx        w = exp(min(d2 * std2, clip)) * aw
    cy = d1 * std1 * ah + acy        h = exp(min(d3 * std3, clip)) * ah

(the ``min`` only when ``clip > 0``) and the output is the corner box
``cx - w/2, cy - h/2, cx + w/2, cy + h/2``. It is elementwise, so one ``te.compute``
serves every target; the GPU schedulers see a plain injective kernel.
"""

from __future__ import annotations

import numpy as np
from tvm import te, tirx

FORMATS = ("corner", "center")


def _check(data_shape, anchor_shape, fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"box_decode: format must be one of {FORMATS}, found {fmt!r}")
    if data_shape[-1] != 4 or anchor_shape[-1] != 4:
        raise ValueError(
            f"box_decode: data and anchors need 4 values per box, found shapes "
            f"{tuple(data_shape)} and {tuple(anchor_shape)}"
        )
    if len(anchor_shape) != 3 or anchor_shape[0] != 1 or anchor_shape[1] != data_shape[1]:
        raise ValueError(
            f"box_decode: anchors must be (1, {data_shape[1]}, 4) for data {tuple(data_shape)}, "
            f"found {tuple(anchor_shape)}"
        )


def box_decode(
    data: te.Tensor,
    anchors: te.Tensor,
    std0: float = 1.0,
    std1: float = 1.0,
    std2: float = 1.0,
    std3: float = 1.0,
    clip: float = -1.0,
    format: str = "center",
) -> te.Tensor:
    """Decode ``data`` (B, N, 4) against ``anchors`` (1, N, 4); see the module docstring."""
    _check([int(s) for s in data.shape], [int(s) for s in anchors.shape], format)
    dtype = data.dtype
    half = tirx.const(0.5, dtype)

    def anchor_center(j):
        a = [anchors[0, j, k] for k in range(4)]
        if format == "center":
            return a
        return [(a[0] + a[2]) * half, (a[1] + a[3]) * half, a[2] - a[0], a[3] - a[1]]

    def size(value, std):
        scaled = value * tirx.const(std, dtype)
        if clip > 0:
            scaled = tirx.min(scaled, tirx.const(clip, dtype))
        return tirx.exp(scaled)

    def decode(b, j, k):
        acx, acy, aw, ah = anchor_center(j)
        cx = data[b, j, 0] * tirx.const(std0, dtype) * aw + acx
        cy = data[b, j, 1] * tirx.const(std1, dtype) * ah + acy
        w = size(data[b, j, 2], std2) * aw * half
        h = size(data[b, j, 3], std3) * ah * half
        return tirx.Select(
            k == 0, cx - w, tirx.Select(k == 1, cy - h, tirx.Select(k == 2, cx + w, cy + h))
        )

    return te.compute(data.shape, decode, name="box_decode", tag="injective")


def box_decode_reference(
    data: np.ndarray,
    anchors: np.ndarray,
    std0: float = 1.0,
    std1: float = 1.0,
    std2: float = 1.0,
    std3: float = 1.0,
    clip: float = -1.0,
    format: str = "center",
) -> np.ndarray:
    """MXNet ``box_decode`` in NumPy (float32 arithmetic)."""
    _check(data.shape, anchors.shape, format)
    a = anchors.astype(np.float32)
    if format == "corner":
        a = np.stack(
            [
                (a[..., 0] + a[..., 2]) / 2,
                (a[..., 1] + a[..., 3]) / 2,
                a[..., 2] - a[..., 0],
                a[..., 3] - a[..., 1],
            ],
            axis=-1,
        )
    d = data.astype(np.float32)
    cx = d[..., 0] * np.float32(std0) * a[..., 2] + a[..., 0]
    cy = d[..., 1] * np.float32(std1) * a[..., 3] + a[..., 1]
    dw, dh = d[..., 2] * np.float32(std2), d[..., 3] * np.float32(std3)
    if clip > 0:
        dw, dh = np.minimum(dw, np.float32(clip)), np.minimum(dh, np.float32(clip))
    w, h = np.exp(dw) * a[..., 2] / 2, np.exp(dh) * a[..., 3] / 2
    return np.stack([cx - w, cy - h, cx + w, cy + h], axis=-1).astype(np.float32)
