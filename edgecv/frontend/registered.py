"""Nodes of operators a user registered (:func:`edgecv.register_op`) -> Relax.

The user's tensor expression becomes a TIR PrimFunc through ``BlockBuilder.emit_te``,
named after the operator: to every later stage it is a PrimFunc like those LegalizeOps
makes of built-in ops, so FuseOps fuses it with its neighbours (by the pattern
``AnnotateTIROpPattern`` reads from its loops), the schedule stage classifies it by its
blocks, placement and ``--explain`` name it.
"""

from __future__ import annotations

from typing import Any

from tvm import relax, te

from ..board.errors import ConversionError, EdgecvError, foreign_message
from ..op_registry import RegisteredOp


def _shape(expr: relax.Expr) -> tuple[int, ...]:
    return tuple(int(d) for d in expr.ty.shape)


def _dtype(expr: relax.Expr) -> str:
    return str(expr.ty.dtype)


def emit_registered(
    bb: relax.BlockBuilder, op: RegisteredOp, inputs: list, attrs: dict[str, Any], node: str
) -> relax.Expr:
    """Emit one node (named ``node``, its attributes as Python values) of the registered
    operator ``op`` on ``inputs``: one call of a PrimFunc built from ``op.compute``, the
    same for every frontend; the output's shape and dtype must be what the op's rules say."""
    shapes = [_shape(x) for x in inputs]
    dtypes = [_dtype(x) for x in inputs]
    where = f"node `{node}` (registered op `{op.name}`, input shapes {shapes})"
    try:
        expected = tuple(int(d) for d in op.shape(shapes, dict(attrs)))
        expected_dtype = op.out_dtype(dtypes, dict(attrs))
    except EdgecvError:
        raise
    except Exception as err:
        raise ConversionError(f"{where}: its shape rule raised {foreign_message(err)}") from None

    def build(*tensors: te.Tensor) -> te.Tensor:
        out = op.compute(list(tensors), dict(attrs))
        if not isinstance(out, te.Tensor):
            raise ConversionError(
                f"{where}: compute returned {type(out).__name__}, not one te.Tensor; build the "
                "output with te.compute"
            )
        return out

    try:
        out = bb.emit_te(build, *inputs, primfunc_name_hint=op.name)
    except EdgecvError:
        raise
    except Exception as err:
        raise ConversionError(f"{where}: compute raised {foreign_message(err)}") from None
    got, got_dtype = _shape(out), _dtype(out)
    if (got, got_dtype) != (expected, expected_dtype):
        raise ConversionError(
            f"{where}: compute built {got} {got_dtype} but the shape/dtype rules say {expected} "
            f"{expected_dtype}; make the two agree"
        )
    return out
