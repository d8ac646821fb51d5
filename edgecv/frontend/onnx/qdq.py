"""A model quantized in the QDQ format (ONNX Runtime's ``quantize_static`` with
``QuantFormat.QDQ``) read as a float graph and the quantization its file decided.

Such a file holds ``QuantizeLinear -> DequantizeLinear`` pairs on activations and a
``DequantizeLinear`` of an integer initializer for each weight and bias.
:func:`strip_qdq` replaces each dequantized initializer by its float value, computed
exactly as ``DequantizeLinear`` does (``(q - zero_point) * scale`` in float32), and
each activation pair by the float operators that round as it does
(``Clip(Round(x / scale), qmin - zero_point, qmax - zero_point) * scale``: the values
ONNX Runtime computes on, any zero point), and returns, per ``Conv``/``Gemm``/``MatMul``
reading a paired tensor with zero point 0, that tensor's scale and dtype and the
operator's weights. The INT8 pipeline (:mod:`edgecv.pipelines.int8_given`) finds the
operator by its weights and quantizes its input with the file's scale instead of
calibrating: the integers it computes on are the file's.

edgecv's INT8 kernels read activations with zero point 0 (symmetric int8, or uint8 of
a tensor never negative, which ``quantize_static`` gives zero point 0 too). An operator
reading a tensor with another zero point (uint8 of a signed tensor, the default
``QuantType.QUInt8``) computes in float32 on the rounded values: the file's numbers,
without the INT8 kernel; the manifest counts it under ``not_quantized``.
"""

from __future__ import annotations

import numpy as np

from ...board.errors import ConversionError

_WEIGHTED = {"Conv", "Gemm", "MatMul"}
# Operators of the other ONNX quantized format (QOperator) and integer kernels
_INTEGER_OPS = {"QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger", "QGemm"}
_HOW = (
    "quantize with onnxruntime.quantization.quantize_static(..., quant_format="
    "QuantFormat.QDQ, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, "
    "extra_options={'ActivationSymmetric': True})"
)


def is_qdq(model) -> bool:
    """Whether ``model`` holds quantization operators (QDQ pairs or QOperator ops)."""
    kinds = {n.op_type for n in model.graph.node}
    return bool(kinds & ({"QuantizeLinear", "DequantizeLinear"} | _INTEGER_OPS))


def check_format(model, source: str) -> None:
    """One error line for a model quantized in the other format (QOperator: QLinearConv
    and the like), before the operator check would list them as unsupported."""
    integer = sorted({n.op_type for n in model.graph.node} & _INTEGER_OPS)
    if integer:
        raise ConversionError(
            f"{source}: holds {', '.join(integer)} (ONNX Runtime's QOperator format); "
            f"edgecv reads models quantized in the QDQ format: {_HOW}"
        )


def strip_qdq(model, source: str):
    """(``model`` as a float graph, the quantization of its weighted operators) for a
    QDQ model; (``model``, None) for a float one. Each entry of the quantization:
    ``node`` (its name), ``op`` (``conv2d`` or ``dense``), ``weight`` (float32, output
    channel first: OIHW, or ``[out, in]``), ``weight_max`` (the largest ``|q|`` of the
    file's integer weights), ``scale`` and ``dtype`` of its input."""
    import onnx
    from onnx import numpy_helper

    if not is_qdq(model):
        return model, None
    check_format(model, source)
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    values = {name: numpy_helper.to_array(t) for name, t in inits.items()}
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    acts, floats, levels, nodes, constants = {}, {}, {}, [], []
    for node in graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0] in values:
            floats[node.output[0]] = _dequantized(node, values, source)
            levels[node.output[0]] = int(np.abs(values[node.input[0]].astype(np.int64)).max())
        elif node.op_type == "QuantizeLinear":
            pair = readers.get(node.output[0], [])
            if not pair or any(r.op_type != "DequantizeLinear" for r in pair):
                raise ConversionError(
                    f"{source}: QuantizeLinear `{node.name}` is read by other operators than "
                    "DequantizeLinear; edgecv reads QuantizeLinear -> DequantizeLinear pairs: "
                    f"{_HOW}"
                )
            quant = _tensor_quant(node, values, source)
            outputs = [dq.output[0] for dq in pair]
            for name in outputs:
                acts[name] = (*quant, node.name)
            nodes += _rounding(node, quant, outputs, constants)
        elif node.op_type != "DequantizeLinear":
            nodes.append(node)
        elif node.input[0] not in {
            o for n in graph.node for o in n.output if n.op_type == "QuantizeLinear"
        }:
            raise ConversionError(
                f"{source}: DequantizeLinear `{node.name}` reads neither a constant nor a "
                f"QuantizeLinear; edgecv reads QDQ pairs and quantized constants: {_HOW}"
            )
    entries = _entries(graph, acts, floats, levels)
    used = {i for n in nodes for i in n.input}
    kept = [t for name, t in inits.items() if name in used and name not in floats]
    kept += [numpy_helper.from_array(v, name) for name, v in floats.items() if name in used]
    stripped = onnx.ModelProto()
    stripped.CopyFrom(model)
    del stripped.graph.node[:]
    stripped.graph.node.extend(nodes)
    del stripped.graph.initializer[:]
    stripped.graph.initializer.extend(kept + constants)
    return stripped, entries


