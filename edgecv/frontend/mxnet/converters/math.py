"""Converters for elementwise and broadcast arithmetic, comparisons and unary math.

MXNet comparison operators return 0/1 in the input's dtype (not booleans), so the
results are cast back to it.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ..attrs import Attrs
from ..context import Context
from .registry import converts

R = relax.op

_BINARY = {
    "add": (R.add, ("elemwise_add", "broadcast_add", "broadcast_plus", "_plus", "_add")),
    "sub": (R.subtract, ("elemwise_sub", "broadcast_sub", "broadcast_minus", "_minus", "_sub")),
    "mul": (R.multiply, ("elemwise_mul", "broadcast_mul", "_mul")),
    "div": (R.divide, ("elemwise_div", "broadcast_div", "_div")),
    "pow": (R.power, ("broadcast_power", "_power")),
    "max": (R.maximum, ("broadcast_maximum", "_maximum")),
    "min": (R.minimum, ("broadcast_minimum", "_minimum")),
    "mod": (R.floor_mod, ("broadcast_mod", "_mod")),
}
_COMPARE = {
    "eq": (R.equal, ("broadcast_equal", "_equal")),
    "ne": (R.not_equal, ("broadcast_not_equal", "_not_equal")),
    "gt": (R.greater, ("broadcast_greater", "_greater")),
    "ge": (R.greater_equal, ("broadcast_greater_equal", "_greater_equal")),
    "lt": (R.less, ("broadcast_lesser", "_lesser")),
    "le": (R.less_equal, ("broadcast_lesser_equal", "_lesser_equal")),
}
# scalar op name -> (function, scalar on the left?)
_SCALAR = {
    "_plus_scalar": (R.add, False),
    "_minus_scalar": (R.subtract, False),
    "_rminus_scalar": (R.subtract, True),
    "_mul_scalar": (R.multiply, False),
    "_div_scalar": (R.divide, False),
    "_rdiv_scalar": (R.divide, True),
    "_power_scalar": (R.power, False),
    "_rpower_scalar": (R.power, True),
    "_maximum_scalar": (R.maximum, False),
    "_minimum_scalar": (R.minimum, False),
    "_mod_scalar": (R.floor_mod, False),
}
_COMPARE_SCALAR = {
    "_equal_scalar": R.equal,
    "_not_equal_scalar": R.not_equal,
    "_greater_scalar": R.greater,
    "_greater_equal_scalar": R.greater_equal,
    "_lesser_scalar": R.less,
    "_lesser_equal_scalar": R.less_equal,
}
_UNARY = {
    "exp": R.exp,
    "log": R.log,
    "sqrt": R.sqrt,
    "rsqrt": R.rsqrt,
    "tanh": R.tanh,
    "abs": R.abs,
    "negative": R.negative,
    "square": R.square,
    "floor": R.floor,
    "ceil": R.ceil,
    "round": R.round,
    "trunc": R.trunc,
    "sign": R.sign,
    "sin": R.sin,
    "cos": R.cos,
    "erf": R.erf,
}


def _binary(fn):
    def convert(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
        return fn(inputs[0], inputs[1])

    return convert


def _compare(fn):
    def convert(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
        return R.astype(fn(inputs[0], inputs[1]), ctx.dtype(inputs[0]))

    return convert


def _scalar(fn, reverse: bool):
    def convert(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
        scalar = relax.const(attrs.scalar(), ctx.dtype(inputs[0]))
        return fn(scalar, inputs[0]) if reverse else fn(inputs[0], scalar)

    return convert


def _compare_scalar(fn):
    def convert(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
        dtype = ctx.dtype(inputs[0])
        return R.astype(fn(inputs[0], relax.const(attrs.scalar(), dtype)), dtype)

    return convert


def _unary(fn):
    def convert(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
        return fn(inputs[0])

    return convert


for _fn, _names in _BINARY.values():
    converts(*_names)(_binary(_fn))
for _fn, _names in _COMPARE.values():
    converts(*_names)(_compare(_fn))
for _name, (_fn, _reverse) in _SCALAR.items():
    converts(_name)(_scalar(_fn, _reverse))
for _name, _fn in _COMPARE_SCALAR.items():
    converts(_name)(_compare_scalar(_fn))
for _name, _fn in _UNARY.items():
    converts(_name)(_unary(_fn))


@converts("reciprocal")
def reciprocal(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    return R.divide(relax.const(1.0, ctx.dtype(inputs[0])), inputs[0])


@converts("clip")
def clip(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    return R.clip(inputs[0], attrs.float("a_min"), attrs.float("a_max"))


@converts("add_n", "ElementWiseSum")
def add_n(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    total = inputs[0]
    for x in inputs[1:]:
        total = ctx.emit(R.add(total, x))
    return total


@converts("log2")
def log2(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    # Relax has no log2: log(x) / ln 2
    return R.multiply(R.log(inputs[0]), relax.const(1.0 / np.log(2.0), ctx.dtype(inputs[0])))
