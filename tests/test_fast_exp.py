"""Sigmoid and SiLU on CPU targets take edgecv/lowering/legalize.py's ``vector_exp`` (its
``fast_exp_for``): no call of ``exp`` is left in their kernels, so LLVM vectorizes them,
and their values stay within float32's rounding of NumPy's over the whole range,
saturation included. Whole-model agreement: the ONNX classifier of
tests/onnx_graphs.py (a Sigmoid) against ONNX Runtime in tests/test_onnx_frontend.py,
and every zoo and ONNX model with SiLU or sigmoid on `cpu`."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from edgecv.lowering import lower
from edgecv.lowering.legalize import fast_exp_for, legalize_map
from edgecv.profiles import load_profile

SHAPE = (2, 8, 16, 16)


def activations() -> tvm.IRModule:
    """``main(x) -> (sigmoid(x), silu(x))`` in float32."""
    x = relax.Var("x", relax.TensorType(SHAPE, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            s = bb.emit(relax.op.sigmoid(x))
            u = bb.emit(relax.op.nn.silu(x))
            out = bb.emit_output(relax.Tuple([s, u]))
        bb.emit_func_output(out)
    return bb.get()


def exp_calls(kernels: tvm.IRModule) -> int:
    text = kernels.script()
    return text.count("T.exp(") + text.count("T.sigmoid(")


def test_cpu_targets_take_fast_exp_and_gpus_keep_theirs():
    assert fast_exp_for(load_profile("cpu").tvm_target())
    assert not fast_exp_for(load_profile("deeplens").tvm_target())


def test_the_fast_kernels_call_no_exp():
    assert exp_calls(lower(activations()).kernels) > 0  # TIR's exp: one libm call a lane
    assert exp_calls(lower(activations(), fast_exp=True).kernels) == 0


@pytest.mark.parametrize("fast_exp", [False, True])
def test_sigmoid_and_silu_match_numpy_over_the_whole_range(fast_exp):
    mod = relax.transform.LegalizeOps(customize_legalize_map=legalize_map(fast_exp=fast_exp))(
        activations()
    )
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    # every scale from 1e-4 to 100, both signs, and the saturated ends
    x = np.geomspace(1e-4, 100.0, int(np.prod(SHAPE)) // 2)
    x = np.concatenate([-x, x]).reshape(SHAPE).astype(np.float32)
    sigmoid, silu = (o.numpy() for o in vm["main"](tvm.runtime.tensor(x)))
    expected = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    # within an ulp of 1.0 everywhere (what a sum downstream sees), and within a few ulps
    # of the value while it is a normal float32 (|x| < 80; below, the polynomial's
    # clamp gives 1.2e-38 where the true value is smaller still)
    ulp = 2.0**-23
    assert np.abs(sigmoid - expected).max() <= ulp
    normal = np.abs(x) < 80
    np.testing.assert_allclose(sigmoid[normal], expected[normal], rtol=4e-7)
    assert (np.abs(silu - x * expected) <= ulp * np.maximum(1.0, np.abs(x))).all()
