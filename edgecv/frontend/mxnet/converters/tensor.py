"""Converters for shape and data-movement operators (reshape, slicing, concat, ...)."""

from __future__ import annotations

import numpy as np
from tvm import relax

from ....board.errors import ConversionError
from ..attrs import Attrs
from ..context import Context
from .registry import converts

R = relax.op


def mxnet_reshape(shape: tuple[int, ...], spec: tuple[int, ...], reverse: bool = False) -> tuple:
    """The output shape of MXNet ``Reshape`` with its special values.

    0 copies a dimension, -1 infers one, -2 copies all remaining dimensions, -3 merges
    two consecutive dimensions, -4 splits one dimension into the next two values (one
    of which may be -1). ``reverse`` applies the rules from the right.
    """
    if reverse:
        return tuple(reversed(mxnet_reshape(tuple(reversed(shape)), _reverse_spec(spec))))
    out: list[int] = []
    src = 0
    i = 0
    infer_at = None
    while i < len(spec):
        code = spec[i]
        if code > 0:
            out.append(code)
            src += 1
        elif code == 0:
            out.append(shape[src])
            src += 1
        elif code == -1:
            if infer_at is not None:
                raise ValueError("more than one -1 in the shape")
            infer_at = len(out)
            out.append(-1)
            src += 1
        elif code == -2:
            out.extend(shape[src:])
            src = len(shape)
        elif code == -3:
            out.append(shape[src] * shape[src + 1])
            src += 2
        elif code == -4:
            a, b = spec[i + 1], spec[i + 2]
            dim = shape[src]
            if a == -1:
                a = dim // b
            if b == -1:
                b = dim // a
            if a * b != dim:
                raise ValueError(f"-4 split of {dim} into {spec[i + 1]} x {spec[i + 2]}")
            out.extend([a, b])
            src += 1
            i += 2
        else:
            raise ValueError(f"unknown special value {code}")
        i += 1
    total = int(np.prod(shape))
    if infer_at is not None:
        known = int(np.prod([d for d in out if d != -1]))
        if known == 0 or total % known:
            raise ValueError(f"cannot infer -1: {total} elements, others give {known}")
        out[infer_at] = total // known
    if int(np.prod(out)) != total:
        raise ValueError(f"{total} elements cannot take shape {tuple(out)}")
    return tuple(out)


def _reverse_spec(spec: tuple[int, ...]) -> tuple[int, ...]:
    # -4 a b reads left to right; reversing keeps the two operands after the -4.
    items: list[tuple[int, ...]] = []
    i = 0
    while i < len(spec):
        if spec[i] == -4:
            items.append((-4, spec[i + 2], spec[i + 1]))
            i += 3
        else:
            items.append((spec[i],))
            i += 1
    return tuple(v for item in reversed(items) for v in item)


