"""Converters for resizing and adaptive pooling (segmentation heads, pyramid pooling)."""

from __future__ import annotations

from tvm import relax

from ..attrs import Attrs
from ..context import Context
from .registry import converts

R = relax.op

_RESIZE_MODES = (
    "size",
    "odd_scale",
    "like",
    "to_even_down",
    "to_even_up",
    "to_odd_down",
    "to_odd_up",
)


@converts("_contrib_AdaptiveAvgPooling2D")
def contrib_adaptive_avg_pooling_2d(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    data = inputs[0]
    if len(ctx.shape(data)) != 4:
        raise ctx.error(f"expects an NCHW input, found shape {ctx.shape(data)}")
    size = attrs.ints("output_size", ()) or (1,)
    if len(size) == 1:
        size = (size[0], size[0])
    if len(size) != 2 or any(s is None or s < 1 for s in size):
        raise attrs._fail("output_size", "one or two positive integers", size)
    return R.nn.adaptive_avg_pool2d(data, size)


def resize_output_size(
    in_hw: tuple[int, int], mode: str, size: tuple[int, int], scale: tuple
) -> tuple[int, int]:
    """The output (height, width) of MXNet's ``_contrib_BilinearResize2D`` (not ``like``).

    ``size`` is the ``height``/``width`` attributes, ``scale`` the ``scale_height``/
    ``scale_width`` ones (None when absent; a scale wins over a size).
    """
    out = []
    for dim, target, factor in zip(in_hw, size, scale, strict=True):
        new = int(factor * dim) if factor is not None else target
        if mode == "odd_scale":
            # odd sizes keep their corner pixels aligned: (d - 1) * s + 1
            new = int(dim * factor) if dim % 2 == 0 else int((dim - 1) * factor) + 1
        elif mode == "to_even_down":
            new = dim - dim % 2
        elif mode == "to_even_up":
            new = dim + dim % 2
        elif mode == "to_odd_down":
            new = dim if dim % 2 else dim - 1
        elif mode == "to_odd_up":
            new = dim if dim % 2 else dim + 1
        out.append(new)
    return out[0], out[1]


@converts("_contrib_BilinearResize2D")
def contrib_bilinear_resize_2d(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    data = inputs[0]
    shape = ctx.shape(data)
    if len(shape) != 4:
        raise ctx.error(f"expects an NCHW input, found shape {shape}")
    mode = attrs.str("mode", "size", choices=_RESIZE_MODES)
    if mode == "like":
        if len(inputs) != 2:
            raise ctx.error(
                f"mode `like` needs a second input to take the size of, found "
                f"{len(inputs)} input(s)"
            )
        out_hw = ctx.shape(inputs[1])[2:4]
    else:
        scale = (attrs.float("scale_height", None), attrs.float("scale_width", None))
        if mode == "odd_scale" and None in scale:
            raise ctx.error("mode `odd_scale` needs both `scale_height` and `scale_width`")
        out_hw = resize_output_size(
            shape[2:4], mode, (attrs.int("height", 1), attrs.int("width", 1)), scale
        )
    if min(out_hw) < 1:
        raise ctx.error(f"output size {tuple(out_hw)} is empty; check `height`/`width`/scales")
    # MXNet samples output pixel i at i * (in - 1) / (out - 1) with align_corners (its
    # default), else at (i + 0.5) * in / out - 0.5 clamped at 0 (and at 0 for a size-1
    # output): TVM's "align_corners" and "pytorch_half_pixel" transformations.
    aligned = attrs.bool("align_corners", True)
    transform = "align_corners" if aligned else "pytorch_half_pixel"
    return R.image.resize2d(
        data, tuple(out_hw), method="linear", coordinate_transformation_mode=transform
    )