def _rounding(node, quant: tuple, outputs: list[str], constants: list) -> list:
    """The float operators that round ``node``'s input as its pair does, writing each
    of ``outputs`` (the pair's DequantizeLinear outputs)."""
    from onnx import helper, numpy_helper

    scale, zero, dtype = quant
    low, high = (0, 255) if dtype == "uint8" else (-128, 127)
    base = f"{node.output[0]}__edgecv"
    for suffix, value in (("scale", scale), ("low", low - zero), ("high", high - zero)):
        constants.append(numpy_helper.from_array(np.array(value, np.float32), f"{base}_{suffix}"))
    x = node.input[0]
    made = [
        helper.make_node("Div", [x, f"{base}_scale"], [f"{base}_div"], name=f"{base}_div"),
        helper.make_node("Round", [f"{base}_div"], [f"{base}_round"], name=f"{base}_round"),
        helper.make_node(
            "Clip",
            [f"{base}_round", f"{base}_low", f"{base}_high"],
            [f"{base}_clip"],
            name=f"{base}_clip",
        ),
        helper.make_node("Mul", [f"{base}_clip", f"{base}_scale"], [outputs[0]], name=base),
    ]
    made += [helper.make_node("Identity", [outputs[0]], [o]) for o in outputs[1:]]
    return made


def _dequantized(node, values: dict, source: str) -> np.ndarray:
    """``DequantizeLinear`` of a constant, computed as ONNX defines it."""
    q = values[node.input[0]]
    scale = _constant(node, 1, values, source)
    zero = _constant(node, 2, values, source) if len(node.input) > 2 and node.input[2] else 0
    if any(a.name == "block_size" and a.i for a in node.attribute):
        raise ConversionError(
            f"{source}: DequantizeLinear `{node.name}` is block-quantized; edgecv reads "
            f"per-tensor and per-channel quantization: {_HOW}"
        )
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    if np.ndim(scale) == 1 and q.ndim > 1:  # per channel along axis
        shape = [1] * q.ndim
        shape[axis] = -1
        scale = np.reshape(scale, shape)
        zero = np.reshape(zero, shape) if np.ndim(zero) == 1 else zero
    difference = (q.astype(np.int64) - np.asarray(zero, np.int64)).astype(np.float32)
    return (difference * np.asarray(scale, np.float32)).astype(np.float32)


def _constant(node, index: int, values: dict, source: str) -> np.ndarray:
    name = node.input[index]
    if name not in values:
        raise ConversionError(
            f"{source}: {node.op_type} `{node.name}` reads its scale or zero point from "
            f"`{name}`, not an initializer; edgecv reads constant scales: {_HOW}"
        )
    return values[name]


def _tensor_quant(node, values: dict, source: str) -> tuple[float, int, str]:
    """(scale, zero point, dtype) of an activation's ``QuantizeLinear``: one per tensor."""
    scale = _constant(node, 1, values, source)
    zero = _constant(node, 2, values, source) if len(node.input) > 2 and node.input[2] else None
    if np.size(scale) != 1:
        raise ConversionError(
            f"{source}: QuantizeLinear `{node.name}` quantizes an activation per channel; "
            f"edgecv reads one scale per activation: {_HOW}"
        )
    dtype = "uint8" if zero is None else str(zero.dtype)
    if dtype not in ("uint8", "int8"):
        raise ConversionError(
            f"{source}: QuantizeLinear `{node.name}` quantizes to {dtype}; edgecv's INT8 "
            f"kernels read 8-bit activations: {_HOW}"
        )
    zero_point = 0 if zero is None else int(np.reshape(zero, -1)[0])
    return float(np.reshape(scale, -1)[0]), zero_point, dtype


def _entries(graph, acts: dict, floats: dict, levels: dict) -> list[dict]:
    """The quantization of each weighted operator reading a paired tensor with zero
    point 0 and dequantized constant weights (the others stay float32)."""
    entries = []
    for node in graph.node:
        if node.op_type not in _WEIGHTED or len(node.input) < 2:
            continue
        weight = floats.get(node.input[1])
        if node.input[0] not in acts or weight is None:
            continue
        scale, zero, dtype, _ = acts[node.input[0]]
        if zero != 0:
            continue  # float32 on the rounded values (the module docstring)
        if node.op_type == "Conv":
            op = "conv2d"
        else:
            transposed = any(a.name == "transB" and a.i for a in node.attribute)
            op, weight = "dense", (weight if transposed else weight.T)
        entries.append(
            {
                "node": node.name or node.op_type,
                "op": op,
                "weight": np.ascontiguousarray(weight, np.float32),
                "scale": scale,
                "dtype": dtype,
                "weight_max": levels[node.input[1]],  # the file's largest |q|
            }
        )
    return entries


__all__ = ["check_format", "is_qdq", "strip_qdq"]
