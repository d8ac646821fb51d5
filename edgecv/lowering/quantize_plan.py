"""What INT8 quantization does to each operator it rewrites, decided before the rewrite.

Per site (:class:`SitePlan`, from :func:`plan_site`): its weights quantized per output
channel, the per-channel affine operators after it folded into one multiply and add
(:class:`Epilogue`), whether it computes in int32 or in float32 holding integers,
whether a signed input is read shifted into uint8 (:data:`SIGNED_SHIFT`), and the
record the manifest keeps of it. :func:`eight_bit_adds` chooses the residual adds that
read a quantized tensor's 8-bit values. :mod:`.quantize` writes the decisions out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from .calibration import TensorQuant
from .quantize_sites import Graph, Site, Sites, concatenated, constant_value, is_float32, reads

_AFFINE = {
    tvm.ir.Op.get("relax.add"): "add",
    tvm.ir.Op.get("relax.subtract"): "subtract",
    tvm.ir.Op.get("relax.multiply"): "multiply",
    tvm.ir.Op.get("relax.divide"): "divide",
}
_ADD = tvm.ir.Op.get("relax.add")

# The largest magnitude of a quantized weight. 127 uses the whole int8 range; a kernel
# that pairs u8 x s8 products into int16 (AVX2's vpmaddubsw) may need 7 bits (63).
WEIGHT_MAX = 127


def quantize_weights(weight: np.ndarray, weight_max: int = WEIGHT_MAX):
    """Per-output-channel symmetric quantization: (int8 weights, float64 scales)."""
    channels = weight.shape[0]
    peak = np.abs(weight.astype(np.float64)).reshape(channels, -1).max(axis=1)
    scales = np.where(peak > 0, peak / weight_max, 1.0)
    shape = (channels,) + (1,) * (weight.ndim - 1)
    q = np.clip(np.rint(weight / scales.reshape(shape)), -weight_max, weight_max)
    return q.astype(np.int8), scales


def _channel_vector(value: np.ndarray, out_shape: list[int], axis: int) -> np.ndarray | None:
    """``value`` as one number per channel when it broadcasts against an output of
    ``out_shape`` along the channel ``axis`` only (a bias, BatchNorm's scale or shift,
    a scalar); None when it varies along another axis or would grow the output."""
    if value.ndim > len(out_shape):
        return None
    shape = (1,) * (len(out_shape) - value.ndim) + value.shape
    channels = out_shape[axis]
    for i, (d, out) in enumerate(zip(shape, out_shape, strict=True)):
        if d != 1 and (i != axis or d != out):
            return None
    return (
        np.broadcast_to(value.reshape(shape), shape[:axis] + (channels,) + shape[axis + 1 :])
        .reshape(-1)
        .astype(np.float64)
    )


@dataclass
class Epilogue:
    """The per-channel affine operators after a site, folded: ``y = acc * m + c``."""

    end: relax.Var  # the last folded binding: its users read the new epilogue instead
    absorbed: list[relax.Var]
    ops: list[str]
    multiplier: np.ndarray
    shift: np.ndarray


def fold_epilogue(site: Site, multiplier: np.ndarray, graph: Graph, axis: int) -> Epilogue:
    """The per-channel affine operators read once after ``site`` (along the output
    channel ``axis``), folded into ``acc * multiplier`` as one multiply and one add."""
    bindings, uses, users = graph.bindings, graph.uses, graph.users
    out_shape = [int(d) for d in site.call.ty.shape]
    end, absorbed, ops = site.var, [], []
    m, c = multiplier.astype(np.float64), np.zeros_like(multiplier, np.float64)
    while uses.get(end, 0) == 1 and end in users:
        user_var, call = users[end]
        kind = _AFFINE.get(call.op) if isinstance(call, relax.Call) else None
        if kind is None or not isinstance(user_var, relax.DataflowVar) or not is_float32(call):
            break
        if [int(d) for d in call.ty.shape] != out_shape:
            break
        lhs, rhs = call.args
        if lhs.same_as(end):
            other = rhs
        elif rhs.same_as(end) and kind in ("add", "multiply"):
            other = lhs
        else:
            break
        value = constant_value(other, bindings)
        vector = None if value is None else _channel_vector(value, out_shape, axis)
        if vector is None or (kind == "divide" and not np.all(vector != 0)):
            break
        if kind == "add":
            c = c + vector
        elif kind == "subtract":
            c = c - vector
        elif kind == "multiply":
            m, c = m * vector, c * vector
        else:
            m, c = m / vector, c / vector
        absorbed.append(user_var)
        ops.append(kind)
        end = user_var
    return Epilogue(end, absorbed, ops, m, c)


# What a signed input read by an unsigned dot product is shifted by: -127..127 -> 1..255.
SIGNED_SHIFT = 128


def shiftable(site: Site, quant: TensorQuant) -> bool:
    """Whether ``site`` may read its input shifted by :data:`SIGNED_SHIFT`: a signed
    input and no padding (a dense layer, a convolution with padding 0), where the shift
    adds ``SIGNED_SHIFT * sum(w[o])`` to every sum and nothing else."""
    unpadded = site.op == "dense" or all(int(p) == 0 for p in site.call.attrs.padding)
    return quant.dtype == "int8" and unpadded


def input_dtype(site: Site, arithmetic: str) -> str | None:
    """The dtype of the quantized input an operator reads (None: the quantization's).

    In float32 arithmetic a depthwise convolution reads the integer tensor, a quarter
    of float32's bytes, and its kernel casts each vector as it loads it; an operator
    that broadcasts one input value to a vector of output channels (a first
    convolution, a dense layer) reads float32 values, as a cast per broadcast costs
    more than the bytes save (both measured on MobileNet1.0:
    benchmarks/results/int8_cpu-2026-11-26-zen3.md)."""
    if arithmetic == "float32" and not (site.op == "conv2d" and int(site.call.attrs.groups) > 1):
        return "float32"
    return None


# float32 holds every integer up to 2**24 exactly: a dot product of K int8 x int8 terms
# computed in float32 is the int32 result, bit for bit, while K * |x| * |w| < 2**24.
FLOAT32_EXACT = 2**24


def exact_in_float32(site: Site, quant: TensorQuant, weight_max: int) -> bool:
    """Whether ``site``'s integer dot products stay below :data:`FLOAT32_EXACT` (a 3x3
    depthwise: 9 x 255 x 127 = 291,465; a 1x1 of 512 channels: 16.6 million, not)."""
    terms = int(np.prod(site.weight.shape[1:]))
    return terms * max(abs(quant.qmin), quant.qmax) * weight_max < FLOAT32_EXACT


@dataclass
class SitePlan:
    """How one site is rewritten."""

    site: Site
    quant: TensorQuant  # of the tensor it reads
    weight_max: int
    weight: np.ndarray  # its quantized values: OIHW, [O, K, 1, 1] as a 1x1, dense [in, out]
    weight_scales: np.ndarray  # per output channel
    epilogue: Epilogue
    arithmetic: str  # "int32", or "float32": the same integers summed in float32
    as_conv: bool  # an int32 dense layer written as a 1x1 convolution
    shift: int  # added to a signed input read as uint8 (0: none)

    @property
    def input_dtype(self) -> str | None:
        """The dtype of the quantized input it reads (None: the quantization's)."""
        return "uint8" if self.shift else input_dtype(self.site, self.arithmetic)

    def record(self) -> dict:
        """The manifest's record of the site: the scales chosen, the dtype of its input,
        the operators folded into its epilogue."""
        site, quant, shift = self.site, self.quant, self.shift
        return {
            "name": site.name,
            "op": site.op,
            "weight_shape": list(site.weight.shape),
            "weight_max": self.weight_max,
            "input": site.tensor,
            "input_dtype": "uint8" if shift else quant.dtype,
            "input_scale": quant.scale,
            "input_max": quant.qmax,
            **({"input_shift": shift} if shift else {}),
            "weight_scale_min": float(self.weight_scales.min()),
            "weight_scale_max": float(self.weight_scales.max()),
            "epilogue": self.epilogue.ops,
            "arithmetic": self.arithmetic,
            **({"as": "conv2d 1x1"} if self.as_conv else {}),
        }


def plan_site(
    site: Site,
    quant: TensorQuant,
    limit: int,
    kind: str,
    graph: Graph,
    dense_as_conv: bool = False,
    shifted: bool = False,
) -> SitePlan:
    """``site`` reading ``quant``, its weights within ``limit``, computed in ``kind``
    (``int32`` or ``float32``); an ``int32`` dense layer of 2-D data as a 1x1
    convolution when ``dense_as_conv``; its signed input read shifted into uint8 when
    ``shifted`` (the sums' extra ``SIGNED_SHIFT * sum(w[o])`` taken back by the
    epilogue's add). Raises ValueError where the choice cannot be exact."""
    q_weight, w_scales = quantize_weights(site.weight, limit)
    axis = 1 if site.op == "conv2d" else len(site.call.ty.shape) - 1
    epilogue = fold_epilogue(site, quant.scale * w_scales, graph, axis)
    data_rank = len(site.call.args[0].ty.shape)
    as_conv = site.op == "dense" and kind == "int32" and data_rank == 2 and dense_as_conv
    if as_conv:
        q_weight = q_weight.reshape(*q_weight.shape, 1, 1)  # [out, in, 1, 1]
    elif site.op == "dense":
        q_weight = np.ascontiguousarray(q_weight.T)  # back to [in, out]
    if kind == "float32" and not exact_in_float32(site, quant, limit):
        raise ValueError(f"{site.name}: its sums exceed float32's exact integers")
    shift = 0
    if shifted:
        if not shiftable(site, quant):
            raise ValueError(f"{site.name}: a shifted input needs a signed one, no padding")
        shift = SIGNED_SHIFT  # the sums carry shift * sum(w[o]): taken back here
        # the weights' output channel: first (OIHW, dense as a 1x1), last (dense [in, out])
        out_axis = 1 if site.op == "dense" and not as_conv else 0
        sums = np.moveaxis(q_weight, out_axis, 0).reshape(q_weight.shape[out_axis], -1)
        epilogue.shift = epilogue.shift - shift * sums.sum(axis=1) * epilogue.multiplier
    return SitePlan(site, quant, limit, q_weight, w_scales, epilogue, kind, as_conv, shift)


def eight_bit_adds(graph: Graph, found: Sites, plans: dict[relax.Var, SitePlan]) -> dict:
    """The adds that may read a quantized tensor's 8-bit values: ``{add's var: (the
    tensor's key, its var)}`` for every tensor that quantized operators read in its own
    integer dtype and that nothing but them and float32 adds of its shape reads (not
    an output of the function, not read twice by one add)."""
    bindings = graph.bindings
    integer_reads = {  # in the quantization's own uint8/int8
        plan.site.tensor for plan in plans.values() if plan.input_dtype is None
    }
    readers: dict[relax.Var, list[tuple[relax.Var, relax.Expr]]] = {}
    for var, value in bindings.items():
        for used in reads(value):
            readers.setdefault(used, []).append((var, value))
    outputs = set(reads(graph.func.body.body))
    chosen = {}
    for key in integer_reads:
        tensor = found.tensors[key]
        if tensor in outputs or concatenated(tensor, bindings) is not None:
            continue
        shape = [int(d) for d in tensor.ty.shape]
        adds = []
        for var, value in readers.get(tensor, []):
            if var in plans and plans[var].site.tensor == key:
                continue
            is_add = (
                isinstance(value, relax.Call)
                and value.op.same_as(_ADD)
                and is_float32(value)
                and [int(d) for d in value.ty.shape] == shape
                and sum(a.same_as(tensor) for a in value.args) == 1
            )
            if not is_add:
                break
            adds.append(var)
        else:
            chosen.update({add: (key, tensor) for add in adds})
    return chosen


def add_record(name: str, key: str, quant: TensorQuant) -> dict:
    """The manifest's record of an add that reads the tensor ``key`` in 8 bits."""
    return {
        "name": name,
        "op": "add",
        "input": key,
        "input_dtype": quant.dtype,
        "input_scale": quant.scale,
        "arithmetic": "float32",
    }
