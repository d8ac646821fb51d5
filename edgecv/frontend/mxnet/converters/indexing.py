"""Converters for shape queries, broadcasting, flipping and gathering."""

from __future__ import annotations

import numpy as np
from tvm import relax

from ..attrs import Attrs
from ..context import Context
from .registry import converts

R = relax.op


@converts("shape_array")
def shape_array(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    # Shapes are static at import, so the shape is a constant (int64, as MXNet gives).
    # (relax.const narrows int64 arrays to int32 unless given the dtype)
    return relax.const(np.array(ctx.shape(inputs[0]), dtype="int64"), "int64")


@converts("broadcast_axis", "broadcast_axes")
def broadcast_axis(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    shape = list(ctx.shape(inputs[0]))
    axes = attrs.ints("axis", ())
    sizes = attrs.ints("size", ())
    if len(axes) != len(sizes):
        raise attrs._fail("size", f"{len(axes)} values (one per axis in `axis`)", sizes)
    for axis, size in zip(axes, sizes, strict=True):
        axis = ctx.normalize_axis(axis, len(shape))
        if shape[axis] != 1:
            raise ctx.error(f"axis {axis} has size {shape[axis]}; only size-1 axes broadcast")
        shape[axis] = size
    return R.broadcast_to(inputs[0], tuple(shape))


@converts("reverse", "flip")
def reverse(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    ndim = len(ctx.shape(inputs[0]))
    out = inputs[0]
    for axis in attrs.ints("axis"):
        out = ctx.emit(R.flip(out, ctx.normalize_axis(axis, ndim)))
    return out


@converts("reshape_like")
def reshape_like(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    lhs, rhs = ctx.shape(inputs[0]), ctx.shape(inputs[1])

    def bounds(begin_name: str, end_name: str, shape: tuple) -> tuple[int, int]:
        begin, end = attrs.int(begin_name, None), attrs.int(end_name, None)
        begin = 0 if begin is None else begin % (len(shape) + 1) if begin < 0 else begin
        end = len(shape) if end is None else end + len(shape) if end < 0 else end
        if not 0 <= begin <= end <= len(shape):
            raise ctx.error(
                f"`{begin_name}`/`{end_name}` select [{begin}, {end}) of a {len(shape)}-d input"
            )
        return begin, end

    lb, le = bounds("lhs_begin", "lhs_end", lhs)
    rb, re = bounds("rhs_begin", "rhs_end", rhs)
    shape = lhs[:lb] + rhs[rb:re] + lhs[le:]
    if int(np.prod(shape)) != int(np.prod(lhs)):
        raise ctx.error(f"cannot reshape {lhs} to {shape} (from {rhs})")
    return R.reshape(inputs[0], shape)


@converts("gather_nd")
def gather_nd(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    data, indices = inputs
    if len(ctx.shape(indices)) < 1 or ctx.shape(indices)[0] > len(ctx.shape(data)):
        raise ctx.error(
            f"indices of shape {ctx.shape(indices)} cannot index data of shape "
            f"{ctx.shape(data)}: the first axis must be at most its rank"
        )
    # MXNet lists the index tuples along the first axis of `indices`, Relax along the
    # last; Relax wants int64 indices where MXNet also takes int32 and float ones.
    ndim = len(ctx.shape(indices))
    idx = indices if ctx.dtype(indices) == "int64" else R.astype(indices, "int64")
    idx = ctx.emit(R.permute_dims(idx, [*range(1, ndim), 0]))
    return R.gather_nd(data, idx)


@converts("batch_dot")
def batch_dot(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    a, b = inputs
    for name, x in (("lhs", a), ("rhs", b)):
        if len(ctx.shape(x)) < 3:
            raise ctx.error(
                f"{name} must be at least 3-d (a batch of matrices), found {ctx.shape(x)}"
            )
    if attrs.str("forward_stype", "None") not in ("None", "default"):
        raise ctx.error("only dense storage (`forward_stype` default) is supported")

    def last_two_swapped(x):
        n = len(ctx.shape(x))
        return R.permute_dims(x, [*range(n - 2), n - 1, n - 2])

    if attrs.bool("transpose_a", False):
        a = ctx.emit(last_two_swapped(a))
    if attrs.bool("transpose_b", False):
        b = ctx.emit(last_two_swapped(b))
    return R.matmul(a, b)
