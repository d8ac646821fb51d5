"""box_decode: TVM vs the NumPy reference vs MXNet's own operator."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

from edgecv._mxnet import import_mxnet
from edgecv.ops.box_decode import box_decode, box_decode_reference
from edgecv.testing import assert_close

mx = import_mxnet()


def run_tvm(data, anchors, **attrs):
    x = te.placeholder(data.shape, "float32", name="data")
    a = te.placeholder(anchors.shape, "float32", name="anchors")
    func = te.create_prim_func([x, a, box_decode(x, a, **attrs)]).with_attr("global_symbol", "f")
    lib = tvm.tirx.build(
        tvm.IRModule({"f": func}), target=tvm.target.Target({"kind": "llvm"}), pipeline=None
    )
    out = tvm.runtime.empty(data.shape, "float32")
    lib["f"](tvm.runtime.tensor(data), tvm.runtime.tensor(anchors), out)
    return out.numpy()


@pytest.mark.parametrize("fmt", ["center", "corner"])
@pytest.mark.parametrize("clip", [-1.0, 0.5])
@pytest.mark.parametrize("batch", [1, 3])
def test_matches_mxnet_and_reference(fmt, clip, batch):
    rng = np.random.RandomState(batch)
    n = 37
    data = rng.normal(0, 2, (batch, n, 4)).astype(np.float32)
    xy = rng.uniform(0, 100, (1, n, 2))
    wh = rng.uniform(1, 50, (1, n, 2))
    anchors = np.concatenate([xy, xy + wh] if fmt == "corner" else [xy, wh], -1).astype(np.float32)
    attrs = dict(std0=0.1, std1=0.1, std2=0.2, std3=0.2, clip=clip, format=fmt)
    ref = box_decode_reference(data, anchors, **attrs)
    theirs = mx.nd.contrib.box_decode(mx.nd.array(data), mx.nd.array(anchors), **attrs).asnumpy()
    assert_close(theirs, ref, "MXNet box_decode")
    assert_close(run_tvm(data, anchors, **attrs), ref, "TIR box_decode")


def test_bad_input():
    x = te.placeholder((1, 5, 4), "float32")
    with pytest.raises(ValueError, match="format"):
        box_decode(x, te.placeholder((1, 5, 4), "float32"), format="xywh")
    with pytest.raises(ValueError, match=r"anchors must be \(1, 5, 4\)"):
        box_decode(x, te.placeholder((1, 6, 4), "float32"))
