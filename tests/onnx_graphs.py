"""Small ONNX graphs built with ``onnx.helper`` for the ONNX frontend's tests: one graph
with every operator kind a torchvision classifier exports (and the forms other exporters
write: batch norm left unfolded, MatMul beside Gemm, Clip with inputs, AveragePool), a
graph with symbolic dimensions, one with external data, one with unsupported operators, a
too-new opset and a custom-domain operator. Weights are seeded random."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class Graph:
    """Nodes and initializers added one at a time; ``model()`` builds the ModelProto."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.RandomState(seed)
        self.nodes: list = []
        self.weights: list = []
        self.count = 0

    def weight(self, shape, scale: float = 0.2, positive: bool = False) -> str:
        name = f"w{len(self.weights)}"
        values = self.rng.standard_normal(shape) * scale
        values = np.abs(values) + 0.5 if positive else values
        self.weights.append(numpy_helper.from_array(values.astype(np.float32), name))
        return name

    def constant(self, values, dtype=np.int64) -> str:
        name = f"c{len(self.weights)}"
        self.weights.append(numpy_helper.from_array(np.asarray(values, dtype), name))
        return name

    def op(self, op_type: str, inputs: list[str], domain: str = "", **attrs) -> str:
        self.count += 1
        out = f"t{self.count}"
        node = helper.make_node(
            op_type, inputs, [out], name=f"{op_type}_{self.count}", domain=domain, **attrs
        )
        self.nodes.append(node)
        return out

    def model(self, inputs, outputs, opset: int = OPSET, extra_opsets=()) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "test", inputs, outputs, self.weights)
        opsets = [helper.make_opsetid("", opset), *extra_opsets]
        return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def tensor(name: str, dims, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, dims)


def classifier(batch="N", size: int = 32, classes: int = 10, seed: int = 0) -> onnx.ModelProto:
    """A small classifier with every op kind edgecv deploys from torchvision exports."""
    g = Graph(seed)
    x = g.op(
        "Conv",
        ["x", g.weight((16, 3, 3, 3)), g.weight((16,))],
        kernel_shape=[3, 3],
        pads=[1, 1, 1, 1],
        strides=[2, 2],
    )
    bn = [
        g.weight((16,), positive=True),
        g.weight((16,)),
        g.weight((16,)),
        g.weight((16,), positive=True),
    ]
    x = g.op("BatchNormalization", [x, *bn], epsilon=1e-5)
    x = g.op("Relu", [x])
    x = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    skip = x
    x = g.op("Conv", [x, g.weight((16, 1, 3, 3))], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=16)
    x = g.op("HardSwish", [x])
    # squeeze-and-excitation, as MobileNetV3 has
    se = g.op("GlobalAveragePool", [x])
    se = g.op("Conv", [se, g.weight((4, 16, 1, 1)), g.weight((4,))], kernel_shape=[1, 1])
    se = g.op("Relu", [se])
    se = g.op("Conv", [se, g.weight((16, 4, 1, 1)), g.weight((16,))], kernel_shape=[1, 1])
    se = g.op("HardSigmoid", [se], alpha=1 / 6, beta=0.5)
    x = g.op("Mul", [x, se])
    x = g.op("Add", [x, skip])
    lo, hi = g.constant(0.0, np.float32), g.constant(6.0, np.float32)
    x = g.op("Clip", [x, lo, hi])
    y = g.op("Conv", [x, g.weight((8, 16, 1, 1))], kernel_shape=[1, 1])
    y = g.op("Sigmoid", [y])
    z = g.op(
        "AveragePool",
        [x],
        kernel_shape=[3, 3],
        strides=[1, 1],
        pads=[1, 1, 1, 1],
        count_include_pad=0,
    )
    z = g.op("Conv", [z, g.weight((8, 16, 1, 1))], kernel_shape=[1, 1])
    x = g.op("Concat", [y, z], axis=1)
    x = g.op("ReduceMean", [x], axes=[2, 3], keepdims=1)
    x = g.op("Flatten", [x], axis=1)
    x = g.op("Gemm", [x, g.weight((32, 16)), g.weight((32,))], transB=1)
    x = g.op("Tanh", [x])
    x = g.op("MatMul", [x, g.weight((32, classes))])
    x = g.op("Add", [x, g.weight((classes,))])
    x = g.op("Softmax", [x], axis=-1)
    g.nodes[-1].output[0] = "probs"
    return g.model([tensor("x", [batch, 3, size, size])], [tensor("probs", [batch, classes])])


def with_ops(op_types: list[str], opset: int = OPSET) -> onnx.ModelProto:
    """``x -> op -> op -> ...`` of one-input elementwise ops, named as given."""
    g = Graph()
    x = "x"
    for op_type in op_types:
        x = g.op(op_type, [x])
    g.nodes[-1].output[0] = "y"
    return g.model([tensor("x", [1, 4])], [tensor("y", [1, 4])], opset=opset)


def custom_domain(domain: str = "com.example", op_type: str = "ScaledSoftsign"):
    """``Relu -> <domain>::<op_type>(alpha=0.5) -> Add``: a custom-domain op between
    standard ones."""
    g = Graph()
    x = g.op("Relu", ["x"])
    x = g.op(op_type, [x, g.weight((1, 8))], domain=domain, alpha=0.5, mode="soft")
    x = g.op("Add", [x, g.weight((1, 8))])
    g.nodes[-1].output[0] = "y"
    return g.model(
        [tensor("x", [2, 8])], [tensor("y", [2, 8])], extra_opsets=[helper.make_opsetid(domain, 1)]
    )


def save(model: onnx.ModelProto, path: Path, external: bool = False) -> Path:
    """Write ``model``; with ``external``, every weight in ``<name>.data`` beside it."""
    if external:
        onnx.save(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=f"{path.stem}.data",
            size_threshold=0,
        )
    else:
        onnx.save(model, str(path))
    return path
