"""Plan extraction: walk ``main``'s bindings in order and record the static plan.

Every ``call_tir`` becomes a launch (a :class:`~edgecv.board.plan.Step`), every
reshape a view of its source buffer, every constant a named parameter.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..board.errors import EdgecvError
from ..board.plan import Buffer, Plan, Step


class _PlanBuilder:
    def __init__(self) -> None:
        self.buffers: list[Buffer] = []
        self.steps: list[Step] = []
        self.constants: dict[str, np.ndarray] = {}
        self._const_ids: dict[int, int] = {}
        self.values: dict[relax.Var, int | list[int]] = {}

    def new(self, ty, kind: str, name: str = "", view_of: int | None = None) -> int:
        shape = tuple(int(d) for d in ty.shape)
        buf = Buffer(len(self.buffers), shape, str(ty.dtype), kind, name, view_of)
        self.buffers.append(buf)
        return buf.id

    def ref(self, expr: relax.Expr) -> int | list[int]:
        if isinstance(expr, tvm.ir.expr.Constant):
            key = expr.__chandle__()
            if key not in self._const_ids:
                name = f"p{len(self.constants)}"
                self.constants[name] = expr.value.numpy()
                self._const_ids[key] = self.new(expr.ty, "const", name)
            return self._const_ids[key]
        if isinstance(expr, relax.Tuple):
            return [self.ref(f) for f in expr.fields]
        if isinstance(expr, relax.Var):
            if expr not in self.values:
                raise EdgecvError(f"internal: {expr.name} used before it is defined")
            return self.values[expr]
        raise EdgecvError(f"internal: unexpected argument {type(expr).__name__} in the plan")


def extract_plan(main: relax.Function) -> tuple[Plan, dict[str, np.ndarray]]:
    pb = _PlanBuilder()
    inputs = []
    for param in main.params:
        buf = pb.new(param.ty, "input", param.name)
        pb.values[param] = buf
        inputs.append(buf)
    call_tir = tvm.ir.Op.get("relax.call_tir")
    reshape = tvm.ir.Op.get("relax.reshape")
    body = main.body
    for block in body.blocks:
        for binding in block.bindings:
            var, value = binding.var, binding.value
            if isinstance(value, relax.Call) and value.op.same_as(call_tir):
                kernel = value.args[0].name_hint
                args = [pb.ref(a) for a in value.args[1].fields]
                flat_args = [a for a in args for a in (a if isinstance(a, list) else [a])]
                out_ty = value.ty
                if isinstance(out_ty, relax.TupleType):
                    outs = [pb.new(t, "temp") for t in out_ty.fields]
                    pb.values[var] = outs
                else:
                    outs = [pb.new(out_ty, "temp")]
                    pb.values[var] = outs[0]
                pb.steps.append(Step(kernel, flat_args + outs, len(outs)))
            elif isinstance(value, relax.Call) and value.op.same_as(reshape):
                source = pb.ref(value.args[0])
                pb.values[var] = pb.new(var.ty, "view", view_of=source)
            elif isinstance(value, relax.TupleGetItem):
                pb.values[var] = pb.ref(value.tuple_value)[value.index]
            elif isinstance(value, (relax.Var, relax.Tuple, tvm.ir.expr.Constant)):
                pb.values[var] = pb.ref(value)
            else:
                raise EdgecvError(
                    f"internal: cannot plan binding `{var.name} = {type(value).__name__}` "
                    f"({str(value)[:120]})"
                )
    result = pb.ref(body.body)
    outputs = result if isinstance(result, list) else [result]
    # Outputs stay valid to the end of a run: the memory plan keeps their storage live
    # past the last launch, and the executor copies them out after it.
    plan = Plan(pb.buffers, pb.steps, inputs, outputs)
    return plan, pb.constants
