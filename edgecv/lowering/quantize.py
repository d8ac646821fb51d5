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
input as an extra output (:func:`with_taps`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

R = relax.op

CONV2D = tvm.ir.Op.get("relax.nn.conv2d")
MATMUL = tvm.ir.Op.get("relax.matmul")
_AFFINE = {
    tvm.ir.Op.get("relax.add"): "add",
    tvm.ir.Op.get("relax.subtract"): "subtract",
    tvm.ir.Op.get("relax.multiply"): "multiply",
    tvm.ir.Op.get("relax.divide"): "divide",
}
_CONCAT = tvm.ir.Op.get("relax.concat")
_ADD = tvm.ir.Op.get("relax.add")
_RESHAPE = tvm.ir.Op.get("relax.reshape")
_PERMUTE = tvm.ir.Op.get("relax.permute_dims")

# The largest magnitude of a quantized weight. 127 uses the whole int8 range; a kernel
# that pairs u8 x s8 products into int16 (AVX2's vpmaddubsw) may need 7 bits (63).
WEIGHT_MAX = 127


@dataclass(frozen=True)
class TensorQuant:
    """How one float32 tensor is quantized: ``x ~ scale * q``, ``q`` of ``dtype`` in
    ``[qmin, qmax]`` (zero point 0). ``levels``: the largest ``q`` of an unsigned one,
    255, or 127 where a kernel sums two steps of products in int16 (7-bit data)."""

    scale: float
    dtype: str  # "uint8" or "int8"
    levels: int = 255

    @property
    def qmin(self) -> int:
        return 0 if self.dtype == "uint8" else -127

    @property
    def qmax(self) -> int:
        return self.levels if self.dtype == "uint8" else 127

    @classmethod
    def of(cls, threshold: float, nonnegative: bool, levels: int = 255) -> TensorQuant:
        """The quantization that maps ``[0, threshold]`` onto ``0..levels`` (unsigned)
        or ``[-threshold, threshold]`` onto ``-127..127`` (signed); values beyond are
        clipped. A tensor that was 0 everywhere gets scale 1 (any scale is exact)."""
        dtype = "uint8" if nonnegative else "int8"
        top = levels if nonnegative else 127
        threshold = float(threshold)
        return cls(threshold / top if threshold > 0 else 1.0, dtype, levels)


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


def _bindings(func: relax.Function) -> dict[relax.Var, relax.Expr]:
    return {b.var: b.value for block in func.body.blocks for b in block.bindings}


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


def _float32(expr: relax.Expr) -> bool:
    ty = expr.ty
    return isinstance(ty, relax.TensorType) and str(ty.dtype) == "float32"


def _site_weight(call: relax.Call, bindings: dict) -> tuple[str, np.ndarray] | None:
    """(kind, float32 weights with the output channel first) of a quantizable call."""
    if not (isinstance(call.args[0], relax.Var) and _float32(call.args[0]) and _float32(call)):
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
    bindings = _bindings(func)
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
class _Epilogue:
    """The per-channel affine operators after a site, folded: ``y = acc * m + c``."""

    end: relax.Var  # the last folded binding: its users read the new epilogue instead
    absorbed: list[relax.Var]
    ops: list[str]
    multiplier: np.ndarray
    shift: np.ndarray


def _fold_epilogue(site: Site, multiplier, bindings, uses, users, axis: int) -> _Epilogue:
    out_shape = [int(d) for d in site.call.ty.shape]
    end, absorbed, ops = site.var, [], []
    m, c = multiplier.astype(np.float64), np.zeros_like(multiplier, np.float64)
    while uses.get(end, 0) == 1 and end in users:
        user_var, call = users[end]
        kind = _AFFINE.get(call.op) if isinstance(call, relax.Call) else None
        if kind is None or not isinstance(user_var, relax.DataflowVar) or not _float32(call):
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
    return _Epilogue(end, absorbed, ops, m, c)


def _users(bindings: dict) -> dict[relax.Var, tuple[relax.Var, relax.Expr]]:
    """For each variable, the last binding that reads it (meaningful for variables
    read once, which is all :func:`_fold_epilogue` asks about)."""
    users = {}
    for var, value in bindings.items():
        for used in relax.analysis.free_vars(value):
            users[used] = (var, value)
    return users


def _use_counts(func: relax.Function) -> dict[relax.Var, int]:
    counts: dict[relax.Var, int] = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            for used in _reads(binding.value):
                counts[used] = counts.get(used, 0) + 1
    for used in _reads(func.body.body):
        counts[used] = counts.get(used, 0) + 1
    return counts


def _reads(expr: relax.Expr) -> list[relax.Var]:
    """Variables ``expr`` reads, once per time it reads them (``add(x, x)``: twice)."""
    if isinstance(expr, relax.Var):
        return [expr]
    if isinstance(expr, relax.Call):
        return [v for a in expr.args for v in _reads(a)]
    if isinstance(expr, relax.Tuple):
        return [v for f in expr.fields for v in _reads(f)]
    if isinstance(expr, relax.TupleGetItem):
        return _reads(expr.tuple_value)
    return list(relax.analysis.free_vars(expr))


# What a signed input read by an unsigned dot product is shifted by: -127..127 -> 1..255.
SIGNED_SHIFT = 128


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


def shiftable(site: Site, quant: TensorQuant) -> bool:
    """Whether ``site`` may read its input shifted by :data:`SIGNED_SHIFT`: a signed
    input and no padding (a dense layer, a convolution with padding 0), where the shift
    adds ``SIGNED_SHIFT * sum(w[o])`` to every sum and nothing else."""
    unpadded = site.op == "dense" or all(int(p) == 0 for p in site.call.attrs.padding)
    return quant.dtype == "int8" and unpadded


def _eight_bit_adds(func, found: Sites, plans: dict, quants: dict, bindings: dict) -> dict:
    """The adds that may read a quantized tensor's 8-bit values: ``{add's var: (the
    tensor's key, its var)}`` for every tensor that quantized operators read in its own
    integer dtype and that nothing but them and float32 adds of its shape reads (not
    an output of the function, not read twice by one add)."""
    integer_reads = {
        site.tensor
        for site, _, _, kind, _, shift in plans.values()
        if _input_dtype(site, kind) is None and not shift  # the quantization's uint8/int8
    }
    readers: dict[relax.Var, list[tuple[relax.Var, relax.Expr]]] = {}
    for var, value in bindings.items():
        for used in _reads(value):
            readers.setdefault(used, []).append((var, value))
    outputs = set(_reads(func.body.body))
    chosen = {}
    for key in integer_reads:
        tensor = found.tensors[key]
        if tensor in outputs or _concatenated(tensor, bindings) is not None:
            continue
        shape = [int(d) for d in tensor.ty.shape]
        adds = []
        for var, value in readers.get(tensor, []):
            if var in plans and plans[var][0].tensor == key:
                continue
            is_add = (
                isinstance(value, relax.Call)
                and value.op.same_as(_ADD)
                and _float32(value)
                and [int(d) for d in value.ty.shape] == shape
                and sum(a.same_as(tensor) for a in value.args) == 1
            )
            if not is_add:
                break
            adds.append(var)
        else:
            chosen.update({add: (key, tensor) for add in adds})
    return chosen


def _concatenated(tensor: relax.Expr, bindings: dict) -> list[relax.Expr] | None:
    """The pieces of ``tensor`` when it is bound to a ``concat`` of a tuple written out
    (a fire module's or an inception block's output), else None."""
    value = bindings.get(tensor) if isinstance(tensor, relax.Var) else None
    if not (isinstance(value, relax.Call) and value.op.same_as(_CONCAT)):
        return None
    fields = value.args[0]
    if not isinstance(fields, relax.Tuple) or value.attrs.axis is None:
        return None
    return list(fields.fields)


def _input_dtype(site: Site, arithmetic: str) -> str | None:
    """The dtype of the quantized input an operator reads (None: the quantization's).

    In float32 arithmetic a depthwise convolution reads the integer tensor, a quarter
    of float32's bytes, and its kernel casts each vector as it loads it (MobileNet1.0's
    13 on Zen 3: the package 5.67 -> 5.22 ms); an operator that broadcasts one input
    value to a vector of output channels (a first convolution, a dense layer) reads
    float32 values, as a cast per broadcast costs more than the bytes save
    (MobileNet1.0's 3x3/2 3 -> 32 at 112x112: 0.30 ms from float32, 0.48 from int8)."""
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
    int32 result where :func:`exact_in_float32` holds, for operators the CPU has no
    faster integer kernel for (a depthwise convolution runs as fast as in float32
    instead of 2x slower in int32 lanes), or None: the operator stays float32, not
    quantized (no record). ``dense_as_conv``: ``int32`` dense layers of 2-D data are
    written as the 1x1 convolutions they are (``(N, K)`` as ``(N, K, 1, 1)``), for a CPU
    whose dot-product kernels are convolution kernels. ``residual_adds``: adds read the
    8-bit values of a quantized tensor (the module docstring; one record each, ``op``
    ``add``). ``shift_signed(site, quant)``: whether an ``int32`` operator without
    padding reads its ``int8`` input as ``uint8`` shifted by :data:`SIGNED_SHIFT` (for a
    CPU whose dot product multiplies unsigned data; the module docstring)."""
    found = find_sites(mod)
    func = mod["main"]
    bindings = _bindings(func)
    uses, users = _use_counts(func), _users(bindings)
    plans: dict[relax.Var, tuple[Site, _Epilogue, np.ndarray, str, bool, int]] = {}
    absorbed: set[relax.Var] = set()
    records = []
    for site in found.sites:
        quant = quants.get(site.tensor)
        if quant is None or site.name in skip:
            continue
        limit = weight_max(site, quant) if callable(weight_max) else weight_max
        kind = "int32" if arithmetic is None else arithmetic(site, quant, limit)
        if kind is None:
            continue  # left in float32: no integer kernel would be faster
        q_weight, w_scales = quantize_weights(site.weight, limit)
        axis = 1 if site.op == "conv2d" else len(site.call.ty.shape) - 1
        epilogue = _fold_epilogue(site, quant.scale * w_scales, bindings, uses, users, axis)
        as_conv = (
            site.op == "dense"
            and kind == "int32"
            and len(site.call.args[0].ty.shape) == 2
            and dense_as_conv
        )
        if as_conv:
            q_weight = q_weight.reshape(*q_weight.shape, 1, 1)  # [out, in, 1, 1]
        elif site.op == "dense":
            q_weight = np.ascontiguousarray(q_weight.T)  # back to [in, out]
        if kind == "float32" and not exact_in_float32(site, quant, limit):
            raise ValueError(f"{site.name}: its sums exceed float32's exact integers")
        shift = 0
        if kind == "int32" and shift_signed is not None and shift_signed(site, quant):
            if not shiftable(site, quant):
                raise ValueError(f"{site.name}: a shifted input needs a signed one, no padding")
            shift = SIGNED_SHIFT  # the sums carry shift * sum(w[o]): taken back here
            # the weights' output channel: first (OIHW, dense as a 1x1), last (dense [in, out])
            out_axis = 1 if site.op == "dense" and not as_conv else 0
            sums = np.moveaxis(q_weight, out_axis, 0).reshape(q_weight.shape[out_axis], -1)
            epilogue.shift = epilogue.shift - shift * sums.sum(axis=1) * epilogue.multiplier
        plans[site.var] = (site, epilogue, q_weight, kind, as_conv, shift)
        absorbed.update(epilogue.absorbed)
        records.append(
            {
                "name": site.name,
                "op": site.op,
                "weight_shape": list(site.weight.shape),
                "weight_max": limit,
                "input": site.tensor,
                "input_dtype": "uint8" if shift else quant.dtype,
                "input_scale": quant.scale,
                "input_max": quant.qmax,
                **({"input_shift": shift} if shift else {}),
                "weight_scale_min": float(w_scales.min()),
                "weight_scale_max": float(w_scales.max()),
                "epilogue": epilogue.ops,
                "arithmetic": kind,
                **({"as": "conv2d 1x1"} if as_conv else {}),
            }
        )
    if not plans:
        return mod, records
    made: dict[tuple[str, str, int], relax.Var] = {}
    eight_bit_adds = _eight_bit_adds(func, found, plans, quants, bindings) if residual_adds else {}
    for add_var, (key, _) in eight_bit_adds.items():
        records.append(
            {
                "name": add_var.name,
                "op": "add",
                "input": key,
                "input_dtype": quants[key].dtype,
                "input_scale": quants[key].scale,
                "arithmetic": "float32",
            }
        )

    @relax.expr_functor.mutator
    class Quantizer(relax.PyExprMutator):
        def quantized(
            self, key: str, tensor: relax.Var, dtype: str | None = None, shift: int = 0
        ) -> relax.Var:
            dtype = dtype or quants[key].dtype
            if (key, dtype, shift) not in made:
                pieces = _concatenated(tensor, bindings)
                readers = sum(p[0].tensor == key for p in plans.values())
                if pieces is not None and uses.get(tensor, 0) == readers:
                    # only quantized operators read the concatenation: its pieces are
                    # quantized instead (elementwise, so the same values), each in the
                    # kernel that makes it, and concatenated in 8 bits
                    quantized_pieces = [
                        self.builder_.emit(
                            quantize_tensor(self.visit_expr(piece), quants[key], dtype, shift)
                        )
                        for piece in pieces
                    ]
                    axis = int(bindings[tensor].attrs.axis)
                    made[key, dtype, shift] = self.builder_.emit(R.concat(quantized_pieces, axis))
                else:
                    data = self.visit_expr(tensor)
                    made[key, dtype, shift] = self.builder_.emit(
                        quantize_tensor(data, quants[key], dtype, shift)
                    )
            return made[key, dtype, shift]

        def dequantized(self, key: str, tensor: relax.Var) -> relax.Expr:
            q = self.quantized(key, tensor)
            return R.multiply(R.astype(q, "float32"), relax.const(quants[key].scale, "float32"))

        def visit_var_binding_(self, binding):
            var = binding.var
            if var in absorbed:
                return  # folded into the epilogue of its site
            if var in eight_bit_adds:
                key, tensor = eight_bit_adds[var]
                args = [
                    self.dequantized(key, tensor) if a.same_as(tensor) else self.visit_expr(a)
                    for a in binding.value.args
                ]
                emit = (
                    self.builder_.emit
                    if isinstance(var, relax.DataflowVar)
                    else self.builder_.emit_output
                )
                self.set_var_remap(var, emit(R.add(*args)))
                return
            if var not in plans:
                super().visit_var_binding_(binding)
                return
            site, epilogue, q_weight, kind, as_conv, shift = plans[var]
            dtype = "uint8" if shift else _input_dtype(site, kind)
            data = self.quantized(site.tensor, site.call.args[0], dtype, shift)
            if kind == "int32":
                weight = relax.const(q_weight, "int8")
            else:
                weight = relax.const(q_weight.astype(np.float32))
            if site.op == "conv2d":
                a = site.call.attrs
                acc = R.nn.conv2d(
                    data,
                    weight,
                    a.strides,
                    a.padding,
                    a.dilation,
                    a.groups,
                    "NCHW",
                    "OIHW",
                    "NCHW",
                    out_dtype=kind,
                )
                shape = (1, -1, 1, 1)
            elif as_conv:  # (N, K) x [O, K] as a 1x1 convolution of (N, K, 1, 1)
                batch, depth = (int(d) for d in site.call.args[0].ty.shape)
                image = self.builder_.emit(R.reshape(data, (batch, depth, 1, 1)))
                acc = R.nn.conv2d(image, weight, out_dtype=kind)
                acc = R.reshape(self.builder_.emit(acc), (batch, int(q_weight.shape[0])))
                shape = (-1,)
            else:
                acc = R.matmul(data, weight, out_dtype=kind)
                shape = (-1,)
            multiplier = epilogue.multiplier.reshape(shape).astype(np.float32)
            acc = self.builder_.emit(acc)
            if kind == "int32":
                acc = R.astype(acc, "float32")
            y = R.multiply(acc, relax.const(multiplier))
            if np.any(epilogue.shift != 0):
                y = R.add(y, relax.const(epilogue.shift.reshape(shape).astype(np.float32)))
            emit = (
                self.builder_.emit
                if isinstance(epilogue.end, relax.DataflowVar)
                else self.builder_.emit_output
            )
            self.set_var_remap(epilogue.end, emit(y))

    rewritten = Quantizer(mod).visit_expr(func)
    updated = tvm.IRModule(dict(mod.functions))
    updated["main"] = rewritten
    return relax.transform.DeadCodeElimination(["main"])(updated), records


__all__ = [
    "WEIGHT_MAX",
    "Site",
    "Sites",
    "TensorQuant",
    "constant_value",
    "exact_in_float32",
    "find_sites",
    "quantize",
    "quantize_tensor",
    "quantize_weights",
    "shiftable",
    "with_taps",
]
