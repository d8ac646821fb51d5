"""Layout transforms of constants folded with NumPy give what TVM gives (its
legalization, then FoldConstant compiling and running it)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from edgecv.graph_tuner.fold import fold_constant_transforms

CASES = {
    # packed conv weights OIHW -> OIHW16i16o
    "OIHW16i16o": ((64, 32, 3, 3), lambda o, i, h, w: (o // 16, i // 16, h, w, i % 16, o % 16)),
    # a first convolution's weights: OIHW -> OIHW8o
    "OIHW8o": ((16, 3, 7, 7), lambda o, i, h, w: (o // 8, i, h, w, o % 8)),
    # depthwise weights: OIHW -> OIHW1i16o
    "OIHW1i16o": ((32, 1, 3, 3), lambda o, i, h, w: (o // 16, i, h, w, i % 1, o % 16)),
    # a BatchNorm scale with channels that do not divide: padded
    "NCHW16c padded": ((1, 20, 1, 1), lambda n, c, h, w: (n, c // 16, h, w, c % 16)),
    # back from packed to plain
    "NCHW8c -> NCHW": ((1, 2, 3, 3, 8), lambda n, c, h, w, b: (n, c * 8 + b, h, w)),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("pad_value", [None, 1.5])
def test_numpy_fold_matches_fold_constant(case, pad_value):
    shape, index_map = CASES[case]
    data = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    bb = relax.BlockBuilder()
    with bb.function("main", []):
        moved = bb.emit(relax.op.layout_transform(relax.const(data), index_map, pad_value))
        bb.emit_func_output(moved)
    mod = bb.get()
    ours = _constant(fold_constant_transforms(mod))
    theirs = relax.transform.FoldConstant()(relax.transform.LegalizeOps()(mod))
    np.testing.assert_array_equal(ours, _constant(theirs))


def _constant(mod: tvm.IRModule) -> np.ndarray:
    """The one constant ``main`` returns once its transform is folded."""
    body = mod["main"].body
    values = [b.value for block in body.blocks for b in block.bindings] + [body.body]
    found = [v for v in values if isinstance(v, tvm.ir.expr.Constant)]
    assert found, "the transform was not folded"
    return found[0].value.numpy()
