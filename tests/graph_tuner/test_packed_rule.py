"""The packed CPU conv rule (schedules/cpu/conv2d_packed.py) against the same kernel
unscheduled (TVM's plain loop nest, built as is)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from edgecv.graph_tuner.apply import desired_layouts
from edgecv.lowering import lower
from edgecv.schedules.cpu import PackedConv2D
from edgecv.testing import assert_close

# AVX2 (8 lanes, 16 registers) and baseline x86-64 (SSE: 4 lanes): blocks of one or
# several registers, and tiles sized for each.
TARGETS = {
    "avx2": tvm.target.Target({"kind": "llvm", "mcpu": "haswell"}),
    "sse": tvm.target.Target({"kind": "llvm"}),
}

# (channels, outputs, size, kernel, stride, groups, block)
CASES = [
    (16, 16, 7, 3, 1, 1, 8),  # prime width: one row of 7 pixels per tile
    (16, 32, 10, 1, 2, 1, 8),  # strided 1x1
    (3, 8, 13, 3, 2, 1, 8),  # plain input (3 channels), packed output
    (16, 16, 14, 3, 1, 1, 16),  # a block of two AVX2 registers
    (16, 16, 9, 3, 1, 16, 8),  # depthwise
    (16, 16, 9, 3, 2, 16, 8),  # depthwise, strided
    (32, 32, 6, 5, 1, 32, 16),  # depthwise 5x5, two registers per block
    (8, 16, 23, 3, 1, 1, 8),  # prime width wider than a tile: its last tile predicated
    (3, 16, 37, 7, 2, 1, 8),  # a stem onto a prime width (squeezenet's 109, smaller)
]


def _conv_module(channels, outputs, size, kernel, stride, groups, block, epilogue: bool):
    """conv2d in NCHW{block}c (weights as a parameter), with bias + residual + relu."""
    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float32"))
    w = relax.Var("w", relax.TensorType((outputs, channels // groups, kernel, kernel), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = relax.op.nn.conv2d(x, w, strides=stride, padding=kernel // 2, groups=groups)
            y = bb.emit(y)
            if epilogue:
                bias = np.linspace(-1, 1, outputs, dtype=np.float32).reshape(1, outputs, 1, 1)
                y = bb.emit(relax.op.add(y, relax.const(bias)))
                y = bb.emit(relax.op.nn.relu(relax.op.add(y, y)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = bb.get()
    layout = f"NCHW{block}c"

    def layout_cb(call):
        if call.op.name != "relax.nn.conv2d":
            return {}
        return {"relax.nn.conv2d": desired_layouts(call, layout)}

    return relax.transform.ConvertLayout({}, layout_cb)(mod)


def _conv_kernel(mod) -> tirx.PrimFunc:
    lowered = lower(mod)
    kernels = [f for gv, f in lowered.kernels.functions.items() if "conv" in gv.name_hint]
    assert len(kernels) == 1, list(lowered.kernels.functions)
    return kernels[0]


def _run(func: tirx.PrimFunc, target, inputs) -> np.ndarray:
    library = tvm.tirx.build(
        tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target
    )
    device = tvm.cpu()
    args = [tvm.runtime.tensor(a, device) for a in inputs]
    out_param = func.params[-1]
    out = tvm.runtime.tensor(np.zeros([int(d) for d in out_param.shape], "float32"), device)
    library["main"](*args, out)
    return out.numpy()


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize(("target_name", "epilogue"), [("avx2", True), ("sse", False)])
def test_packed_rule_matches_unscheduled(case, target_name, epilogue):
    """The bare convolution, and one with bias, a residual add and ReLU fused after it."""
    target = TARGETS[target_name]
    func = _conv_kernel(_conv_module(*case, epilogue=epilogue))
    rng = np.random.default_rng(0)
    inputs = [
        rng.standard_normal([int(d) for d in p.shape]).astype("float32") for p in func.params[:-1]
    ]
    with target:
        schedule = PackedConv2D().apply(func, target, False)
    assert schedule is not None, "the packed rule did not take its own kernel"
    scheduled = schedule.mod["main"]
    assert_close(_run(scheduled, target, inputs), _run(func, target, inputs))


def test_a_prime_width_gets_a_predicated_tile_of_eight_columns():
    """A prime width wider than a tile (squeezenet's 109) would leave one pixel a tile;
    it gets PREDICATED_COLUMNS columns, the last tile of each row predicated (29 or 14
    columns ran its stem 1.4-1.6x slower than 8 on Zen 5). Widths that divide keep
    whole rows or their largest divisor."""
    from edgecv.schedules.cpu.conv2d_packed import PREDICATED_COLUMNS, _pixels

    assert _pixels(109, 109, 29) == (1, PREDICATED_COLUMNS)
    assert _pixels(109, 109, 6) == (1, 6)  # a smaller tile than that stays as it is
    assert _pixels(7, 7, 14) == (1, 7)  # 7 rows: no two of them divide it
    assert _pixels(56, 56, 14) == (1, 14)
