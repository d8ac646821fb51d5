"""Relax module -> (kernels, static plan, constants): the CPU build pipeline.

The order of what runs, in one place:

1. Relax passes: legalize every op to TIR, fold constants, fuse neighbouring ops
   into kernels, turn reshape kernels back into views.
2. Plan extraction: walk ``main``'s bindings in order; every ``call_tir`` becomes a
   launch, every reshape a view, every constant a named parameter.
3. Memory planning (:meth:`~edgecv.build.plan.Plan.plan_memory`).
4. Schedule each kernel for the target and build them into one module.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from ..errors import EdgecvError
from .plan import Buffer, Plan, Step

log = logging.getLogger(__name__)


@dataclass
class Lowered:
    """A model lowered to kernels: the PrimFuncs, the plan and the constant values."""

    kernels: tvm.IRModule
    plan: Plan
    constants: dict[str, np.ndarray]
    timings: dict[str, float] = field(default_factory=dict)
    # kernel -> the operators fused into it ("conv2d", "add", "relu"), for placement
    kernel_ops: dict[str, list[str]] = field(default_factory=dict)


def relax_passes() -> tvm.transform.Pass:
    """The graph-level passes, in order."""
    return tvm.transform.Sequential([fusion_passes(), kernel_passes()])


def fusion_passes() -> tvm.transform.Pass:
    """Legalize every op to a PrimFunc, then group them (FuseOps) into kernels-to-be."""
    return tvm.transform.Sequential(
        [
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
        ]
    )


def kernel_passes() -> tvm.transform.Pass:
    """Merge each group into one PrimFunc, turn reshapes into views, clean up."""
    return tvm.transform.Sequential(
        [
            relax.transform.FuseTIR(),
            relax.transform.RewriteDataflowReshape(),
            relax.transform.DeadCodeElimination(["main"]),
            relax.transform.CanonicalizeBindings(),
        ]
    )


def op_name(primfunc_name: str) -> str:
    """The operator a legalized PrimFunc implements: TVM numbers repeats (``add3``,
    ``conv2d12``); the operator is the name without that number."""
    return re.sub(r"(?<=[a-z_])\d+$", "", primfunc_name)


def _fused_ops(mod: tvm.IRModule) -> dict[str, list[str]]:
    """For each fused group (named as FuseTIR will name its kernel), its operators."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    groups: dict[str, list[str]] = {}
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function) and func.attrs and "Primitive" in func.attrs:
            groups[gv.name_hint] = [
                op_name(binding.value.args[0].name_hint)
                for block in func.body.blocks
                for binding in block.bindings
                if isinstance(binding.value, relax.Call) and binding.value.op.same_as(call_tir)
            ]
    return groups


# At most this many operators fuse into one kernel. SSD's head gathers its boxes through
# a chain of ~120 slices, transposes and concatenations; unbounded (TVM's default is
# 256) it became one kernel of 880 KB of OpenCL C that Intel's compiler took 669 s to
# build (the whole model: 3.0 MB, 11 minutes). At 16 every kernel stays under 60 KB
# and the model's program builds in 22 s, for 18 more launches.
MAX_FUSION_DEPTH = 16


def lower(mod: tvm.IRModule) -> Lowered:
    """Run the Relax passes and extract the static plan (target independent)."""
    start = time.perf_counter()
    with tvm.transform.PassContext(config={"relax.FuseOps.max_depth": MAX_FUSION_DEPTH}):
        mod = fusion_passes()(mod)
    groups = _fused_ops(mod)
    mod = kernel_passes()(mod)
    passes_s = time.perf_counter() - start
    kernels = tvm.IRModule(
        {
            gv: func.with_attr("global_symbol", gv.name_hint)
            for gv, func in mod.functions.items()
            if isinstance(func, tvm.tirx.PrimFunc)
        }
    )
    plan, constants = _extract_plan(mod["main"])
    plan.plan_memory()
    kernel_ops = {
        gv.name_hint: groups.get(gv.name_hint, [op_name(gv.name_hint)]) for gv in kernels.functions
    }
    return Lowered(kernels, plan, constants, {"relax_passes_s": passes_s}, kernel_ops)


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


def _extract_plan(main: relax.Function) -> tuple[Plan, dict[str, np.ndarray]]:
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


def build_cpu(kernels: tvm.IRModule, target: tvm.target.Target, schedule: bool = True):
    """Schedule (unless ``schedule`` is False) and compile the kernels for an LLVM target."""
    if schedule:
        try:
            from .cpu_schedule import schedule_module_cpu
        except ImportError:  # schedules are an optimization; build unscheduled without them
            log.warning("edgecv.build.cpu_schedule is unavailable; kernels run unscheduled")
        else:
            kernels = schedule_module_cpu(kernels, target)
    return tvm.tirx.build(kernels, target=target, pipeline=None)
