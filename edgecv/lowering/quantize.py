"""Post-training static INT8 quantization of convolutions and dense layers (a Relax pass).

TVM 0.27's Relax has no post-training quantizer, so this is edgecv's own, run on the
imported module before the graph tuner and the Relax passes (see
:mod:`edgecv.pipelines.int8`). It rewrites every quantizable operator of ``main``:

- **which**: ``conv2d`` (NCHW data, OIHW weights; any groups, so depthwise too) and
  ``matmul`` against constant weights (MXNet's ``FullyConnected``), in float32. Nothing
  else is touched: pooling, residual adds, softmax, the vision operators stay float32.
- **weights**: per output channel, symmetric int8 (``w = s_w[o] * q``, ``q`` in
  ``[-weight_max, weight_max]``): per channel because BatchNorm scales the channels of
  a convolution apart by orders of magnitude, which one scale for the whole tensor
  would round away in the small channels.
- **activations**: the operator's input is quantized with the scale the calibration
  gave its tensor (:mod:`.calibration`): ``uint8`` when the tensor was never negative
  (after a ReLU: all 256 levels carry magnitude, and ``u8 x s8`` is what AVX2's
  ``vpmaddubsw`` multiplies), else ``int8`` symmetric. Zero is always exactly 0, so the
  convolution's zero padding needs no correction.
- **signed inputs on an unsigned dot product** (``shift_signed``): an ``int8`` input
  of an operator with no padding (a 1x1 convolution, a dense layer) that the CPU's
  ``u8 x s8`` instruction will multiply is read as ``q + 128`` in ``uint8`` (1..255);
  the sum then carries ``128 * sum(w[o])`` more, a constant per output channel that the
  epilogue's add takes back, so the shift costs nothing at run time (MobileNetV2's
  expansion convolutions read its linear bottlenecks, which are signed). With padding
  the border would add ``128 * w`` where zero was meant, so those stay as they are.
- **accumulation** in int32 (``conv2d(..., out_dtype="int32")``).
- **epilogue**: the int32 result is cast to float32 and multiplied by ``s_x * s_w[o]``;
  the per-channel affine operators that follow it (the bias ``add``, BatchNorm's folded
  ``multiply`` + ``add``) are folded into that one multiply and one add, so TVM's fusion
  makes one kernel of the convolution, its requantization, bias/BatchNorm and the
  activation after it.
- **edges**: a tensor read by quantized operators is quantized once
  (``round(x / s)``, clipped, cast), right where it is made: FuseOps puts that into the
  epilogue of the kernel that produces it, so consecutive quantized convolutions pass
  ``uint8``/``int8`` tensors between them, and the float32 value exists only where a
  float32 operator (pooling, an output) reads it too.
- **residual adds** (``residual_adds=True``, the CPU pipeline's choice): an ``add`` that
  reads such a tensor reads its 8-bit values, dequantized (``q * s``) inside the add's
  own kernel, when adds and quantized operators are all that read it. The tensor is
  then never written in float32: the kernel that makes it writes 8 bits, a quarter of
  the bytes, and no separate kernel quantizes it (ResNet-50's residual blocks). The add
  sees the value the next convolution sees, clipped and rounded like it.

The statistics come from running the float32 model with every quantized operator's
input as an extra output (:func:`~.quantize_sites.with_taps`). The operators rewritten
are found in :mod:`.quantize_sites`, what is done to each is decided in
:mod:`.quantize_plan`, and this module writes it out.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax

from .calibration import TensorQuant
from .quantize_plan import WEIGHT_MAX, SitePlan, add_record, eight_bit_adds, plan_site
from .quantize_sites import Graph, Site, concatenated, find_sites

R = relax.op


def quantize(
    mod: tvm.IRModule,
    quants: dict[str, TensorQuant],
    weight_max: int | Callable[[Site, TensorQuant], int] = WEIGHT_MAX,
    skip: frozenset[str] = frozenset(),
    arithmetic: Callable[[Site, TensorQuant, int], str] | None = None,
    dense_as_conv: bool = False,
    residual_adds: bool = False,
    shift_signed: Callable[[Site, TensorQuant], bool] | None = None,
) -> tuple[tvm.IRModule, list[dict]]:
    """``mod`` with every site of :func:`find_sites` whose input tensor has a
    quantization in ``quants`` (by tensor key) and whose name is not in ``skip``
    computed in int8 as the module docstring says, and one record per site (the
    manifest's): the scales chosen, the dtype of its input, the operators folded into
    its epilogue. ``weight_max``: the largest weight magnitude, or a function of the
    site and its input's quantization giving it (7 bits where the kernel's instruction
    would saturate on 8). ``arithmetic(site, quant, weight_max)``: ``int32`` (the
    default: integer tensors, an int32 accumulator) or ``float32``: the same integer
    values held in float32 tensors and summed by the float32 kernels, bit for bit the
    int32 result where :func:`~.quantize_plan.exact_in_float32` holds, for operators the CPU has no
    faster integer kernel for (a depthwise convolution runs as fast as in float32
    instead of 2x slower in int32 lanes), or None: the operator stays float32, not
    quantized (no record). ``dense_as_conv``: ``int32`` dense layers of 2-D data are
    written as the 1x1 convolutions they are (``(N, K)`` as ``(N, K, 1, 1)``), for a CPU
    whose dot-product kernels are convolution kernels. ``residual_adds``: adds read the
    8-bit values of a quantized tensor (the module docstring; one record each, ``op``
    ``add``). ``shift_signed(site, quant)``: whether an ``int32`` operator without
    padding reads its ``int8`` input as ``uint8`` shifted by
    :data:`~.quantize_plan.SIGNED_SHIFT` (for a CPU whose dot product multiplies
    unsigned data; the module docstring)."""
    graph = Graph.of(mod)
    found = find_sites(mod)
    plans: dict[relax.Var, SitePlan] = {}
    for site in found.sites:
        quant = quants.get(site.tensor)
        if quant is None or site.name in skip:
            continue
        limit = weight_max(site, quant) if callable(weight_max) else weight_max
        kind = "int32" if arithmetic is None else arithmetic(site, quant, limit)
        if kind is None:
            continue  # left in float32: no integer kernel would be faster
        shifted = kind == "int32" and shift_signed is not None and shift_signed(site, quant)
        plans[site.var] = plan_site(site, quant, limit, kind, graph, dense_as_conv, shifted)
    records = [plan.record() for plan in plans.values()]
    if not plans:
        return mod, records
    adds = eight_bit_adds(graph, found, plans) if residual_adds else {}
    records += [add_record(var.name, key, quants[key]) for var, (key, _) in adds.items()]
    rewritten = _Quantizer(mod, graph, plans, adds, quants).visit_expr(graph.func)
    updated = tvm.IRModule(dict(mod.functions))
    updated["main"] = rewritten
    return relax.transform.DeadCodeElimination(["main"])(updated), records


def quantize_tensor(
    x: relax.Expr, quant: TensorQuant, dtype: str | None = None, shift: int = 0
) -> relax.Expr:
    """``round(x / scale)`` clipped to the integer range, plus ``shift``, cast to
    ``dtype`` (default the quantization's own; ``float32`` keeps the integer values in
    floats), elementwise: it fuses into the kernel that produces ``x``."""
    scaled = R.multiply(x, relax.const(1.0 / quant.scale, "float32"))
    rounded = R.clip(R.round(scaled), quant.qmin, quant.qmax)
    if shift:
        rounded = R.add(rounded, relax.const(float(shift), "float32"))
    return R.astype(rounded, dtype or quant.dtype)


@relax.expr_functor.mutator
class _Quantizer(relax.PyExprMutator):
    """Writes ``main`` as the plans say: each site's operator on its quantized input and
    weights with its folded epilogue, the chosen adds on dequantized 8-bit values, and
    each tensor quantized once per dtype and shift its readers want."""

    def __init__(
        self,
        mod: tvm.IRModule,
        graph: Graph,
        plans: dict[relax.Var, SitePlan],
        adds: dict[relax.Var, tuple[str, relax.Var]],
        quants: dict[str, TensorQuant],
    ):
        super().__init__(mod)
        self.graph, self.plans, self.adds, self.quants = graph, plans, adds, quants
        self.absorbed = {var for plan in plans.values() for var in plan.epilogue.absorbed}
        self.made: dict[tuple[str, str, int], relax.Var] = {}

    def quantized(
        self, key: str, tensor: relax.Var, dtype: str | None = None, shift: int = 0
    ) -> relax.Var:
        """``tensor`` quantized (once per dtype and shift), right where it is made."""
        quant = self.quants[key]
        dtype = dtype or quant.dtype
        if (key, dtype, shift) in self.made:
            return self.made[key, dtype, shift]
        pieces = concatenated(tensor, self.graph.bindings)
        readers = sum(plan.site.tensor == key for plan in self.plans.values())
        if pieces is not None and self.graph.uses.get(tensor, 0) == readers:
            # only quantized operators read the concatenation: its pieces are quantized
            # instead (elementwise, so the same values), each in the kernel that makes
            # it, and concatenated in 8 bits
            quantized_pieces = [
                self.builder_.emit(quantize_tensor(self.visit_expr(piece), quant, dtype, shift))
                for piece in pieces
            ]
            axis = int(self.graph.bindings[tensor].attrs.axis)
            made = self.builder_.emit(R.concat(quantized_pieces, axis))
        else:
            data = self.visit_expr(tensor)
            made = self.builder_.emit(quantize_tensor(data, quant, dtype, shift))
        self.made[key, dtype, shift] = made
        return made

    def dequantized(self, key: str, tensor: relax.Var) -> relax.Expr:
        q = self.quantized(key, tensor)
        return R.multiply(R.astype(q, "float32"), relax.const(self.quants[key].scale, "float32"))

    def emit_as(self, var: relax.Var, value: relax.Expr) -> None:
        """``value`` bound in place of ``var`` (an output of the block if ``var`` was)."""
        dataflow = isinstance(var, relax.DataflowVar)
        emit = self.builder_.emit if dataflow else self.builder_.emit_output
        self.set_var_remap(var, emit(value))

    def visit_var_binding_(self, binding):
        var = binding.var
        if var in self.absorbed:
            return  # folded into the epilogue of its site
        if var in self.adds:
            key, tensor = self.adds[var]
            args = [
                self.dequantized(key, tensor) if a.same_as(tensor) else self.visit_expr(a)
                for a in binding.value.args
            ]
            self.emit_as(var, R.add(*args))
        elif var in self.plans:
            plan = self.plans[var]
            site = plan.site
            data = self.quantized(site.tensor, site.call.args[0], plan.input_dtype, plan.shift)
            acc, shape = self.accumulate(plan, data)
            acc = self.builder_.emit(acc)
            if plan.arithmetic == "int32":
                acc = R.astype(acc, "float32")
            epilogue = plan.epilogue
            y = R.multiply(acc, relax.const(epilogue.multiplier.reshape(shape).astype(np.float32)))
            if np.any(epilogue.shift != 0):
                y = R.add(y, relax.const(epilogue.shift.reshape(shape).astype(np.float32)))
            self.emit_as(epilogue.end, y)
        else:
            super().visit_var_binding_(binding)

    def accumulate(self, plan: SitePlan, data: relax.Var) -> tuple[relax.Expr, tuple]:
        """The site's operator on ``data`` and its quantized weights, summing in
        ``plan.arithmetic``, and the shape its per-channel epilogue broadcasts in."""
        site, kind = plan.site, plan.arithmetic
        if kind == "int32":
            weight = relax.const(plan.weight, "int8")
        else:
            weight = relax.const(plan.weight.astype(np.float32))
        if site.op == "conv2d":
            a = site.call.attrs
            layouts = ("NCHW", "OIHW", "NCHW")
            acc = R.nn.conv2d(
                data, weight, a.strides, a.padding, a.dilation, a.groups, *layouts, out_dtype=kind
            )
            return acc, (1, -1, 1, 1)
        if plan.as_conv:  # (N, K) x [O, K] as a 1x1 convolution of (N, K, 1, 1)
            batch, depth = (int(d) for d in site.call.args[0].ty.shape)
            image = self.builder_.emit(R.reshape(data, (batch, depth, 1, 1)))
            acc = self.builder_.emit(R.nn.conv2d(image, weight, out_dtype=kind))
            return R.reshape(acc, (batch, int(plan.weight.shape[0]))), (-1,)
        return R.matmul(data, weight, out_dtype=kind), (-1,)


__all__ = ["quantize", "quantize_tensor"]
