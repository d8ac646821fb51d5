"""What a converter sees of the conversion in progress."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from ..errors import ConversionError
from .mxnet_graph import MXNetNode


@dataclass
class Context:
    """The block builder and the node being converted, with small typed helpers."""

    bb: relax.BlockBuilder
    node: MXNetNode

    def emit(self, expr: relax.Expr) -> relax.Var:
        return self.bb.emit(expr)

    @staticmethod
    def shape(expr: relax.Expr) -> tuple[int, ...]:
        """The static shape of a tensor expression."""
        ty = expr.ty
        return tuple(int(d) for d in ty.shape)

    @staticmethod
    def dtype(expr: relax.Expr) -> str:
        return str(expr.ty.dtype)

    @staticmethod
    def const_value(expr: relax.Expr) -> np.ndarray | None:
        """The value of a constant input (a bound parameter), else None."""
        if isinstance(expr, tvm.ir.expr.Constant):
            return expr.value.numpy()
        return None

    def error(self, message: str) -> ConversionError:
        return ConversionError(f"node `{self.node.name}` (op `{self.node.op}`): {message}")

    def normalize_axis(self, axis: int, ndim: int) -> int:
        if not -ndim <= axis < ndim:
            raise self.error(f"axis {axis} is out of range for a {ndim}-d input")
        return axis % ndim