@converts("Reshape", "reshape")
def reshape(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    spec = attrs.ints("shape")
    try:
        shape = mxnet_reshape(ctx.shape(inputs[0]), spec, attrs.bool("reverse", False))
    except (ValueError, IndexError) as err:
        raise ctx.error(f"cannot reshape {ctx.shape(inputs[0])} to {spec}: {err}") from None
    return R.reshape(inputs[0], shape)


@converts("Flatten", "flatten")
def flatten(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    shape = ctx.shape(inputs[0])
    return R.reshape(inputs[0], (shape[0], int(np.prod(shape[1:]))))


@converts("transpose")
def transpose(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    axes = attrs.ints("axes", ())
    ndim = len(ctx.shape(inputs[0]))
    return R.permute_dims(inputs[0], list(axes) if axes else list(reversed(range(ndim))))


@converts("SwapAxis", "swapaxes")
def swap_axis(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    ndim = len(ctx.shape(inputs[0]))
    axes = list(range(ndim))
    d1 = ctx.normalize_axis(attrs.int("dim1", 0), ndim)
    d2 = ctx.normalize_axis(attrs.int("dim2", 0), ndim)
    axes[d1], axes[d2] = axes[d2], axes[d1]
    return R.permute_dims(inputs[0], axes)


@converts("Concat", "concat")
def concat(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    return R.concat(inputs, axis=attrs.int("dim", 1))


@converts("stack")
def stack(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    axis = attrs.int("axis", 0)
    ndim = len(ctx.shape(inputs[0])) + 1
    axis = ctx.normalize_axis(axis, ndim)
    return R.concat([ctx.emit(R.expand_dims(x, axis)) for x in inputs], axis=axis)


def _slice(data: relax.Expr, axes: list, begin: list, end: list, step: list | None = None):
    return R.strided_slice(data, axes, begin, end, step)


@converts("slice_axis")
def slice_axis(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    shape = ctx.shape(inputs[0])
    axis = ctx.normalize_axis(attrs.int("axis"), len(shape))
    dim = shape[axis]
    begin = attrs.int("begin")
    end = attrs.int("end", None)
    begin = begin + dim if begin < 0 else begin
    end = dim if end is None else (end + dim if end < 0 else end)
    if not 0 <= begin < end <= dim:
        raise ctx.error(f"slice [{begin}, {end}) is empty or outside axis {axis} of size {dim}")
    return _slice(inputs[0], [axis], [begin], [end])


@converts("slice", "crop")
def slice_(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    shape = ctx.shape(inputs[0])
    begin = attrs.ints("begin")
    end = attrs.ints("end")
    step = attrs.ints("step", ()) or (None,) * len(begin)
    axes, b_out, e_out, s_out = [], [], [], []
    for axis, (b, e, s) in enumerate(zip(begin, end, step, strict=False)):
        s = 1 if s is None else s
        dim = shape[axis]
        if s > 0:
            b = 0 if b is None else (b + dim if b < 0 else b)
            e = dim if e is None else (e + dim if e < 0 else e)
        else:
            b = dim - 1 if b is None else (b + dim if b < 0 else b)
            e = -dim - 1 if e is None else (e + dim if e < 0 else e)
        axes.append(axis)
        b_out.append(b)
        e_out.append(e)
        s_out.append(s)
    return _slice(inputs[0], axes, b_out, e_out, s_out)


@converts("slice_like")
def slice_like(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    shape = ctx.shape(inputs[0])
    like = ctx.shape(inputs[1])
    axes = attrs.ints("axes", ()) or tuple(range(min(len(shape), len(like))))
    axes = [ctx.normalize_axis(a, len(shape)) for a in axes]
    for a in axes:
        if like[a] > shape[a]:
            raise ctx.error(f"cannot slice axis {a} of size {shape[a]} to {like[a]}")
    return _slice(inputs[0], axes, [0] * len(axes), [like[a] for a in axes])


@converts("expand_dims")
def expand_dims(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    ndim = len(ctx.shape(inputs[0])) + 1
    return R.expand_dims(inputs[0], ctx.normalize_axis(attrs.int("axis"), ndim))


@converts("squeeze")
def squeeze(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    shape = ctx.shape(inputs[0])
    # Axes as positive numbers: Relax's layout conversion of a squeeze with a negative
    # axis asks for an impossible allocation (std::bad_alloc, TVM 0.27; Mask R-CNN's
    # `squeeze(axis=-1)` made the graph tuner fall back to NCHW).
    axes = [ctx.normalize_axis(a, len(shape)) for a in attrs.ints("axis", ())]
    for a in axes:
        if shape[a] != 1:
            raise ctx.error(f"cannot squeeze axis {a} of size {shape[a]} (only size-1 axes)")
    return R.squeeze(inputs[0], axes or None)


@converts("tile")
def tile(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    return R.tile(inputs[0], list(attrs.ints("reps")))


@converts("repeat")
def repeat(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    repeats = attrs.int("repeats")
    axis = attrs.int("axis", None)
    if axis is None:
        return R.repeat(inputs[0], repeats)
    return R.repeat(inputs[0], repeats, axis=axis)


@converts("where")
def where(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    cond, x, y = inputs
    mask = R.not_equal(cond, relax.const(0, ctx.dtype(cond)))
    if len(ctx.shape(cond)) == 1 and len(ctx.shape(x)) > 1:
        # MXNet's 1-D condition selects whole rows along the first axis.
        mask = R.reshape(mask, (ctx.shape(cond)[0],) + (1,) * (len(ctx.shape(x)) - 1))
    return R.where(mask, x, y)


@converts("zeros_like")
def zeros_like(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    return relax.const(np.zeros(ctx.shape(inputs[0]), ctx.dtype(inputs[0])), ctx.dtype(inputs[0]))


@converts("ones_like")
def ones_like(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    return relax.const(np.ones(ctx.shape(inputs[0]), ctx.dtype(inputs[0])), ctx.dtype(inputs[0]))


def _fill(attrs: Attrs, value: float) -> relax.Expr:
    shape = attrs.ints("shape")
    dtype = attrs.str("dtype", "float32")
    return relax.const(np.full(shape, value, dtype), dtype)  # int64 stays int64


@converts("_zeros")
def zeros(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    return _fill(attrs, 0.0)


@converts("_ones")
def ones(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    return _fill(attrs, 1.0)


@converts("_full")
def full(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    return _fill(attrs, attrs.float("value"))


@converts("_arange")
def arange(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    if attrs.bool("infer_range", False):
        raise ctx.error("`infer_range=True` needs a dynamic shape and is not supported")
    start = attrs.float("start", 0.0)
    stop = attrs.float("stop", None)
    if stop is None:
        start, stop = 0.0, start
    step = attrs.float("step", 1.0)
    values = np.arange(start, stop, step).repeat(attrs.int("repeat", 1))
    dtype = attrs.str("dtype", "float32")
    return relax.const(values.astype(dtype), dtype)


@converts("SliceChannel", "split")
def split(ctx: Context, inputs: list, attrs: Attrs) -> list:
    shape = ctx.shape(inputs[0])
    n = attrs.int("num_outputs")
    axis = ctx.normalize_axis(attrs.int("axis", 1), len(shape))
    if shape[axis] % n:
        raise ctx.error(f"axis {axis} of size {shape[axis]} does not split into {n} equal parts")
    if n == 1:  # Relax's split into one part is the tensor itself, not a 1-tuple
        outs = [inputs[0]]
    else:
        parts = ctx.emit(R.split(inputs[0], n, axis))
        outs = [relax.TupleGetItem(parts, i) for i in range(n)]
    if attrs.bool("squeeze_axis", False):
        outs = [R.squeeze(ctx.emit(o), [axis]) for o in outs]
    return outs


@converts("Cast", "cast", "amp_cast")
def cast(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    return R.astype(inputs[0], attrs.str("dtype"))


@converts("_copy", "identity", "BlockGrad", "stop_gradient", "make_loss")
def identity(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    return inputs[0]


@converts("broadcast_to")
def broadcast_to(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    in_shape = ctx.shape(inputs[0])
    shape = tuple(s if s != 0 else d for s, d in zip(attrs.ints("shape"), in_shape, strict=False))
    return R.broadcast_to(inputs[0], shape)


@converts("broadcast_like")
def broadcast_like(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    if attrs.ints("lhs_axes", ()) or attrs.ints("rhs_axes", ()):
        raise ctx.error("`lhs_axes`/`rhs_axes` are not supported")
    return R.broadcast_to(inputs[0], ctx.shape(inputs[1]))


def _reduce(fn):
    def convert(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
        ndim = len(ctx.shape(inputs[0]))
        axes = attrs.ints("axis", ())
        axes = [ctx.normalize_axis(a, ndim) for a in axes] if axes else list(range(ndim))
        if attrs.bool("exclude", False):
            axes = [a for a in range(ndim) if a not in axes]
        return fn(inputs[0], axis=axes, keepdims=attrs.bool("keepdims", False))

    return convert


converts("sum")(_reduce(R.sum))
converts("mean")(_reduce(R.mean))
converts("max")(_reduce(R.max))
converts("min")(_reduce(R.min))
converts("prod")(_reduce(R.prod))

__all__ = ["ConversionError", "mxnet_reshape"]
