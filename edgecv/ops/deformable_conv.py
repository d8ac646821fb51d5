"""Modulated deformable convolution (DCNv2, MXNet's ``_contrib_ModulatedDeformableConvolution``).

Each kernel tap samples the input bilinearly at its regular position plus a learned
offset and scales the sample by a learned mask; the samples then meet the weights as
in a plain convolution. Layouts follow MXNet: ``offset (N, 2 * dg * KH * KW, OH, OW)``
holds (dy, dx) pairs per deformable group ``dg`` and tap; ``mask (N, dg * KH * KW, OH,
OW)``; a sample at or beyond one pixel outside the input is 0, and so is each corner
of the bilinear stencil that falls outside.
"""

from __future__ import annotations

from tvm import te, tirx


def modulated_deformable_conv2d(
    data: te.Tensor,
    offset: te.Tensor,
    mask: te.Tensor,
    weight: te.Tensor,
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
    groups: int = 1,
    deformable_groups: int = 1,
) -> te.Tensor:
    """NCHW output ``(N, O, OH, OW)`` of DCNv2, the sizes of ``offset`` giving OH, OW."""
    n_, c_, h_, w_ = (int(s) for s in data.shape)
    o_, cg, kh_, kw_ = (int(s) for s in weight.shape)
    oh_, ow_ = int(offset.shape[2]), int(offset.shape[3])
    taps = kh_ * kw_
    per_dgroup = c_ // deformable_groups
    dtype = data.dtype
    zero = tirx.const(0.0, dtype)

    def pixel(n, c, y, x):
        inside = tirx.all(y >= 0, y <= h_ - 1, x >= 0, x <= w_ - 1)
        value = data[n, c, tirx.max(tirx.min(y, h_ - 1), 0), tirx.max(tirx.min(x, w_ - 1), 0)]
        return tirx.Select(inside, value, zero)

    def sample(n, c, i, j, oh, ow):
        g, tap = c // per_dgroup, i * kw_ + j
        y = (oh * stride[0] - padding[0] + i * dilation[0]).astype(dtype) + offset[
            n, g * 2 * taps + 2 * tap, oh, ow
        ]
        x = (ow * stride[1] - padding[1] + j * dilation[1]).astype(dtype) + offset[
            n, g * 2 * taps + 2 * tap + 1, oh, ow
        ]
        y0, x0 = te.floor(y).astype("int32"), te.floor(x).astype("int32")
        ly, lx = y - y0.astype(dtype), x - x0.astype(dtype)
        hy, hx = 1 - ly, 1 - lx
        value = (
            hy * hx * pixel(n, c, y0, x0)
            + hy * lx * pixel(n, c, y0, x0 + 1)
            + ly * hx * pixel(n, c, y0 + 1, x0)
            + ly * lx * pixel(n, c, y0 + 1, x0 + 1)
        )
        inside = tirx.all(y > -1, x > -1, y < h_, x < w_)
        return tirx.Select(inside, value, zero) * mask[n, g * taps + tap, oh, ow]

    columns = te.compute((n_, c_, kh_, kw_, oh_, ow_), sample, name="dcn_columns")
    rc = te.reduce_axis((0, cg), name="rc")
    ri = te.reduce_axis((0, kh_), name="ri")
    rj = te.reduce_axis((0, kw_), name="rj")
    per_group = o_ // groups
    return te.compute(
        (n_, o_, oh_, ow_),
        lambda n, o, oh, ow: te.sum(
            columns[n, (o // per_group) * cg + rc, ri, rj, oh, ow] * weight[o, rc, ri, rj],
            axis=[rc, ri, rj],
        ),
        name="modulated_deformable_conv2d",
    )
