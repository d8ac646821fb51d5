"""Half precision for GPU profiles: which operators compute in float16, in one table.

``--precision fp16`` runs TVM's mixed-precision pass (``relax.transform.ToMixedPrecision``)
over the imported module before anything else. The pass decides per operator from the
``TMixedPrecisionPolicy`` attribute of the Relax op: ``always`` (inputs cast to float16:
convolutions, matmul), ``follow`` (float16 when every float input is, so chains of
elementwise operators stay in float16 and fuse without casts) or ``never`` (inputs cast to
float32, the output float32). :data:`HALF_PRECISION` is edgecv's choice for the operators its
frontend emits where TVM's default is not what these models need, each with the reason; it
is registered on the ops (above TVM's own level) right before the pass runs, so the table
is what the pass does. Operators not in it keep TVM's policy (elementwise arithmetic,
pooling, reshapes, concatenation: ``follow``; reductions: ``never``).

Weights follow their operator: a float16 convolution's weights are cast in the module and
folded by the lowering's ``FoldConstant``, so the package stores them as float16.

A launch the placement moves to the CPU computes in float32 (:func:`widen_kernels`): the
boards' CPUs (Atom, Cortex-A) have no float16 arithmetic worth using, and the CPU part of a
package is the same float32 code as in an fp32 package; the device copies convert.
"""

from __future__ import annotations

import threading

import tvm
from tvm import relax, tirx

# TVM's MixedPrecisionPolicyKind values
_POLICY = {"fp16": 0, "follow": 1, "fp32": 2}
# Above the level TVM registers its own policies at (10), so these win.
_LEVEL = 11

# Relax op -> (policy, why). "fp16": computed in float16; "follow": float16 when its
# inputs are; "fp32": inputs cast to float32 and the result kept in float32.
HALF_PRECISION: dict[str, tuple[str, str]] = {
    "relax.nn.conv2d": (
        "fp16",
        "the bulk of the work; weights rounded to 2^-11 relative, "
        "as OpenVINO's and TFLite's GPU paths do",
    ),
    "relax.nn.conv1d": ("fp16", "as conv2d"),
    "relax.nn.conv2d_transpose": ("fp16", "as conv2d"),
    "relax.matmul": ("fp16", "dense layers: as conv2d"),
    "relax.nn.leakyrelu": (
        "follow",
        "max(x, a*x): one rounded product; TVM's default (fp32) "
        "would store every darknet convolution's output in float32",
    ),
    "relax.clip": ("follow", "relu6 and friends: exact in float16"),
    "relax.nn.pad": ("follow", "moves values, computes nothing"),
    "relax.repeat": ("follow", "moves values (nearest upsampling)"),
    "relax.tile": ("follow", "moves values"),
    "relax.flip": ("follow", "moves values"),
    "relax.nn.softmax": (
        "fp32",
        "exp overflows float16 past 11.1 and the sum over classes "
        "loses the small probabilities; class scores feed NMS",
    ),
    "relax.nn.log_softmax": ("fp32", "as softmax"),
    "relax.sum": ("fp32", "large sums: float16's step at 2048 is 2"),
    "relax.mean": ("fp32", "global average pooling sums H*W values (169 in SqueezeNet)"),
    "relax.nn.adaptive_avg_pool2d": ("fp32", "global average pooling, as mean"),
    "relax.exp": (
        "fp32",
        "overflows float16 past 11.1; YOLO decodes box sizes as exp(t) * anchor in pixels",
    ),
    "relax.nn.softplus": ("fp32", "log(1 + exp(x)): exp overflows float16"),
    "relax.call_tir": (
        "fp32",
        "edgecv's vision operators (box NMS scores and IoU, box "
        "decode, MultiBox prior/detection, ROIAlign, sorts): corners in "
        "pixels have float16 steps of 0.25-0.5 px at 256-512 px, enough to "
        "move an IoU across the NMS threshold",
    ),
}

# What a float16 convolution accumulates in (the pass's ``out_dtype``): float16, so the
# device's float16 multiply-add runs at its full rate (twice float32 on Intel Gen9 and
# Mali Midgard). The error it adds grows like sqrt(K) u for K products per output
# (edgecv.testing.FP16_PER_LAYER).
ACCUMULATE = "float16"


_registered = threading.Lock()
_done: list[bool] = []


