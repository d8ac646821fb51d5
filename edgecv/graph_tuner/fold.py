"""Layout transforms of constants (packed weights, BatchNorm scales) applied with NumPy.

``ConvertLayout`` leaves ``layout_transform(constant)`` for every weight and per-channel
constant of a packed convolution; Relax's ``FoldConstant`` would evaluate each by
compiling it with LLVM and running it: 191 compiles and 11 of the 12 s it took to lower
ResNet-50 packed, paid once when the graph tuner extracts the packed kernels and again
for the chosen plan. Here each transform is evaluated as one NumPy gather: the
transform's index map is inverted (:meth:`IndexMap.non_surjective_inverse`, which also
gives the padding predicate) and its expressions evaluated over broadcast index grids.
A transform whose expressions use anything else is left for ``FoldConstant``.
"""

from __future__ import annotations

import operator

import numpy as np
import tvm
from tvm import relax

from .activations import with_main

_BINARY = {
    "Add": operator.add,
    "Sub": operator.sub,
    "Mul": operator.mul,
    "FloorDiv": np.floor_divide,
    "FloorMod": np.mod,
    "Min": np.minimum,
    "Max": np.maximum,
    "LT": operator.lt,
    "LE": operator.le,
    "GT": operator.gt,
    "GE": operator.ge,
    "EQ": operator.eq,
    "NE": operator.ne,
    "And": np.logical_and,
    "Or": np.logical_or,
}


class _Unsupported(Exception):
    pass


def _evaluate(expr, env: list[tuple[object, np.ndarray]]):
    kind = type(expr).__name__
    if kind == "Var":
        for var, value in env:
            if var.same_as(expr):
                return value
        raise _Unsupported(f"free variable {expr}")
    if kind == "IntImm":
        return int(expr.value)
    if kind in _BINARY:
        return _BINARY[kind](_evaluate(expr.a, env), _evaluate(expr.b, env))
    if kind == "Not":
        return np.logical_not(_evaluate(expr.a, env))
    raise _Unsupported(kind)


def transform_array(data: np.ndarray, index_map, pad_value=None) -> np.ndarray:
    """``data`` laid out by ``index_map`` (a ``layout_transform``'s), padded positions
    filled with ``pad_value`` (0 when None). Raises ``_Unsupported`` for an index map
    this evaluator does not know."""
    shape = list(data.shape)
    out_shape = [int(d) for d in index_map.map_shape(shape)]
    inverse, padding = index_map.non_surjective_inverse(shape)
    grids = np.ogrid[tuple(slice(0, d) for d in out_shape)]
    env = list(zip(inverse.initial_indices, grids, strict=True))
    source = [np.asarray(_evaluate(e, env)) for e in inverse.final_indices]
    padded = np.broadcast_to(np.asarray(_evaluate(padding, env), dtype=bool), out_shape)
    index = tuple(np.where(padded, 0, np.broadcast_to(s, out_shape)) for s in source)
    out = data[index]
    if padded.any():
        out[padded] = 0 if pad_value is None else pad_value
    return out


def fold_constant_transforms(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every ``layout_transform`` of a constant in ``main`` replaced by
    the transformed constant (see the module docstring); nothing else changes (two
    equal transforms of one tensor stay two: the solver counts them so)."""
    op = tvm.ir.Op.get("relax.layout_transform")

    @relax.expr_functor.mutator
    class Folder(relax.PyExprMutator):
        def visit_call_(self, call: relax.Call) -> relax.Expr:
            call = super().visit_call_(call)
            if not (call.op.same_as(op) and isinstance(call.args[0], tvm.ir.expr.Constant)):
                return call
            constant, pad = call.args[0], call.attrs.pad_value
            try:
                value = transform_array(
                    constant.value.numpy(), call.attrs.index_map, None if pad is None else pad.value
                )
            except _Unsupported:
                return call
            return relax.const(value, str(constant.ty.dtype))

    return with_main(mod, Folder().visit_expr(mod["main"]))
