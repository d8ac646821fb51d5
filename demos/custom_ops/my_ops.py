"""Three operators no framework here ships, registered with edgecv from a user's module.

``edgecv deploy MODEL --ops demos/custom_ops/my_ops.py`` loads this file; nothing of
edgecv is edited. Each operator is a TVM tensor expression (its compute), an output
shape rule and a NumPy reference that :func:`edgecv.testing.check_op` compares the
compiled kernel with. The names are the ``op_type`` of the MXNet ``Custom`` nodes the
Gluon models in ``custom_op_models.py`` export.

- ``capsule_conv2d``: a convolution over 4x4 capsule poses (NeoFlow's example): each
  output pose is the sum, over input capsules and the kernel window, of input pose times
  weight pose (a 4x4 matrix product), one reduction over four axes.
- ``dilated_depth_to_space``: depth-to-space whose r x r sub-pixels land ``dilation``
  pixels apart instead of side by side (1: the usual pixel shuffle).
- ``hard_swish``: ``x * clip(alpha * x + beta, 0, 1)``, alpha and beta attributes
  (1/6 and 1/2: MobileNetV3's hard-swish).
"""

from __future__ import annotations

import numpy as np
from tvm import te, tirx

import edgecv

# ---------------------------------------------------------------- capsule convolution
# data (N, Cin, P, P, H, W): Cin capsules of P x P poses per pixel; weight
# (Cout, Cin, KH, KW, P, P); out (N, Cout, P, P, OH, OW):
# out[n, co, i, j, y, x] = sum_{ci, kh, kw, k} data[n, ci, i, k, y*s+kh-p, x*s+kw-p]
#                                              * weight[co, ci, kh, kw, k, j]


def capsule_shape(shapes, attrs):
    (n, cin, p, p2, h, w), (cout, wcin, kh, kw, wp, wp2) = shapes
    stride, pad = int(attrs.get("stride", 1)), int(attrs.get("pad", 0))
    if p != p2 or (wcin, wp, wp2) != (cin, p, p):
        raise ValueError(f"data {shapes[0]} and weight {shapes[1]} do not agree on capsules/poses")
    return (n, cout, p, p, (h + 2 * pad - kh) // stride + 1, (w + 2 * pad - kw) // stride + 1)


def capsule_reference(data, weight, stride=1, pad=0):
    n, cout, p, _, oh, ow = capsule_shape(
        [data.shape, weight.shape], {"stride": stride, "pad": pad}
    )
    padded = np.pad(data, [(0, 0)] * 4 + [(pad, pad)] * 2)
    out = np.zeros((n, cout, p, p, oh, ow), dtype=np.float64)
    for kh in range(weight.shape[2]):
        for kw in range(weight.shape[3]):
            window = padded[..., kh : kh + stride * oh : stride, kw : kw + stride * ow : stride]
            out += np.einsum("nciKyx,ocKj->noijyx", window, weight[:, :, kh, kw])
    return out.astype(data.dtype)


@edgecv.register_op("capsule_conv2d", shape=capsule_shape, reference=capsule_reference)
def capsule_conv2d(inputs, attrs):
    data, weight = inputs
    shapes = [tuple(int(d) for d in t.shape) for t in inputs]  # TVM's sizes as ints
    n, cout, p, _, oh, ow = capsule_shape(shapes, attrs)
    stride, pad = int(attrs.get("stride", 1)), int(attrs.get("pad", 0))
    _, cin, _, _, h, w = shapes[0]
    kernel_h, kernel_w = shapes[1][2:4]
    if pad:
        data = te.compute(
            (n, cin, p, p, h + 2 * pad, w + 2 * pad),
            lambda b, c, i, k, y, x: tirx.if_then_else(
                tirx.all(y >= pad, y < h + pad, x >= pad, x < w + pad),
                data[b, c, i, k, y - pad, x - pad],
                tirx.const(0, data.dtype),
            ),
            name="pad",
        )
    ci = te.reduce_axis((0, cin), "ci")
    kh = te.reduce_axis((0, kernel_h), "kh")
    kw = te.reduce_axis((0, kernel_w), "kw")
    k = te.reduce_axis((0, p), "k")
    return te.compute(
        (n, cout, p, p, oh, ow),
        lambda b, co, i, j, y, x: te.sum(
            data[b, ci, i, k, y * stride + kh, x * stride + kw] * weight[co, ci, kh, kw, k, j],
            axis=[ci, kh, kw, k],
        ),
        name="capsule_conv2d",
    )


# ------------------------------------------------------------ dilated depth-to-space
# data (N, C*r*r, H, W) -> out (N, C, H*r, W*r). Output row y lies in tile y // (r*d)
# of r*d rows; in it, sub-pixel i = (y % (r*d)) // d comes from input row
# tile*d + y % d. The same for columns with j; channel c*r*r + i*r + j.


def d2s_shape(shapes, attrs):
    ((n, c, h, w),) = shapes
    r, d = int(attrs.get("block", 2)), int(attrs.get("dilation", 1))
    if c % (r * r) or h % d or w % d:
        raise ValueError(
            f"input {shapes[0]}: channels must divide by block^2 ({r * r}) and "
            f"height and width by dilation ({d})"
        )
    return (n, c // (r * r), h * r, w * r)


def d2s_reference(data, block=2, dilation=1):
    n, c, h, w = data.shape
    r, d = block, dilation
    x = data.reshape(n, c // (r * r), r, r, h // d, d, w // d, d)
    return x.transpose(0, 1, 4, 2, 5, 6, 3, 7).reshape(n, c // (r * r), h * r, w * r)


@edgecv.register_op("dilated_depth_to_space", shape=d2s_shape, reference=d2s_reference)
def dilated_depth_to_space(inputs, attrs):
    (data,) = inputs
    r, d = int(attrs.get("block", 2)), int(attrs.get("dilation", 1))

    def source(out):  # output row/column -> (sub-pixel, input row/column)
        return out % (r * d) // d, out // (r * d) * d + out % d

    def pixel(b, c, y, x):
        (i, h), (j, w) = source(y), source(x)
        return data[b, c * r * r + i * r + j, h, w]

    shape = d2s_shape([tuple(int(d) for d in data.shape)], attrs)
    return te.compute(shape, pixel, name="dilated_depth_to_space")


# ------------------------------------------------------------------------ hard-swish


def hard_swish_reference(x, alpha=1 / 6, beta=0.5):
    return (x * np.clip(alpha * x + beta, 0, 1)).astype(x.dtype)


@edgecv.register_op(
    "hard_swish", shape=lambda shapes, attrs: shapes[0], reference=hard_swish_reference
)
def hard_swish(inputs, attrs):
    (x,) = inputs
    alpha = tirx.const(float(attrs.get("alpha", 1 / 6)), x.dtype)
    beta = tirx.const(float(attrs.get("beta", 0.5)), x.dtype)
    zero, one = tirx.const(0, x.dtype), tirx.const(1, x.dtype)
    return te.compute(
        x.shape,
        lambda *i: x(*i) * tirx.min(tirx.max(alpha * x(*i) + beta, zero), one),
        name="hard_swish",
    )
