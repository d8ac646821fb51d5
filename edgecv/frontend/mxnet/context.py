"""What a converter sees of the conversion in progress."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from ...board.errors import ConversionError
from .mxnet_graph import MXNetNode


@dataclass
class Context:
    """The block builder and the node being converted, with small typed helpers."""

    bb: relax.BlockBuilder
    node: MXNetNode
    # what reads each output of the node: (reading node, input position), with None for
    # a graph output; lets a converter fit its kernel to its only reader
    readers: dict[int, list[tuple[MXNetNode | None, int]]] = field(default_factory=dict)

    def only_reader(self, output: int = 0) -> MXNetNode | None:
        """The one node reading ``output`` of the node being converted, when no other
        node reads it and it is not a graph output; else None."""
        found = self.readers.get(output, [])
        if len(found) != 1 or found[0][0] is None:
            return None
        return found[0][0]

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
