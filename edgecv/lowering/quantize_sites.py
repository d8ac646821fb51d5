"""The operators INT8 quantization rewrites, and what the rewrite reads of the graph.

:func:`find_sites` names each quantizable operator of ``main`` (a float32 ``conv2d``
in NCHW/OIHW, a ``matmul`` against constant weights) and the tensor it reads;
:func:`with_taps` adds those tensors to ``main``'s outputs so the calibration run
observes them. The rest are questions :mod:`.quantize_plan` and :mod:`.quantize` ask
of ``main``'s bindings: a constant's value through reshapes and transposes, who reads
a variable and how often, the pieces of a concatenation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

CONV2D = tvm.ir.Op.get("relax.nn.conv2d")
MATMUL = tvm.ir.Op.get("relax.matmul")
_CONCAT = tvm.ir.Op.get("relax.concat")
_RESHAPE = tvm.ir.Op.get("relax.reshape")
_PERMUTE = tvm.ir.Op.get("relax.permute_dims")


@dataclass
class Site:
    """One quantizable operator of ``main``: ``var = conv2d(data, weight)`` or
    ``var = matmul(data, weight)``."""

    name: str  # conv2d_3, dense_0: the operator's kind and its index in ``main``
    op: str  # "conv2d" or "dense"
    var: relax.Var  # what the operator's binding defines
    call: relax.Call
    tensor: str  # the key of the input tensor it reads (t0, t1, ...)
    weight: np.ndarray  # float32, output channel first: OIHW, or [out, in] for dense


@dataclass
class Sites:
    """The quantizable operators of a module and the tensors they read, in order."""

    sites: list[Site] = field(default_factory=list)
    tensors: dict[str, relax.Var] = field(default_factory=dict)  # key -> the tensor's var
    readers: dict[str, list[str]] = field(default_factory=dict)  # key -> site names


def bindings_of(func: relax.Function) -> dict[relax.Var, relax.Expr]:
    """Each variable bound in ``func`` and the value bound to it, in order."""
    return {b.var: b.value for block in func.body.blocks for b in block.bindings}


@dataclass
class Graph:
    """``main`` as the rewrite reads it: what each variable is bound to, how many times
    it is read, and the last binding that reads it."""

    func: relax.Function
    bindings: dict[relax.Var, relax.Expr]
    uses: dict[relax.Var, int]
    users: dict[relax.Var, tuple[relax.Var, relax.Expr]]

    @classmethod
    def of(cls, mod: tvm.IRModule) -> Graph:
        func = mod["main"]
        bindings = bindings_of(func)
        return cls(func, bindings, use_counts(func), users_of(bindings))


def constant_value(expr: relax.Expr, bindings: dict) -> np.ndarray | None:
    """The value of ``expr`` when it is a constant, possibly bound to variables and
    reshaped or transposed on the way (how the importer writes weights and per-channel
    vectors); None otherwise."""
    while isinstance(expr, relax.Var) and expr in bindings:
        expr = bindings[expr]
    if isinstance(expr, tvm.ir.expr.Constant):
        return expr.value.numpy()
    if isinstance(expr, relax.Call) and expr.op.same_as(_RESHAPE):
        value = constant_value(expr.args[0], bindings)
        if value is None or not isinstance(expr.ty, relax.TensorType) or expr.ty.shape is None:
            return None
        return value.reshape([int(d) for d in expr.ty.shape])
    if isinstance(expr, relax.Call) and expr.op.same_as(_PERMUTE):
        value = constant_value(expr.args[0], bindings)
        if value is None:
            return None
        axes = expr.attrs.axes
        return np.transpose(value, None if axes is None else [int(a) for a in axes])
    return None


def is_float32(expr: relax.Expr) -> bool:
    ty = expr.ty
    return isinstance(ty, relax.TensorType) and str(ty.dtype) == "float32"


def _site_weight(call: relax.Call, bindings: dict) -> tuple[str, np.ndarray] | None:
    """(kind, float32 weights with the output channel first) of a quantizable call."""
    if not (isinstance(call.args[0], relax.Var) and is_float32(call.args[0]) and is_float32(call)):
        return None
    if call.op.same_as(CONV2D):
        attrs = call.attrs
        layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout))
        if layouts != ("NCHW", "OIHW", "NCHW"):
            return None
        weight = constant_value(call.args[1], bindings)
        return None if weight is None or weight.ndim != 4 else ("conv2d", weight)
    if call.op.same_as(MATMUL):
        if len(call.args[0].ty.shape) != 2:
            return None
        weight = constant_value(call.args[1], bindings)  # [in, out]
        return None if weight is None or weight.ndim != 2 else ("dense", weight.T)
    return None


def find_sites(mod: tvm.IRModule) -> Sites:
    """The quantizable operators of ``mod["main"]`` and the tensors they read."""
    func = mod["main"]
    bindings = bindings_of(func)
    found = Sites()
    keys: dict[relax.Var, str] = {}
    counts = {"conv2d": 0, "dense": 0}
    for var, value in bindings.items():
        if not isinstance(value, relax.Call):
            continue
        kind_weight = _site_weight(value, bindings)
        if kind_weight is None:
            continue
        kind, weight = kind_weight
        data = value.args[0]
        if data not in keys:
            keys[data] = f"t{len(keys)}"
            found.tensors[keys[data]] = data
        name = f"{kind}_{counts[kind]}"
        counts[kind] += 1
        found.sites.append(Site(name, kind, var, value, keys[data], weight.astype(np.float32)))
        found.readers.setdefault(keys[data], []).append(name)
    return found


def with_taps(mod: tvm.IRModule, tensors: list[relax.Var]) -> tvm.IRModule:
    """``mod`` whose ``main`` returns, after its own outputs, each of ``tensors`` (the
    calibration run reads the inputs of the quantizable operators this way)."""
    func = mod["main"]
    wanted = list(tensors)
    taps: dict[relax.Var, relax.Var] = {}

    @relax.expr_functor.mutator
    class Tapper(relax.PyExprMutator):
        def visit_var_binding_(self, binding):
            if self.builder_.current_block_is_dataflow():
                # the model's inputs, in the first dataflow block: no binding defines them
                for param in func.params:
                    if param in wanted and param not in taps:
                        taps[param] = self.builder_.emit_output(param)
            super().visit_var_binding_(binding)
            if binding.var in wanted:
                taps[binding.var] = self.builder_.emit_output(self.visit_expr(binding.var))

    rewritten = Tapper(mod).visit_expr(func)
    missing = [v.name for v in wanted if v not in taps]
    if missing:
        raise ValueError(f"tensors {missing} are not bound in a dataflow block of main")
    body = rewritten.body
    outputs = body.body
    fields = _flat_fields(outputs) + [taps[v] for v in wanted]
    result_type = relax.TupleType([f.ty for f in fields])
    tapped = relax.Function(
        rewritten.params,
        relax.SeqExpr(body.blocks, relax.Tuple(fields)),
        result_type,
        attrs=rewritten.attrs,
    )
    updated = tvm.IRModule(dict(mod.functions))
    updated["main"] = relax.BlockBuilder().normalize(tapped)
    return updated


def _flat_fields(expr: relax.Expr) -> list[relax.Expr]:
    """The leaves of a (possibly nested) tuple of outputs (a detector returns
    ``((ids, scores, boxes),)``-like nests), each a tensor: the taps go after them in
    one flat tuple."""
    if isinstance(expr, relax.Tuple):
        return [leaf for f in expr.fields for leaf in _flat_fields(f)]
    if isinstance(expr.ty, relax.TupleType):
        return [
            leaf
            for i in range(len(expr.ty.fields))
            for leaf in _flat_fields(relax.TupleGetItem(expr, i))
        ]
    return [expr]


def users_of(bindings: dict) -> dict[relax.Var, tuple[relax.Var, relax.Expr]]:
    """For each variable, the last binding that reads it (meaningful for variables
    read once, which is all :func:`~.quantize_plan.fold_epilogue` asks about)."""
    users = {}
    for var, value in bindings.items():
        for used in relax.analysis.free_vars(value):
            users[used] = (var, value)
    return users


def use_counts(func: relax.Function) -> dict[relax.Var, int]:
    """How many times each variable is read, by bindings and by ``func``'s result."""
    counts: dict[relax.Var, int] = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            for used in reads(binding.value):
                counts[used] = counts.get(used, 0) + 1
    for used in reads(func.body.body):
        counts[used] = counts.get(used, 0) + 1
    return counts


def reads(expr: relax.Expr) -> list[relax.Var]:
    """Variables ``expr`` reads, once per time it reads them (``add(x, x)``: twice)."""
    if isinstance(expr, relax.Var):
        return [expr]
    if isinstance(expr, relax.Call):
        return [v for a in expr.args for v in reads(a)]
    if isinstance(expr, relax.Tuple):
        return [v for f in expr.fields for v in reads(f)]
    if isinstance(expr, relax.TupleGetItem):
        return reads(expr.tuple_value)
    return list(relax.analysis.free_vars(expr))


def concatenated(tensor: relax.Expr, bindings: dict) -> list[relax.Expr] | None:
    """The pieces of ``tensor`` when it is bound to a ``concat`` of a tuple written out
    (a fire module's or an inception block's output), else None."""
    value = bindings.get(tensor) if isinstance(tensor, relax.Var) else None
    if not (isinstance(value, relax.Call) and value.op.same_as(_CONCAT)):
        return None
    fields = value.args[0]
    if not isinstance(fields, relax.Tuple) or value.attrs.axis is None:
        return None
    return list(fields.fields)
