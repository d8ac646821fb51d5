"""MXNet nodes of operators a user registered (:func:`edgecv.register_op`): which
registered operator a node is (a ``Custom`` node by its ``op_type``), its attributes as
Python values, and its conversion through the shared :func:`..registered.emit_registered`.
"""

from __future__ import annotations

import ast
from typing import Any

from tvm import relax

from ...op_registry import RegisteredOp, registered_op
from ..registered import emit_registered
from .context import Context
from .mxnet_graph import MXNetNode

CUSTOM = "Custom"


def op_key(node: MXNetNode) -> str:
    """The name a node's operator is registered under: a ``Custom`` node's ``op_type``,
    else the MXNet op name."""
    if node.op == CUSTOM:
        return node.attrs.get("op_type", "")
    return node.op


def registered_for(node: MXNetNode) -> RegisteredOp | None:
    """The registered operator of ``node``, or None."""
    return registered_op(op_key(node))


def node_attrs(node: MXNetNode) -> dict[str, Any]:
    """The node's attributes as Python values: MXNet writes every attribute (and a
    Custom op's keyword arguments) as a string, ``"(3, 3)"``, ``"0.5"``, ``"True"``; those
    that read as a literal become one, the rest stay strings. Training hints (``__lr_mult__``)
    and a Custom node's ``op_type`` are left out."""
    attrs = {}
    for key, text in node.attrs.items():
        if key.startswith("__") or (node.op == CUSTOM and key == "op_type"):
            continue
        try:
            attrs[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            attrs[key] = text
    return attrs


def convert_registered(ctx: Context, op: RegisteredOp, inputs: list) -> relax.Expr:
    """Emit the node as one call of a PrimFunc built from ``op.compute``; the output's
    shape and dtype must be what the op's rules say."""
    return emit_registered(ctx.bb, op, inputs, node_attrs(ctx.node), ctx.node.name)
