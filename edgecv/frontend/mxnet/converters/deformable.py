"""Converter for MXNet's modulated deformable convolution (DCNv2, CenterNet's dcnv2 nets)."""

from __future__ import annotations

from tvm import relax

from ..attrs import Attrs
from ..context import Context
from .nn import _channel_vector, _spatial
from .registry import converts

R = relax.op


@converts("_contrib_ModulatedDeformableConvolution")
def contrib_modulated_deformable_convolution(
    ctx: Context, inputs: list, attrs: Attrs
) -> relax.Expr:
    from ....ops import deformable_conv  # the TIR ops import topi: load on first use

    kernel = attrs.ints("kernel")
    if len(kernel) != 2:
        raise attrs._fail("kernel", "two values (a 2-D kernel)", kernel)
    if attrs.str("layout", "None") not in ("None", "NCHW"):
        raise attrs._fail("layout", "NCHW", attrs.str("layout"))
    stride = _spatial(attrs, "stride", 2, 1)
    dilate = _spatial(attrs, "dilate", 2, 1)
    pad = _spatial(attrs, "pad", 2, 0)
    groups = attrs.int("num_group", 1)
    dgroups = attrs.int("num_deformable_group", 1)
    num_filter = attrs.int("num_filter")
    data, offset, mask, weight = inputs[:4]
    n, c, h, w = ctx.shape(data)
    if c % groups or c % dgroups:
        raise ctx.error(
            f"{c} input channels do not split into num_group={groups} and "
            f"num_deformable_group={dgroups} groups"
        )
    oh = (h + 2 * pad[0] - dilate[0] * (kernel[0] - 1) - 1) // stride[0] + 1
    ow = (w + 2 * pad[1] - dilate[1] * (kernel[1] - 1) - 1) // stride[1] + 1
    taps = kernel[0] * kernel[1]
    expected = {
        "offset": ((n, 2 * dgroups * taps, oh, ow), offset),
        "mask": ((n, dgroups * taps, oh, ow), mask),
        "weight": ((num_filter, c // groups, *kernel), weight),
    }
    for name, (shape, value) in expected.items():
        if ctx.shape(value) != shape:
            raise ctx.error(f"input `{name}` has shape {ctx.shape(value)}, expected {shape}")
    out = ctx.bb.emit_te(
        deformable_conv.modulated_deformable_conv2d,
        data,
        offset,
        mask,
        weight,
        stride=stride,
        padding=pad,
        dilation=dilate,
        groups=groups,
        deformable_groups=dgroups,
        primfunc_name_hint="modulated_deformable_conv2d",
    )
    if not attrs.bool("no_bias", False):
        out = R.add(out, _channel_vector(ctx, inputs[4], 4))
    return out
