"""Activations rewritten into operators that keep a packed layout.

Relax's ``ConvertLayout`` has no layout rule for ``leakyrelu`` and ``clip``: around
every one (YOLOv3's darknet has one after each convolution; ReLU6 is a clip) it would
return the tensor to NCHW and back. Written with ``maximum``/``minimum`` against a
scalar they follow their input's layout, and compute the same values bit for bit:
``max(x, a * x)`` is ``x`` or ``a * x`` exactly as ``leakyrelu`` picks for
``0 <= a <= 1``, and ``clip`` is a ``max`` then a ``min``.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, rewrite_call, wildcard


def rewrite_activations(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with ``leakyrelu`` (slope in [0, 1]) and ``clip`` in ``main`` rewritten
    as above; everything else unchanged."""
    data, low, high = wildcard(), wildcard(), wildcard()
    leaky = is_op("relax.nn.leakyrelu")(data)
    clip = is_op("relax.clip")(data, low, high)

    def rewrite(expr: relax.Call, matches) -> relax.Expr:
        x = matches[data]
        dtype = str(x.ty.dtype)
        if expr.op.same_as(tvm.ir.Op.get("relax.nn.leakyrelu")):
            alpha = float(expr.attrs.alpha)
            if not 0.0 <= alpha <= 1.0:
                return expr
            return relax.op.maximum(x, relax.op.multiply(x, relax.const(alpha, dtype)))
        lo, hi = matches[low], matches[high]
        if not all(isinstance(v, tvm.tirx.FloatImm | tvm.tirx.IntImm) for v in (lo, hi)):
            return expr
        bounded = relax.op.maximum(x, relax.const(float(lo.value), dtype))
        return relax.op.minimum(bounded, relax.const(float(hi.value), dtype))

    return with_main(mod, rewrite_call(leaky | clip, rewrite, mod["main"]))


def with_main(mod: tvm.IRModule, main: relax.Function) -> tvm.IRModule:
    """A copy of ``mod`` whose ``main`` is ``main`` (the graph tuner's rewrites)."""
    updated = mod.clone() if hasattr(mod, "clone") else tvm.IRModule(dict(mod.functions))
    updated["main"] = main
    return updated
