"""ONNX graphs committed without their weights, and filled from a seed at test time.

:func:`strip` empties every float initializer of more than :data:`KEPT_ELEMENTS`
elements, keeping in its doc string the mean and standard deviation of the values it had
(``seeded mean=M std=S``); smaller ones and integer ones (shapes, axes, clip bounds) stay
as they are. :func:`filled` fills each emptied initializer from a seed and writes a
complete model that both edgecv and ONNX Runtime read:

- a weight (rank 2 or more) with He's normal values, ``std = sqrt(2 / fan_in)``, so each
  layer keeps its activations' scale (torchvision's own initialization makes MobileNetV3's
  logits 1e-10: its depthwise convolutions take ``fan_out``, which comparisons cannot
  see through);
- a vector with its own statistics, except a vector of zeros (a folded batch norm's
  bias), which gets small normal values so the bias is exercised, and a constant vector
  (a scale of ones), which stays as it was.

Plain onnx and NumPy: no torch.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

KEPT_ELEMENTS = 16
_STATS = re.compile(r"seeded mean=(\S+) std=(\S+)")
FOLDER = Path(__file__).resolve().parent


def strip(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its large float initializers emptied (statistics kept), and without
    what an exporter writes for people and tools but no converter reads (per-node
    metadata and doc strings, the intermediate shapes ONNX's shape inference restores)."""
    del model.graph.value_info[:]
    del model.metadata_props[:]
    for node in model.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    for tensor in model.graph.initializer:
        if _STATS.fullmatch(tensor.doc_string):
            continue  # emptied already
        array = numpy_helper.to_array(tensor)
        if array.dtype.kind != "f" or array.size <= KEPT_ELEMENTS:
            continue
        stats = f"seeded mean={float(array.mean()):.6g} std={float(array.std()):.6g}"
        dims, dtype, name = list(tensor.dims), tensor.data_type, tensor.name
        tensor.Clear()
        tensor.name, tensor.data_type, tensor.doc_string = name, dtype, stats
        tensor.dims.extend(dims)
    return model


def filled(path: str | Path, out_dir: str | Path, seed: int = 0) -> Path:
    """The stripped model at ``path`` with every emptied initializer filled from ``seed``
    (module docstring), written to ``out_dir`` (same file name); returns the written file."""
    model = onnx.load(str(path))
    rng = np.random.RandomState(seed)
    readers = {name: node for node in model.graph.node for name in node.input}
    for tensor in model.graph.initializer:
        match = _STATS.fullmatch(tensor.doc_string)
        if match is None:
            continue
        mean, std = (float(v) for v in match.groups())
        dims = tuple(tensor.dims)
        if len(dims) >= 2:
            values = rng.standard_normal(dims) * np.sqrt(2.0 / _fan_in(dims, readers, tensor.name))
        elif std > 0:
            values = mean + std * rng.standard_normal(dims)
        elif mean == 0:
            values = 0.1 * rng.standard_normal(dims)
        else:
            values = np.full(dims, mean)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
        tensor.CopyFrom(numpy_helper.from_array(values.astype(dtype), tensor.name))
    out = Path(out_dir) / Path(path).name
    onnx.save(model, str(out))
    return out


def _fan_in(dims: tuple[int, ...], readers: dict, name: str) -> int:
    """The inputs each output of the weight ``name`` sums: ``[in, out]`` for MatMul's
    right side, ``[out, in, kh, kw]`` (Conv) or ``[out, in]`` (Gemm's transposed B)."""
    node = readers.get(name)
    if node is not None and node.op_type == "MatMul":
        return dims[-2]
    if node is not None and node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return dims[1] if trans_b else dims[0]
    return int(np.prod(dims[1:]))
