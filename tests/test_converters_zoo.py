"""Converters the wider GluonCV zoo needs, each against MXNet's own operator."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_converters import run_both

from edgecv._mxnet import import_mxnet
from edgecv.board.errors import ConversionError, QuantizedGraphError
from edgecv.frontend.mxnet.converters.image import resize_output_size
from edgecv.frontend.mxnet.importer import from_mxnet
from edgecv.frontend.mxnet.mxnet_graph import parse_symbol
from edgecv.testing import assert_close

mx = import_mxnet()
S = mx.sym
d = S.var("data")


def _bilinear(**kw):
    return S.contrib.BilinearResize2D(d, **kw)


CASES = {
    "adaptive_avg_1": (S.contrib.AdaptiveAvgPooling2D(d, output_size=1), (1, 3, 7, 9)),
    "adaptive_avg_3x2": (S.contrib.AdaptiveAvgPooling2D(d, output_size=(3, 2)), (2, 2, 7, 9)),
    "adaptive_avg_6": (S.contrib.AdaptiveAvgPooling2D(d, output_size=6), (1, 2, 13, 10)),
    "resize_size_aligned": (_bilinear(height=11, width=7), (1, 2, 5, 4)),
    "resize_size_half_pixel": (_bilinear(height=11, width=7, align_corners=False), (1, 2, 5, 4)),
    "resize_down_half_pixel": (_bilinear(height=3, width=2, align_corners=False), (1, 2, 7, 9)),
    "resize_to_one": (_bilinear(height=1, width=1, align_corners=False), (1, 2, 4, 4)),
    "resize_scale": (_bilinear(scale_height=2.0, scale_width=0.5), (1, 2, 5, 8)),
    "resize_odd_scale": (
        _bilinear(scale_height=2.0, scale_width=2.0, mode="odd_scale"),
        (1, 1, 5, 6),
    ),
    "resize_to_even_up": (_bilinear(mode="to_even_up"), (1, 1, 5, 6)),
    "resize_to_odd_down": (_bilinear(mode="to_odd_down", align_corners=False), (1, 1, 5, 6)),
    "resize_like": (
        S.contrib.BilinearResize2D(d, S.zeros((1, 1, 9, 3)), mode="like"),
        (1, 2, 4, 5),
    ),
    "sync_batchnorm": (
        S.contrib.SyncBatchNorm(d, fix_gamma=False, eps=1e-5, key="bn0"),
        (2, 3, 4, 4),
    ),
    "shape_array": (S.broadcast_add(S.cast(S.shape_array(d), "float32"), S.sum(d)), (2, 3)),
    # CenterNet's decoder: int64 top-k indices divided by products of shape_array parts
    "int64_index_math": (
        S.Group(
            [
                S.broadcast_div(
                    S.cast(S.topk(d, k=3, ret_typ="indices"), "int64"),
                    S.split(S.shape_array(d), num_outputs=2, axis=0)[1],
                ),
                S.broadcast_mod(
                    S.cast(S.topk(d, k=3), "int64"),
                    S.slice_axis(S.shape_array(d), axis=0, begin=0, end=1) + 2,
                ),
            ]
        ),
        (2, 6),
    ),
    "broadcast_axis": (
        S.broadcast_axis(S.sum(d, axis=1, keepdims=True), axis=1, size=4),
        (2, 3, 5),
    ),
    "reverse": (S.Group([S.reverse(d, axis=1), S.reverse(d, axis=(0, 2))]), (2, 3, 4)),
    "reshape_like": (
        S.Group(
            [
                S.reshape_like(d, S.zeros((4, 6))),
                S.reshape_like(d, S.zeros((6, 2)), lhs_begin=1, lhs_end=3, rhs_begin=0, rhs_end=2),
            ]
        ),
        (2, 3, 4),
    ),
    "batch_dot": (S.batch_dot(d, S.transpose(d, axes=(0, 2, 1))), (2, 3, 4)),
    "batch_dot_transposed": (S.batch_dot(d, d, transpose_a=True), (2, 3, 3)),
    "log2": (S.log2(d), (3, 4)),
    # R-CNN splits into one part (one class); Relax returns the tensor, not a tuple
    "split_one": (
        S.Group([S.split(d, num_outputs=1, axis=1), S.split(d, 1, axis=1, squeeze_axis=True)]),
        (2, 1, 3),
    ),
    "argsort": (
        S.Group(
            [
                S.argsort(d, axis=1),
                S.argsort(d, is_ascend=False),
                S.argsort(d, axis=None, dtype="int32"),
            ]
        ),
        (2, 5, 3),
    ),
    "sort": (S.Group([S.sort(d), S.sort(d, axis=0, is_ascend=False)]), (3, 6)),
    "topk": (
        S.Group(
            [
                S.topk(d, k=3, ret_typ="both"),
                S.topk(d, axis=0, k=2, ret_typ="value"),
                S.topk(d, k=2, is_ascend=True, dtype="int32"),
            ]
        ),
        (4, 7),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_zoo_converter_matches_mxnet(case):
    sym, shape = CASES[case]
    ours, ref = run_both(sym, shape, positive=case == "log2")
    assert len(ours) == len(ref)
    for i, (o, r) in enumerate(zip(ours, ref, strict=True)):
        assert o.dtype == r.dtype, f"{case} output {i}: dtype {o.dtype} != {r.dtype}"
        assert_close(o, r, f"{case} output {i}")


def test_gather_nd_matches_mxnet():
    # indices as a constant graph input: the index tuples along MXNet's first axis
    indices = np.array([[0, 1, 1, 0], [2, 0, 1, 2]], np.int32)  # 2 coordinates, 4 picks
    sym = S.gather_nd(d, S.var("idx", dtype="int32"))
    x = np.random.RandomState(0).normal(size=(3, 4, 5)).astype(np.float32)
    ref = mx.nd.gather_nd(mx.nd.array(x), mx.nd.array(indices, dtype="int32")).asnumpy()
    imported = from_mxnet(parse_symbol(sym.tojson()), {"idx": indices}, {"data": x.shape})
    assert imported.output_shapes == [ref.shape]
    from test_converters import Executor, CPUBackend, build_cpu, lower, tvm  # noqa: I001

    lowered = lower(imported.mod)
    lib = build_cpu(lowered.kernels, tvm.target.Target({"kind": "llvm"}))
    ours = Executor(lowered.plan, CPUBackend(lib), lowered.constants).run([x])
    assert_close(ours[0], ref)


@pytest.mark.parametrize("shape", [(5, 6), (6, 5), (1, 2), (7, 7)])
@pytest.mark.parametrize(
    "mode", ["size", "odd_scale", "to_even_down", "to_even_up", "to_odd_down", "to_odd_up"]
)
def test_resize_output_size_matches_mxnet(mode, shape):
    kw = {"scale_height": 1.5, "scale_width": 2.0} if mode in ("size", "odd_scale") else {}
    ref = mx.nd.contrib.BilinearResize2D(mx.nd.zeros((1, 1, *shape)), mode=mode, **kw).shape
    scale = (kw.get("scale_height"), kw.get("scale_width"))
    assert resize_output_size(shape, mode, (1, 1), scale) == ref[2:]


def _convert(sym, shape, **patch):
    """Import ``sym``; ``patch`` overrides attributes of its last node (MXNet itself
    refuses bad values when a symbol is created, an exported file can still hold them)."""
    raw = json.loads(sym.tojson())
    raw["nodes"][-1].setdefault("attrs", {}).update(patch)
    return from_mxnet(parse_symbol(json.dumps(raw)), {}, {"data": shape})


@pytest.mark.parametrize(
    ("sym", "shape", "patch", "match"),
    [
        (
            _bilinear(height=4, width=4),
            (1, 1, 3, 3),
            {"mode": "bicubic"},
            r"attribute `mode` should be one of \['size'.*found 'bicubic'",
        ),
        (
            _bilinear(height=4, width=4),
            (1, 1, 3, 3),
            {"align_corners": "maybe"},
            "attribute `align_corners` should be a boolean",
        ),
        (
            _bilinear(scale_height=2.0, scale_width=2.0, mode="odd_scale"),
            (1, 1, 3, 3),
            {"scale_width": "None"},
            "needs both `scale_height` and `scale_width`",
        ),
        (
            S.contrib.AdaptiveAvgPooling2D(d, output_size=2),
            (1, 1, 4, 4),
            {"output_size": "(1, 2, 3)"},
            "attribute `output_size` should be one or two",
        ),
        (S.broadcast_axis(d, axis=0, size=3), (1, 2), {"size": "(3, 4)"}, "one per axis"),
        (S.broadcast_axis(d, axis=(0,), size=(3,)), (2, 2), {}, "only size-1 axes"),
        (S.topk(d, k=2), (2, 5), {"ret_typ": "mask"}, "ret_typ `mask` is not supported"),
        (S.topk(d, k=2), (2, 5), {"k": "two"}, "attribute `k` should be an integer"),
        (S.reverse(d, axis=1), (2, 2), {"axis": "3"}, "out of range"),
        (S.squeeze(d, axis=-1), (2, 1), {"axis": "(0,)"}, "cannot squeeze axis 0 of size 2"),
        (S.squeeze(d, axis=-1), (2, 1), {"axis": "(-3,)"}, "out of range"),
    ],
)
def test_bad_attributes_are_rejected(sym, shape, patch, match):
    with pytest.raises(ConversionError, match=match) as info:
        _convert(sym, shape, **patch)
    assert "(op `" in str(info.value)  # names the op


def test_int8_graph_refused_with_one_message():
    q = S.contrib.quantize_v2(d, min_calib_range=-1.0, max_calib_range=1.0)
    sym = S.contrib.dequantize(q[0], q[1], q[2])
    with pytest.raises(QuantizedGraphError, match="int8 graphs are not supported.*float32"):
        _convert(sym, (1, 4))


def _dcn(data_shape, **kw):
    """DCNv2 on ``data``; offsets and mask are graph parameters (random in ``run_both``)."""
    (kh, kw_), (h, w) = kw["kernel"], data_shape[2:]
    stride, dilate, pad = kw.get("stride", (1, 1)), kw.get("dilate", (1, 1)), kw.get("pad", (0, 0))
    oh = (h + 2 * pad[0] - dilate[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (w + 2 * pad[1] - dilate[1] * (kw_ - 1) - 1) // stride[1] + 1
    taps = kh * kw_ * kw.get("num_deformable_group", 1)
    offset = S.var("offset", shape=(data_shape[0], 2 * taps, oh, ow)) * 2.0  # off the edge too
    mask = S.sigmoid(S.var("mask", shape=(data_shape[0], taps, oh, ow)))
    return S.contrib.ModulatedDeformableConvolution(d, offset, mask, **kw)


@pytest.mark.parametrize(
    "kw",
    [
        {"kernel": (3, 3), "pad": (1, 1), "num_filter": 4},
        {
            "kernel": (3, 3),
            "stride": (2, 2),
            "dilate": (2, 2),
            "pad": (2, 2),
            "num_filter": 2,
            "num_deformable_group": 2,
        },
        {"kernel": (1, 3), "num_filter": 4, "num_group": 2, "no_bias": True},
    ],
)
def test_modulated_deformable_convolution_matches_mxnet(kw):
    shape = (1, 4, 7, 6)
    ours, ref = run_both(_dcn(shape, **kw), shape)
    assert_close(ours[0], ref[0], "dcnv2")


@pytest.mark.parametrize(
    ("patch", "match"),
    [
        ({"num_deformable_group": "3"}, "do not split into"),
        ({"layout": "NHWC"}, "attribute `layout` should be NCHW"),
        ({"num_filter": "5"}, r"input `weight` has shape \(2, 4, 3, 3\), expected \(5, 4, 3, 3\)"),
    ],
)
def test_deformable_convolution_bad_attributes(patch, match):
    shape = (1, 4, 5, 5)
    sym = _dcn(shape, kernel=(3, 3), pad=(1, 1), num_filter=2, no_bias=True)
    raw = json.loads(sym.tojson())
    raw["nodes"][-1]["attrs"].update(patch)
    arg_shapes, _, _ = sym.infer_shape(data=shape)
    params = {
        n: np.zeros(s, np.float32)
        for n, s in zip(sym.list_arguments(), arg_shapes, strict=True)
        if n != "data"
    }
    with pytest.raises(ConversionError, match=match):
        from_mxnet(parse_symbol(json.dumps(raw)), params, {"data": shape})