def register_policies() -> None:
    """Put :data:`HALF_PRECISION` on the Relax ops, once per process (TVM refuses a
    second registration at the same level)."""
    with _registered:
        if _done:
            return
        for name, (policy, _why) in HALF_PRECISION.items():
            tvm.ir.register_op_attr(name, "TMixedPrecisionPolicy", _POLICY[policy], _LEVEL)
        _done.append(True)


def to_half(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with its operators in float16 per :data:`HALF_PRECISION`; its inputs and
    outputs keep their dtypes (the pass casts at both ends)."""
    register_policies()
    guarded = relax.transform.ToMixedPrecision(out_dtype=ACCUMULATE)(_guard_call_tir(mod))
    return _drop_identity_casts(guarded)


def _guard_call_tir(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every float32 tensor a ``call_tir`` reads bound through
    ``astype(float32)`` first.

    TVM 0.27's pass fails on a ``call_tir`` whose input it made float16 ("Expected
    TensorType, but got R.Callable": restoring the inputs' dtypes it asks the type of every
    argument, the PrimFunc's GlobalVar included). Behind the cast the conversion back to
    float32 happens at the cast, and the ``call_tir``'s own arguments never change. Casts
    that stay float32 to float32 are dropped after the pass (:func:`_drop_identity_casts`)."""
    call_tir = tvm.ir.Op.get("relax.call_tir")

    @relax.expr_functor.mutator
    class Guard(relax.PyExprMutator):
        def visit_call_(self, call: relax.Call) -> relax.Expr:
            call = super().visit_call_(call)
            if not call.op.same_as(call_tir) or not isinstance(call.args[1], relax.Tuple):
                return call
            fields = [
                self.builder_.emit(relax.op.astype(arg, "float32")) if _float32_var(arg) else arg
                for arg in call.args[1].fields
            ]
            return relax.Call(
                call.op,
                [call.args[0], relax.Tuple(fields), *call.args[2:]],
                call.attrs,
                call.ty_args,
            )

    return _map_relax_functions(mod, Guard())


def _drop_identity_casts(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` without ``astype`` calls whose input already has the dtype they cast to."""
    astype = tvm.ir.Op.get("relax.astype")

    @relax.expr_functor.mutator
    class Drop(relax.PyExprMutator):
        def visit_call_(self, call: relax.Call) -> relax.Expr:
            call = super().visit_call_(call)
            if call.op.same_as(astype) and _dtype(call.args[0]) == str(call.attrs.dtype):
                return call.args[0]
            return call

    return _map_relax_functions(mod, Drop())


def _float32_var(expr: relax.Expr) -> bool:
    return isinstance(expr, relax.Var) and _dtype(expr) == "float32"


def _dtype(expr: relax.Expr) -> str | None:
    ty = expr.ty
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else None


def _map_relax_functions(mod: tvm.IRModule, mutator) -> tvm.IRModule:
    """A copy of ``mod`` with ``mutator`` applied to each of its Relax functions."""
    updated = mod.clone()
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            updated[gv] = mutator.visit_expr(func)
    return updated


def computes_in_half(func: tirx.PrimFunc) -> bool:
    """Whether a kernel reads or writes a float16 tensor."""
    return any(str(getattr(param, "dtype", "")) == "float16" for param in func.params)


def widen_kernels(kernels: tvm.IRModule) -> tvm.IRModule:
    """The kernels with every float16 in them made float32 (tensors, casts, constants):
    the CPU fallback's versions of float16 kernels. Kernels without float16 come back as
    they are (the same objects: their code is the fp32 package's)."""
    widened = {}
    for gv, func in kernels.functions.items():
        widened[gv] = _widen(func) if computes_in_half(func) else func
    return tvm.IRModule(widened)


def _widen(func: tirx.PrimFunc) -> tirx.PrimFunc:
    # The printed TIR names a dtype only as "float16" (buffers, T.Cast, T.float16
    # literals); printing, replacing and parsing back rebuilds every buffer and
    # expression with float32 and keeps the loops and attributes as they are.
    text = func.script().replace("float16", "float32")
    parsed = tvm.script.from_source(text)
    if isinstance(parsed, tvm.IRModule):
        (parsed,) = parsed.functions.values()
    return parsed.with_attr("global_symbol", func.attrs["global_symbol"])
