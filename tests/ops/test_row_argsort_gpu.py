"""MXNet's argsort/topk through the GPU version of the row sort (edgecv.ops.row_argsort_gpu)."""

from __future__ import annotations

import numpy as np
import pytest
from kernels import run_opencl

from edgecv._mxnet import import_mxnet
from edgecv.codegen.op_versions import OpVersions
from edgecv.frontend.mxnet.importer import from_mxnet
from edgecv.frontend.mxnet.mxnet_graph import parse_symbol
from edgecv.profiles import load_profile

mx = import_mxnet()
S = mx.sym


@pytest.mark.parametrize(
    ("op", "kwargs", "profile"),
    [
        ("topk", {"k": 5}, "aisage"),
        ("topk", {"k": 40, "is_ascend": True}, "deeplens"),
        ("argsort", {"is_ascend": False}, "deeplens"),
        ("argsort", {}, "aisage"),
    ],
)
def test_gpu_row_sort_matches_mxnet(op, kwargs, profile):
    """GPU builds replace the importer's tagged row-argsort kernel with the segmented
    sort; run that version on Intel's OpenCL CPU runtime against MXNet's operator."""
    keys = np.random.RandomState(1).normal(size=(3, 300)).astype(np.float32)
    sym = getattr(S, op)(S.var("data"), dtype="int32", **kwargs)
    imported = from_mxnet(parse_symbol(sym.tojson()), {}, {"data": keys.shape})
    tagged = [f for f in imported.mod.functions.values() if f.attrs and "edgecv.op" in f.attrs]
    assert len(tagged) == 1
    prof = load_profile(profile)
    func = OpVersions().gpu_version(tagged[0], prof.tvm_target(), prof.intel_subgroup_size)
    want = getattr(mx.nd, op)(mx.nd.array(keys), dtype="int32", **kwargs).asnumpy()
    got = run_opencl(func, [keys, np.zeros(want.shape, np.int32)], "intel", profile)[1]
    np.testing.assert_array_equal(got, want)
