"""Relax ``main`` -> :class:`~.graph.LayoutGraph`: one node per binding, classified by
how Relax's ``ConvertLayout`` treats its operator.

The module is first passed through ``FoldConstant`` (the importer reshapes every
BatchNorm scale into a ``[1, C, 1, 1]`` constant); the same folded module must then be
handed to :func:`~.apply.convert_layouts`, which finds the convolutions again by the
identity of their calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import tvm
from tvm import relax

from .graph import LayoutGraph, LayoutNode

# Elementwise operators with one tensor input that Relax keeps in their input's packed
# layout (checked by tests/graph_tuner/test_extract.py). Not here: leakyrelu and clip
# (:mod:`.activations` rewrites them into ops that are), prelu.
UNARY = {
    f"relax.{name}"
    for name in (
        "nn.relu nn.gelu nn.silu sigmoid tanh exp log sqrt rsqrt abs negative astype erf "
        "square round floor ceil sin cos"
    ).split()
}
POOLS = {"relax.nn.max_pool2d", "relax.nn.avg_pool2d"}
REDUCTIONS = {"relax.mean", "relax.sum", "relax.max", "relax.min"}
# Broadcasting elementwise operators of two tensors.
BINARY = {
    f"relax.{name}"
    for name in (
        "add subtract multiply divide floor_divide power maximum minimum equal not_equal "
        "greater greater_equal less less_equal"
    ).split()
}
CONV2D = "relax.nn.conv2d"


@dataclass
class Extracted:
    """The layout graph of ``mod`` and, per convolution node, its Relax call."""

    mod: tvm.IRModule
    graph: LayoutGraph
    calls: dict[int, relax.Call] = field(default_factory=dict)
    # the int32 lanes of the CPU's int8 dot product in an INT8 build (its uint8 x int8
    # convolutions are lowered for it, packed or not), else None
    int8_block: int | None = None
    # whether its packed ones sum two steps in int16 (7-bit data: lowering's int8_pairs)
    int8_pairs: bool = False
    # whether sigmoid and SiLU take a vectorizable exp (lowering's fast_exp: CPU targets)
    fast_exp: bool = False


Candidates = Callable[[relax.Call], tuple[str, ...]]


def extract(mod: tvm.IRModule, candidates: Candidates) -> Extracted:
    """The layout graph of ``mod["main"]`` (``mod`` already constant-folded).

    Parameters
    ----------
    mod : tvm.IRModule
        The imported model after ``FoldConstant``.
    candidates : callable
        A conv2d call -> the layouts it may run in (plain first), from the target's
        schedule rules.
    """
    main = mod["main"]
    graph = LayoutGraph()
    out = Extracted(mod, graph)
    values: dict[relax.Var, int | list[int]] = {}
    constants: dict[int, int] = {}

    def ref(expr: relax.Expr) -> list[int]:
        if isinstance(expr, relax.Tuple):
            return [i for field_ in expr.fields for i in ref(field_)]
        if isinstance(expr, relax.Var):
            value = values.get(expr)
            if value is None:  # defined outside what we walked: plain, like an input
                value = values[expr] = graph.add(LayoutNode(expr.name, "input", shape=_shape(expr)))
            return value if isinstance(value, list) else [value]
        if isinstance(expr, tvm.ir.expr.Constant):
            key = expr.__chandle__()
            if key not in constants:
                constants[key] = graph.add(LayoutNode("const", "const", shape=_shape(expr)))
            return [constants[key]]
        return []  # shapes, prim values: no layout

    for param in main.params:
        values[param] = graph.add(LayoutNode(param.name, "input", shape=_shape(param)))
    for block in main.body.blocks:
        for binding in block.bindings:
            var, value = binding.var, binding.value
            if isinstance(value, relax.Tuple):
                values[var] = ref(value)
                continue
            if isinstance(value, relax.Var):
                values[var] = ref(value)
            elif isinstance(value, relax.TupleGetItem):
                source = ref(value.tuple_value)
                values[var] = graph.add(LayoutNode(var.name, "fixed", tuple(source), _shape(var)))
            elif isinstance(value, relax.Call):
                values[var] = _call_node(out, var, value, ref, candidates)
            else:
                values[var] = graph.add(LayoutNode(var.name, "fixed", (), _shape(var)))
            if not isinstance(var, relax.DataflowVar) or not isinstance(block, relax.DataflowBlock):
                # ConvertLayout returns every tensor leaving a dataflow block to plain.
                values[var] = graph.add(
                    LayoutNode(
                        f"{var.name}.out", "fixed", tuple(ref(var)), _shape(var), op="boundary"
                    )
                )
    graph.add(LayoutNode("output", "fixed", tuple(ref(main.body.body)), (), op="output"))
    return out


def _call_node(out: Extracted, var, call: relax.Call, ref, candidates: Candidates) -> int:
    graph = out.graph
    op = call.op.name if isinstance(call.op, tvm.ir.Op) else "call"
    tensors = tuple(i for arg in call.args for i in ref(arg))
    shape = _shape(var)
    kind = "fixed"
    if op == CONV2D and _plain_conv(call):
        choices = candidates(call)
        index = graph.add(LayoutNode(var.name, "conv", tensors, shape, choices, _describe(call)))
        out.calls[index] = call
        return index
    if op in UNARY or op in POOLS:
        kind = "follow"
    elif op in REDUCTIONS and _keeps_channels(call, len(shape) if shape else 0):
        kind = "follow"
    elif op in BINARY and len(tensors) == 2:
        kind = "binary"
    elif op == "relax.concat" and len(tensors) >= 1:
        kind = "concat"
    if kind == "follow" and (len(tensors) != 1 or graph.nodes[tensors[0]].rank != 4):
        kind = "fixed"
    return graph.add(LayoutNode(var.name, kind, tensors, shape, op=op.removeprefix("relax.")))


def _describe(call: relax.Call) -> str:
    """``conv2d 3x3/2``, ``depthwise 3x3/1``: what --explain shows of a convolution."""
    kernel = "x".join(str(int(d)) for d in call.args[1].ty.shape.values[2:])
    stride = int(call.attrs.strides[0])
    kind = "depthwise" if int(call.attrs.groups) > 1 else "conv2d"
    return f"{kind} {kernel}/{stride}"


def _plain_conv(call: relax.Call) -> bool:
    attrs = call.attrs
    return (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout)) == (
        "NCHW",
        "OIHW",
        "NCHW",
    )


def _keeps_channels(call: relax.Call, out_rank: int) -> bool:
    """A reduction over spatial axes only (global pooling written as ``mean``)."""
    axes = call.attrs.axis
    rank = len(call.args[0].ty.shape)
    if axes is None or rank != 4:
        return False
    return 1 not in {int(a) % rank for a in axes} and out_rank >= 2


def _shape(expr: relax.Expr) -> tuple[int, ...]:
    ty = expr.ty
    shape = getattr(ty, "shape", None)
    if shape is None or not hasattr(shape, "values"):
        return ()
    try:
        return tuple(int(d) for d in shape.values)
    except (TypeError, ValueError):  # symbolic sizes: no layout choices here
        return ()
