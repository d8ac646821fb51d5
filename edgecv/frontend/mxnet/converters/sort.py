"""Converters for MXNet's ``argsort``, ``sort`` and ``topk``: one row sort each.

The sorted axis is moved last and the rest flattened into rows; one tagged kernel
(:func:`edgecv.ops.row_argsort.row_argsort`) sorts every row, and values come from the
indices with a gather. MXNet gives indices in ``dtype`` (float32 by default).
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ..attrs import Attrs
from ..context import Context
from .registry import converts
from .vision import _tag

R = relax.op


def _rows(ctx: Context, data: relax.Expr, axis: int | None):
    """``data`` as (rows, n) with the sorted axis last, and how to undo it."""
    shape = ctx.shape(data)
    if axis is None:  # MXNet sorts the flattened input
        flat = ctx.emit(R.reshape(data, (1, int(np.prod(shape)))))
        return flat, lambda y: ctx.emit(R.reshape(y, (int(ctx.shape(y)[-1]),)))
    axis = ctx.normalize_axis(axis, len(shape))
    perm = [a for a in range(len(shape)) if a != axis] + [axis]
    moved = ctx.emit(R.permute_dims(data, perm)) if axis != len(shape) - 1 else data
    moved_shape = ctx.shape(moved)
    rows = ctx.emit(R.reshape(moved, (int(np.prod(moved_shape[:-1])), moved_shape[-1])))
    inverse = list(np.argsort(perm))

    def restore(y):
        y = ctx.emit(R.reshape(y, (*moved_shape[:-1], ctx.shape(y)[-1])))
        return ctx.emit(R.permute_dims(y, inverse)) if axis != len(shape) - 1 else y

    return rows, restore


def _sorted_indices(ctx: Context, rows: relax.Expr, descending: bool, k: int = 0):
    from ....ops import row_argsort as sort_op  # the TIR ops import topi: load on first use

    out = ctx.bb.emit_te(
        sort_op.row_argsort, rows, descending=descending, k=k, primfunc_name_hint="row_argsort"
    )
    _tag(
        ctx,
        out,
        op="row_argsort",
        shape=list(ctx.shape(rows)),
        dtype=ctx.dtype(rows),
        descending=descending,
        k=k,
    )
    return out


def _axis(attrs: Attrs):
    return attrs.int("axis", -1) if attrs.str("axis", "-1") != "None" else None


@converts("argsort")
def argsort(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    rows, restore = _rows(ctx, inputs[0], _axis(attrs))
    idx = _sorted_indices(ctx, rows, not attrs.bool("is_ascend", True))
    return R.astype(restore(idx), attrs.str("dtype", "float32"))


@converts("sort")
def sort(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    rows, restore = _rows(ctx, inputs[0], _axis(attrs))
    idx = _sorted_indices(ctx, rows, not attrs.bool("is_ascend", True))
    return restore(ctx.emit(R.gather_elements(rows, idx, axis=1)))


@converts("topk")
def topk(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr | list:
    ret = attrs.str("ret_typ", "indices", choices=("indices", "value", "both", "mask"))
    if ret == "mask":
        raise ctx.error("ret_typ `mask` is not supported; use `indices` or `both`")
    rows, restore = _rows(ctx, inputs[0], _axis(attrs))
    n = ctx.shape(rows)[1]
    k = attrs.int("k", 1)
    if k < 1 or k > n:  # MXNet: k < 1 means all
        k = n
    idx = _sorted_indices(ctx, rows, not attrs.bool("is_ascend", False), k)
    values = restore(ctx.emit(R.gather_elements(rows, idx, axis=1)))
    indices = R.astype(restore(idx), attrs.str("dtype", "float32"))
    if ret == "value":
        return values
    if ret == "indices":
        return indices
    return [values, indices]
