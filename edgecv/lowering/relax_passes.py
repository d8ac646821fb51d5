"""Relax module -> (kernels, static plan, constants): the CPU build pipeline.

The order of what runs, in one place:

1. Relax passes: legalize every op to TIR, fold constants, fuse neighbouring ops
   into kernels, turn reshape kernels back into views.
2. Plan extraction: walk ``main``'s bindings in order; every ``call_tir`` becomes a
   launch, every reshape a view, every constant a named parameter.
3. Memory planning (:func:`~edgecv.lowering.memory_plan.plan_memory`), outputs written
   over inputs that die where the kernel allows it (:mod:`.in_place`).
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

from ..board.plan import Plan
from .in_place import concat_pieces, elementwise_inputs, root_blocks
from .legalize import legalize_map
from .memory_plan import plan_memory
from .plan_extraction import extract_plan

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


def fusion_passes(
    winograd: dict | None = None,
    int8_block: int | None = None,
    int8_pairs: bool = False,
    fast_exp: bool = False,
) -> tvm.transform.Pass:
    """Legalize every op to a PrimFunc (convolutions the graph tuner packed by edgecv's
    legalization, :mod:`.legalize`; those in ``winograd`` by Winograd's algorithm;
    sigmoid and SiLU by a vectorizable exp where ``fast_exp``), then group them
    (FuseOps) into kernels-to-be."""
    legalized = legalize_map(winograd, int8_block, int8_pairs, fast_exp)
    return tvm.transform.Sequential(
        [
            relax.transform.LegalizeOps(customize_legalize_map=legalized),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            fuse_ops_keeping_concat_pieces,
        ]
    )


# TVM's pattern kinds (relay/op_attr_types.h): FuseOps fuses nothing into an opaque op
_OPAQUE = 8


@tvm.transform.module_pass(opt_level=0, name="FuseOpsKeepingConcatPieces")
def fuse_ops_keeping_concat_pieces(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """FuseOps, with the concatenations it fused with the ops making some of their inputs
    but not others left alone (fused again with those marked opaque).

    Such a concatenation's other inputs are whole tensors of their own, live beside its
    output: YOLOv3's per-class rows of two scales (29.5 MB) beside the concatenation of
    all three (31.0 MB) that the third scale's kernel wrote. Alone, the concatenation is
    elided by the memory plan (:func:`~.in_place.concat_pieces`) and every producer
    writes its piece in place (see :func:`_half_fused_concatenations` for which)."""
    fused = relax.transform.FuseOps()(mod)
    split = _half_fused_concatenations(fused)
    if not split:
        return fused
    marked = mod.clone()  # the pass's input stays as it was
    for gv in split:
        marked[gv] = mod[gv].with_attr("op_pattern", _OPAQUE)
    return relax.transform.FuseOps()(marked)


def _half_fused_concatenations(fused: tvm.IRModule) -> list[tvm.ir.GlobalVar]:
    """The concatenations (by their PrimFunc) that end a fused group, read one value the
    group computes and the rest from kernels outside it. Alone, such a concatenation
    leaves that one computation a kernel of its own and is elided: no more launches than
    before. With two or more inputs computed in its group (SSD's class and box heads, 20
    pieces, some in the group and some out), taking it out would add a launch per piece;
    with an input that is the model's input or a constant (no kernel can write it in
    place), it would run anyway: both are left fused."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    made: list[relax.Var] = []  # main's values that kernels write
    callers: dict[str, list[list[relax.Expr]]] = {}  # fused function -> its calls' args
    for block in fused["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call | relax.TupleGetItem):
                made.append(binding.var)
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar):
                callers.setdefault(value.op.name_hint, []).append(list(value.args))
    found = []
    for gv, func in fused.functions.items():
        if not isinstance(func, relax.Function) or "Primitive" not in (func.attrs or {}):
            continue
        bindings = [b for block in func.body.blocks for b in block.bindings]
        result = func.body.body
        for binding in reversed(bindings):  # the group's output, through plain renames
            if binding.var.same_as(result) and isinstance(binding.value, relax.Var):
                result = binding.value
        for binding in bindings:
            value = binding.value
            if not (isinstance(value, relax.Call) and value.op.same_as(call_tir)):
                continue
            if not binding.var.same_as(result) or not concat_pieces(fused[value.args[0]]):
                continue
            inputs = list(value.args[1].fields)
            params = list(func.params)
            outside = [k for k, p in enumerate(params) if any(x.same_as(p) for x in inputs)]
            written = all(
                any(args[k].same_as(v) for v in made)
                for args in callers.get(gv.name_hint, [[]])
                for k in outside
                if k < len(args)
            )
            if outside and len(inputs) - len(outside) == 1 and written:
                found.append(value.args[0])
    return found


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
    return re.sub(r"(?<=[A-Za-z_])\d+$", "", primfunc_name)


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


def lower(
    mod: tvm.IRModule,
    winograd: dict | None = None,
    int8_block: int | None = None,
    int8_pairs: bool = False,
    fast_exp: bool = False,
) -> Lowered:
    """Run the Relax passes and extract the static plan (target independent but for
    ``winograd``: the packed convolutions the graph tuner chose to run by Winograd's
    algorithm, ``int8_block``: the lanes of the CPU's int8 dot product, whose
    convolutions take their weights packed for it, and ``int8_pairs``: whether its
    packed convolutions sum two steps in int16 (7-bit data and weights; see
    :func:`.legalize.legalize_map`), and ``fast_exp``: whether sigmoid and SiLU take a
    vectorizable exp (:func:`.legalize.fast_exp_for` the target))."""
    start = time.perf_counter()
    with tvm.transform.PassContext(config={"relax.FuseOps.max_depth": MAX_FUSION_DEPTH}):
        mod = fusion_passes(winograd, int8_block, int8_pairs, fast_exp)(mod)
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
    plan, constants = extract_plan(mod["main"])
    writable, pieces = {}, {}
    for gv, func in kernels.functions.items():
        blocks = root_blocks(func)
        writable[gv.name_hint] = elementwise_inputs(func, blocks)
        pieces[gv.name_hint] = concat_pieces(func, blocks)
    for step in plan.steps:
        step.elementwise_inputs = writable.get(step.kernel, [])
        step.pieces = pieces.get(step.kernel, [])
    plan_memory(plan)
    kernel_ops = {
        gv.name_hint: groups.get(gv.name_hint, [op_name(gv.name_hint)]) for gv in kernels.functions
    }
    return Lowered(kernels, plan, constants, {"relax_passes_s": passes_s}, kernel_ops)
