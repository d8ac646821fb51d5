"""Each converter on a one-layer graph, against MXNet's own operator on the same input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm

from edgecv._mxnet import import_mxnet
from edgecv.board.runtime.cpu import CPUBackend
from edgecv.board.runtime.executor import Executor
from edgecv.codegen.llvm import build_cpu
from edgecv.frontend.mxnet.converters.tensor import mxnet_reshape
from edgecv.frontend.mxnet.importer import from_mxnet
from edgecv.frontend.mxnet.mxnet_graph import parse_symbol
from edgecv.lowering import lower
from edgecv.testing import assert_close

mx = import_mxnet()
S = mx.sym


def run_both(sym, shape, seed=0, positive=False):
    """Convert+run ``sym`` with edgecv and with MXNet on the same random data/params."""
    rng = np.random.RandomState(seed)
    arg_shapes, _, aux_shapes = sym.infer_shape(data=shape)
    names = sym.list_arguments()
    params = {}
    for name, s in zip(names, arg_shapes, strict=True):
        if name != "data":
            params[name] = rng.uniform(0.5 if "var" in name else -1, 1.5 if "var" in name else 1, s)
    for name, s in zip(sym.list_auxiliary_states(), aux_shapes, strict=True):
        params[name] = rng.uniform(0.5, 1.5, s) if "var" in name else rng.normal(0, 0.2, s)
    params = {k: v.astype(np.float32) for k, v in params.items()}
    x = rng.normal(0, 1, shape).astype(np.float32)
    if positive:
        x = np.abs(x) + 0.1
    graph = parse_symbol(sym.tojson())
    imported = from_mxnet(graph, params, {"data": shape})
    lowered = lower(imported.mod)
    lib = build_cpu(lowered.kernels, tvm.target.Target({"kind": "llvm"}))
    ours = Executor(lowered.plan, CPUBackend(lib), lowered.constants).run([x])
    args = {"data": mx.nd.array(x), **{k: mx.nd.array(v) for k, v in params.items()}}
    ex = sym.bind(
        mx.cpu(),
        {k: args[k] for k in names},
        aux_states={k: args[k] for k in sym.list_auxiliary_states()},
    )
    ref = [o.asnumpy() for o in ex.forward(is_train=False)]
    return ours, ref


d = S.var("data")
CASES = {
    "conv3x3_s2_bias": (
        S.Convolution(d, kernel=(3, 3), stride=(2, 2), pad=(1, 1), num_filter=8),
        (1, 3, 15, 15),
    ),
    "conv_grouped_dilated": (
        S.Convolution(
            d, kernel=(3, 3), dilate=(2, 2), pad=(2, 2), num_group=2, num_filter=4, no_bias=True
        ),
        (2, 4, 9, 9),
    ),
    "conv1d": (S.Convolution(d, kernel=(3,), num_filter=4), (1, 2, 10)),
    "deconv": (
        S.Deconvolution(d, kernel=(4, 4), stride=(2, 2), pad=(1, 1), num_filter=3),
        (1, 4, 5, 5),
    ),
    "batchnorm_fix_gamma": (S.BatchNorm(d, fix_gamma=True, eps=1e-3), (1, 3, 4, 4)),
    "batchnorm": (S.BatchNorm(d, fix_gamma=False, eps=1e-5), (2, 3, 4, 4)),
    "maxpool_full": (
        S.Pooling(d, kernel=(3, 3), stride=(2, 2), pool_type="max", pooling_convention="full"),
        (1, 2, 10, 10),
    ),
    "maxpool_valid_pad": (
        S.Pooling(d, kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="max"),
        (1, 2, 9, 9),
    ),
    "avgpool_pad": (
        S.Pooling(d, kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="avg"),
        (1, 2, 9, 9),
    ),
    "avgpool_no_pad_count": (
        S.Pooling(
            d, kernel=(3, 3), stride=(1, 1), pad=(1, 1), pool_type="avg", count_include_pad=False
        ),
        (1, 2, 6, 6),
    ),
    "global_avg": (S.Pooling(d, kernel=(1, 1), global_pool=True, pool_type="avg"), (1, 3, 5, 7)),
    "global_max": (S.Pooling(d, kernel=(1, 1), global_pool=True, pool_type="max"), (1, 3, 5, 7)),
    "fc_flatten": (S.FullyConnected(d, num_hidden=5), (2, 3, 2, 2)),
    "fc_no_flatten": (S.FullyConnected(d, num_hidden=5, flatten=False, no_bias=True), (2, 3, 4)),
    "relu6_clip": (S.clip(d, 0, 6), (2, 8)),
    "leaky": (S.LeakyReLU(d, act_type="leaky", slope=0.1), (2, 8)),
    "prelu": (S.LeakyReLU(d, act_type="prelu"), (1, 3, 4, 4)),
    "elu": (S.LeakyReLU(d, act_type="elu", slope=0.3), (2, 8)),
    "selu": (S.LeakyReLU(d, act_type="selu"), (2, 8)),
    "gelu": (S.LeakyReLU(d, act_type="gelu"), (2, 8)),
    "activations": (
        S.Group(
            [
                S.Activation(d, act_type=a)
                for a in ("relu", "sigmoid", "tanh", "softrelu", "softsign")
            ]
        ),
        (2, 8),
    ),
    "upsampling": (S.UpSampling(d, scale=2, sample_type="nearest", num_args=1), (1, 2, 3, 4)),
    "pad_constant": (
        S.Pad(d, mode="constant", pad_width=(0, 0, 0, 0, 1, 2, 2, 1), constant_value=0.5),
        (1, 2, 3, 3),
    ),
    "pad_edge": (S.Pad(d, mode="edge", pad_width=(0, 0, 0, 0, 1, 1, 1, 1)), (1, 2, 3, 3)),
    "pad_reflect": (S.Pad(d, mode="reflect", pad_width=(0, 0, 0, 0, 1, 1, 1, 1)), (1, 2, 3, 3)),
    "softmax_activation": (S.SoftmaxActivation(d, mode="channel"), (1, 3, 2, 2)),
    "softmax_temperature": (S.softmax(d, axis=1, temperature=2.0), (2, 5)),
    "log_softmax": (S.log_softmax(d, axis=-1), (2, 5)),
    "broadcast_math": (
        S.Group(
            [
                S.broadcast_add(d, S.sum(d, axis=1, keepdims=True)),
                S.broadcast_mul(d, S.max(d, axis=0, keepdims=True)),
                S.broadcast_div(d, S.abs(d) + 1),
                S.broadcast_maximum(d, S.mean(d, axis=(0, 1), keepdims=True)),
            ]
        ),
        (3, 4),
    ),
    "scalar_math": (
        S.Group(
            [d * 2, d + 1, 1 - d, 2 / (S.abs(d) + 1), d**2, d > 0.1, d <= 0.0, S.maximum(d, 0.2)]
        ),
        (3, 4),
    ),
    "unary": (
        S.Group([S.exp(d), S.sqrt(S.abs(d)), S.square(d), S.negative(d), S.floor(d), S.sigmoid(d)]),
        (3, 4),
    ),
    "reshape_special": (
        S.Group(
            [
                S.reshape(d, shape=(0, -1)),
                S.reshape(d, shape=(-3, -2)),
                S.reshape(d, shape=(0, -4, 2, -1, -2)),
                S.reshape(d, shape=(-1, 6), reverse=True),
            ]
        ),
        (2, 4, 3),
    ),
    "transpose_concat": (
        S.Concat(S.transpose(d, axes=(0, 2, 1)), S.transpose(d, axes=(0, 2, 1)), dim=2),
        (2, 3, 4),
    ),
    "slices": (
        S.Group(
            [
                S.slice_axis(d, axis=-1, begin=1, end=None),
                S.slice(d, begin=(None, 1), end=(None, 3)),
                S.slice_like(d, S.zeros((2, 2, 2)), axes=(1, 2)),
            ]
        ),
        (2, 3, 4),
    ),
    "tile_repeat_expand": (
        S.Group(
            [
                S.tile(d, reps=(2, 1, 1)),
                S.repeat(d, repeats=2, axis=-1),
                S.expand_dims(d, axis=1),
                S.squeeze(S.expand_dims(d, axis=0), axis=0),
                S.squeeze(S.expand_dims(d, axis=-1), axis=-1),
                S.squeeze(S.expand_dims(d, axis=1)),
            ]
        ),
        (2, 3, 4),
    ),
    "where_likes": (S.where(d > 0, S.ones_like(d), S.zeros_like(d) - 1), (3, 4)),
    "split_stack": (S.Group([*S.split(d, num_outputs=2, axis=1), S.stack(d, d, axis=1)]), (2, 4)),
    "l2norm": (S.L2Normalization(d, mode="channel"), (1, 3, 2, 2)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_converter_matches_mxnet(case):
    sym, shape = CASES[case]
    ours, ref = run_both(sym, shape)
    assert len(ours) == len(ref)
    for i, (o, r) in enumerate(zip(ours, ref, strict=True)):
        assert_close(o, r, f"{case} output {i}")


def test_arange_constant_graph():
    sym = S.broadcast_add(d, S.reshape(S.arange(start=0, stop=4), shape=(1, 4)))
    ours, ref = run_both(sym, (2, 4))
    assert_close(ours[0], ref[0])


@pytest.mark.parametrize(
    ("shape", "spec", "reverse", "expected"),
    [
        ((2, 3, 4), (0, -1), False, (2, 12)),
        ((2, 3, 4), (-2,), False, (2, 3, 4)),
        ((2, 3, 4), (-3, 4), False, (6, 4)),
        ((2, 12), (0, -4, 3, -1), False, (2, 3, 4)),
        ((10, 5, 4), (-1, 0), True, (50, 4)),
        ((2, 3, 4), (4, 0, 0, -1), False, None),
    ],
)
def test_mxnet_reshape_rules(shape, spec, reverse, expected):
    if expected is None:
        with pytest.raises((ValueError, IndexError)):
            mxnet_reshape(shape, spec, reverse)
    else:
        assert mxnet_reshape(shape, spec, reverse) == expected
        ref = mx.nd.zeros(shape).reshape(spec, reverse=reverse).shape
        assert ref == expected


def test_graph_json_roundtrip_keeps_multi_output_nodes():
    sym = S.Group(list(S.split(d, num_outputs=3, axis=1)))
    graph = parse_symbol(json.dumps(json.loads(sym.tojson())))
    assert [h[1] for h in graph.heads] == [0, 1, 2]


def _box_nms_rows(sym, shape) -> list[int]:
    """The rows each box_nms kernel of ``sym``'s conversion writes."""
    params = {
        n: np.zeros(s, np.float32)
        for n, s in zip(sym.list_arguments(), sym.infer_shape(data=shape)[0], strict=True)
        if n != "data"
    }
    mod = from_mxnet(parse_symbol(sym.tojson()), params, {"data": shape}).mod
    found = []
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, tvm.relax.Call) and value.op.name == "relax.call_tir":
                if value.args[0].name_hint.startswith("box_nms"):
                    found.append(int(binding.var.ty.shape[-2]))
    return found


def test_box_nms_writes_only_the_rows_its_slice_keeps():
    """A box_nms read only by a slice of its first rows (GluonCV's detectors) writes only
    those rows; read by anything else too, all of them; the answers are MXNet's."""
    nms = S.contrib.box_nms(d, overlap_thresh=0.4, topk=30, id_index=0, coord_start=2)
    cut = S.slice_axis(nms, axis=1, begin=0, end=7)
    shape = (2, 50, 6)
    assert _box_nms_rows(cut, shape) == [7]
    assert _box_nms_rows(S.Group([cut, nms]), shape) == [50]  # the whole output is read
    assert _box_nms_rows(S.slice_axis(nms, axis=1, begin=1, end=7), shape) == [50]
    assert _box_nms_rows(S.slice_axis(nms, axis=2, begin=0, end=5), shape) == [50]
    for sym in (cut, S.Group([cut, nms]), S.slice_axis(nms, axis=-2, begin=0, end=-43)):
        ours, ref = run_both(sym, shape, seed=3, positive=True)
        for o, r in zip(ours, ref, strict=True):
            np.testing.assert_array_equal(o[..., :2], r[..., :2])
            assert_close(o, r, "box_nms then slice_axis")
