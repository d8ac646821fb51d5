"""ONNX graphs committed without their weights, and filled from a seed at test time.

:func:`strip` empties every float initializer of more than :data:`KEPT_ELEMENTS`
elements, keeping in its doc string the mean and standard deviation of the values it had
(``seeded mean=M std=S``); smaller ones and integer ones (shapes, axes, clip bounds) stay
as they are. :func:`filled` fills each emptied initializer from a seed and writes a
complete model that both edgecv and ONNX Runtime read:

- a weight (rank 2 or more) with He's normal values, ``std = sqrt(2 / fan_in)``, then
  the weights of convolutions and dense layers rescaled in graph order so each layer's
  output has standard deviation 1 on a normal input (:func:`_unit_gains`): every model's
  logits come out of order 1, so a comparison within a tolerance relative to 1 means
  something (torchvision's own initialization makes MobileNetV3-Large's logits 1e-10);
- a vector with its own statistics, except a vector of zeros (a folded batch norm's
  bias), which gets small normal values so the bias is exercised, and a constant vector
  (a scale of ones), which stays as it was.

onnx, NumPy and ONNX Runtime (the test extra): no torch.
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
    _unit_gains(model, rng)
    out = Path(out_dir) / Path(path).name
    onnx.save(model, str(out))
    return out


WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def _unit_gains(model: onnx.ModelProto, rng: np.random.RandomState) -> None:
    """Rescale each filled weight, layer after layer in graph order, so its layer's output
    has standard deviation 1 on a normal input, as ONNX Runtime computes it (LSUV's
    initialization): He's scale assumes ReLU alone, and squeeze-and-excitation gates and
    SiLU shrink EfficientNet-B0's logits to 0.003, too small for a comparison relative to 1
    to mean anything. The weights are inputs of one probe session, so each layer costs one
    run, not a session. The layers in front of every data-dependent filter (``NonZero``:
    a two-stage detector's backbone, FPN and RPN) are probed first in the graph cut down
    to them, which runs whatever the filters would keep: ONNX Runtime runs a session's
    whole graph, and in the whole graph of a ResNet-50 Mask R-CNN He's scale empties the
    proposals, a reshape of zero rows fails and no layer would be rescaled. A layer
    behind a filter that ONNX Runtime still cannot reach keeps He's scale."""
    import onnxruntime as ort
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument, RuntimeException

    REFUSED = (Fail, InvalidArgument, RuntimeException)  # noqa: N806 (ONNX Runtime's errors)

    weights = {t.name: t for t in model.graph.initializer}
    layers = [n for n in model.graph.node if n.op_type in WEIGHTED and n.input[1] in weights]
    names = {n.input[1] for n in layers}
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    kept = [t for t in probe.graph.initializer if t.name not in names]
    del probe.graph.initializer[:]
    probe.graph.initializer.extend(kept)
    probe.graph.input.extend(
        onnx.helper.make_tensor_value_info(n, weights[n].data_type, list(weights[n].dims))
        for n in sorted(names)
    )
    known = {o.name for o in probe.graph.output}
    probe.graph.output.extend(
        onnx.helper.make_empty_tensor_value_info(n.output[0])
        for n in layers
        if n.output[0] not in known
    )
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(
        probe.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    feed = {n: numpy_helper.to_array(weights[n]) for n in names}
    for value in session.get_inputs():
        if value.name not in feed:
            dims = [d if isinstance(d, int) else 1 for d in value.shape]
            feed[value.name] = rng.standard_normal(dims).astype(np.float32)
    behind = _behind_filters(model)
    front = [n for n in layers if n.output[0] not in behind]
    if len(front) < len(layers):
        ahead = _cut(probe, [n.output[0] for n in front])
        ahead_session = ort.InferenceSession(
            ahead.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
    for node in layers:
        try:
            in_front = len(front) < len(layers) and node.output[0] not in behind
            (out,) = (ahead_session if in_front else session).run([node.output[0]], feed)
        except REFUSED:  # behind a data-dependent filter that left no rows: He's scale
            continue
        std = float(np.std(out))
        if np.isfinite(std) and std > 0:
            feed[node.input[1]] = (feed[node.input[1]] / std).astype(feed[node.input[1]].dtype)
    for name in names:
        weights[name].CopyFrom(numpy_helper.from_array(feed[name], name))


def _behind_filters(model: onnx.ModelProto) -> set[str]:
    """The values computed from a ``NonZero``'s output (whose count depends on the data)."""
    behind: set[str] = set()
    for node in model.graph.node:
        if node.op_type == "NonZero" or behind & set(_reads(node)):
            behind.update(node.output)
    return behind


def _reads(node) -> set[str]:
    """``node``'s inputs and every name its subgraphs (a Loop's body) read."""
    reads = set(node.input)
    for a in node.attribute:
        for sub in [a.g] if a.HasField("g") else list(a.graphs):
            for inner in sub.node:
                reads |= _reads(inner)
    return reads


def _cut(model: onnx.ModelProto, outputs: list[str]) -> onnx.ModelProto:
    """``model`` computing only ``outputs``: the nodes they depend on (inputs all kept,
    so one feed serves both)."""
    needed, kept = set(outputs), []
    for node in reversed(model.graph.node):
        if needed & set(node.output):
            kept.append(node)
            needed |= _reads(node)
    cut = onnx.ModelProto()
    cut.CopyFrom(model)
    del cut.graph.node[:]
    cut.graph.node.extend(kept[::-1])
    del cut.graph.output[:]
    cut.graph.output.extend(onnx.helper.make_empty_tensor_value_info(o) for o in outputs)
    return cut


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
