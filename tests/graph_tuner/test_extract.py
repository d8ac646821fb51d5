"""The graph's layout rules against what Relax's ConvertLayout does (TVM 0.27)."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

from edgecv.graph_tuner.activations import rewrite_activations
from edgecv.graph_tuner.extract import BINARY, POOLS, REDUCTIONS, UNARY

R = relax.op


def _packed_then(make_op, channels: int = 16):
    """conv2d (to be packed) -> op; the module and the op's name."""
    x = relax.Var("x", relax.TensorType((1, channels, 8, 8), "float32"))
    w = relax.Var("w", relax.TensorType((channels, channels, 1, 1), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(R.nn.conv2d(x, w))
            z = bb.emit(make_op(y))
            out = bb.emit_output(z)
        bb.emit_func_output(out)
    return bb.get()


def _packed_8c(call):
    if call.op.name != "relax.nn.conv2d":
        return {}
    return {"relax.nn.conv2d": ["NCHW8c", "OIHW8i8o", "NCHW8c"]}


def _op_output_ranks(mod) -> dict[str, int]:
    """Rank of each non-conv, non-transform op's output after ConvertLayout."""
    converted = relax.transform.ConvertLayout({}, _packed_8c)(mod)
    ranks = {}
    for block in converted["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and value.op.name not in (
                "relax.nn.conv2d",
                "relax.layout_transform",
            ):
                ranks[value.op.name] = len(binding.var.ty.shape.values)
    return ranks


def _make(op_name):
    f = getattr(R, op_name.removeprefix("relax.").split(".")[0])
    for part in op_name.removeprefix("relax.").split(".")[1:]:
        f = getattr(f, part)
    if op_name in BINARY:
        return lambda y: f(y, y)
    if op_name in POOLS:
        return lambda y: f(y, pool_size=(2, 2))
    if op_name in REDUCTIONS:
        return lambda y: f(y, axis=[2, 3], keepdims=True)
    if op_name == "relax.astype":
        return lambda y: f(y, "float32")
    return f


@pytest.mark.parametrize("op_name", sorted(UNARY | POOLS | REDUCTIONS | BINARY))
def test_ops_said_to_follow_stay_packed(op_name):
    """Every op the graph lets follow a packed input really keeps it packed."""
    ranks = _op_output_ranks(_packed_then(_make(op_name)))
    assert ranks[op_name] == 5, ranks


def test_rewritten_activations_stay_packed_and_compute_the_same():
    def leaky_then_clip(y):
        return R.clip(R.nn.leakyrelu(y, 0.1), 0.0, 6.0)

    mod = _packed_then(leaky_then_clip)
    assert _op_output_ranks(mod).get("relax.clip") == 4  # TVM's own: back to NCHW
    rewritten = rewrite_activations(mod)
    ranks = _op_output_ranks(rewritten)
    assert ranks == {"relax.multiply": 5, "relax.maximum": 5, "relax.minimum": 5}, ranks

    import tvm

    from edgecv.board.runtime.cpu import CPUBackend
    from edgecv.board.runtime.executor import Executor
    from edgecv.codegen.llvm import build_cpu
    from edgecv.lowering import lower

    rng = np.random.default_rng(0)
    inputs = [
        rng.standard_normal((1, 16, 8, 8)).astype("float32") * 8,
        rng.standard_normal((16, 16, 1, 1)).astype("float32"),
    ]
    outs = []
    for m in (mod, rewritten):
        lowered = lower(m)
        library = build_cpu(lowered.kernels, tvm.target.Target({"kind": "llvm"}))
        outs.append(Executor(lowered.plan, CPUBackend(library), lowered.constants).run(inputs)[0])
    np.testing.assert_array_equal(outs[0], outs[1])  # bit for bit
