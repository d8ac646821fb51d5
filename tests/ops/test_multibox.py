"""MultiBoxPrior and MultiBoxDetection: TIR on the CPU and OpenCL vs NumPy vs MXNet."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import needs_pocl
from helpers import detector_inputs
from hypothesis import given, settings
from hypothesis import strategies as st
from kernels import run_cpu, run_opencl
from matrix import each_once, examples, heavy_selected
from tvm import te

from edgecv._mxnet import import_mxnet
from edgecv.board.package import read_package_text
from edgecv.board.runtime.opencl_devices import opencl_devices
from edgecv.ops.multibox import (
    multibox_detection,
    multibox_detection_gpu,
    multibox_detection_reference,
    multibox_prior,
    multibox_prior_reference,
)
from edgecv.testing import assert_close

mx = import_mxnet()
HAVE_INTEL = any(d.matches("intel(r) opencl") for d in opencl_devices())
needs_intel = pytest.mark.skipif(not HAVE_INTEL, reason="no Intel OpenCL runtime here")


def mxnet(cls, loc, anchors, **attrs):
    args = (mx.nd.array(cls), mx.nd.array(loc), mx.nd.array(anchors))
    return mx.nd.contrib.MultiBoxDetection(*args, **attrs).asnumpy()


def cpu(cls, loc, anchors, **attrs):
    names = ("cls_prob", "loc_pred", "anchors")
    ins = [
        te.placeholder(a.shape, "float32", name=n)
        for a, n in zip((cls, loc, anchors), names, strict=True)
    ]
    func = te.create_prim_func([*ins, multibox_detection(*ins, **attrs)])
    out = np.zeros((cls.shape[0], cls.shape[2], 6), np.float32)
    return run_cpu(func, [cls, loc, anchors, out])[3]


def opencl(cls, loc, anchors, threads=64, subgroup=None, device="intel", **attrs):
    func = multibox_detection_gpu(
        cls.shape, loc.shape, anchors.shape, "float32", "opencl", threads, subgroup, **attrs
    )
    out = np.zeros((cls.shape[0], cls.shape[2], 6), np.float32)
    profile = "deeplens" if subgroup else "aisage"  # deeplens: Intel subgroups of 16
    return run_opencl(func, [cls, loc, anchors, out], device, profile)[3]


def check(ours, ref):
    np.testing.assert_array_equal(ours[..., 0], ref[..., 0])  # classes (and suppression): exact
    np.testing.assert_array_equal(ours[..., 1], ref[..., 1])  # scores are copied: exact
    assert_close(ours, ref, "detections")


SSD = dict(nms_threshold=0.45, threshold=0.01, nms_topk=400, force_suppress=False)
CASES = [
    (1, 2, 1, {}),  # one anchor, one class
    (2, 5, 100, {}),
    (1, 4, 300, SSD),
    (2, 3, 257, dict(force_suppress=True, nms_threshold=0.2)),
    (1, 3, 50, dict(nms_threshold=0.0)),  # no NMS: candidates in anchor order
    (1, 3, 50, dict(nms_topk=5, clip=False)),  # rows past nkeep: class -1
    (2, 3, 40, dict(threshold=0.99)),  # no candidate at all
    (1, 3, 60, dict(nms_threshold=1.0)),  # only identical boxes suppress
]


@pytest.mark.parametrize(("batch", "classes", "n", "attrs"), CASES)
def test_reference_and_cpu_match_mxnet(batch, classes, n, attrs):
    data = detector_inputs(np.random.RandomState(n + classes), batch, classes, n)
    ref = mxnet(*data, **attrs)
    check(multibox_detection_reference(*data, **attrs), ref)
    check(cpu(*data, **attrs), ref)


VARIANT = pytest.mark.parametrize("subgroup", [None, 16], ids=["work-group", "intel-subgroup"])


@needs_intel
@pytest.mark.parametrize(
    ("batch", "classes", "n", "attrs", "subgroup"),
    each_once(CASES, [None, 16], ["work-group", "intel-subgroup"]),
)
def test_opencl_matches_mxnet(batch, classes, n, attrs, subgroup):
    data = detector_inputs(np.random.RandomState(n + classes), batch, classes, n)
    threads = 64 if subgroup is None else 256
    check(opencl(*data, threads, subgroup, **attrs), mxnet(*data, **attrs))


@needs_intel
@VARIANT
def test_equal_scores_keep_anchor_order_and_large_inputs(subgroup):
    rng = np.random.RandomState(3)
    data = detector_inputs(rng, 2, 4, 700, levels=[0.1, 0.2, 0.3])
    ref = mxnet(*data, **SSD)
    check(cpu(*data, **SSD), ref)
    check(opencl(*data, threads=256, subgroup=subgroup, **SSD), ref)


@needs_intel
@pytest.mark.parametrize(
    "subgroup",
    [None, pytest.param(16, marks=pytest.mark.heavy)],  # box_nms tests it past 2^16
    ids=["work-group", "intel-subgroup"],
)
def test_more_anchors_than_2_16(subgroup):
    data = detector_inputs(np.random.RandomState(4), 1, 3, 70000)
    attrs = dict(SSD, threshold=0.5)
    ours = opencl(*data, threads=256, subgroup=subgroup, **attrs)
    check(ours, multibox_detection_reference(*data, **attrs))


@needs_pocl()
# CASES[5] sorts only its topk, CASES[2] everything (PoCL compiles one in ~30 s: heavy)
@pytest.mark.parametrize(
    ("batch", "classes", "n", "attrs"), [CASES[5], pytest.param(*CASES[2], marks=pytest.mark.heavy)]
)
def test_pocl_matches_mxnet(batch, classes, n, attrs):
    data = detector_inputs(np.random.RandomState(n + classes + 1), batch, classes, n)
    check(opencl(*data, 256, device="pocl", **attrs), mxnet(*data, **attrs))


@settings(max_examples=examples(12), deadline=None)
@given(
    seed=st.integers(0, 2**16),
    n=st.integers(1, 80),
    classes=st.integers(2, 5),
    nms=st.sampled_from([0.0, 0.3, 0.5, 1.0, 1.5]),
    topk=st.sampled_from([-1, 0, 4]),
    force=st.booleans(),
    ties=st.booleans(),
    subgroup=st.sampled_from([None, 16]),
)
def test_random_vs_mxnet(seed, n, classes, nms, topk, force, ties, subgroup):
    """Every example on the CPU and one OpenCL variant (drawn: each example's shapes and
    attributes are a new program, 5-15 s to compile); ``-m heavy`` runs both variants."""
    rng = np.random.RandomState(seed)
    data = detector_inputs(rng, 2, classes, n, levels=[0.2, 0.4] if ties else None)
    attrs = dict(nms_threshold=nms, nms_topk=topk, force_suppress=force)
    ref = mxnet(*data, **attrs)
    check(cpu(*data, **attrs), ref)
    if HAVE_INTEL:
        for variant in [None, 16] if heavy_selected() else [subgroup]:
            threads = 32 if variant is None else 64
            check(opencl(*data, threads=threads, subgroup=variant, **attrs), ref)


def test_bad_shapes_are_named():
    cls = te.placeholder((1, 3, 10), "float32")
    with pytest.raises(ValueError, match=r"loc_pred must be \(B, N \* 4\)"):
        multibox_detection(cls, te.placeholder((1, 10), "float32"), te.placeholder((1, 10, 4)))
    with pytest.raises(ValueError, match="anchors must be"):
        multibox_detection(cls, te.placeholder((1, 40), "float32"), te.placeholder((1, 9, 4)))
    with pytest.raises(ValueError, match="classes >= 2"):
        multibox_detection(
            te.placeholder((1, 1, 10)), te.placeholder((1, 40)), te.placeholder((1, 10, 4))
        )


PRIORS = [
    dict(sizes=(0.5, 0.25), ratios=(1, 2, 0.5)),
    dict(sizes=(0.3, 0.7), ratios=(1, 3), clip=True, steps=(0.4, 0.2), offsets=(0.2, 0.7)),
    dict(),
]


@pytest.mark.parametrize("attrs", PRIORS)
@pytest.mark.parametrize("shape", [(1, 3, 5, 4), (2, 1, 1, 1), (1, 2, 16, 16)])
def test_prior_matches_mxnet(shape, attrs):
    ref = mx.nd.contrib.MultiBoxPrior(mx.nd.zeros(shape), **attrs).asnumpy()
    assert_close(multibox_prior_reference(shape, **attrs), ref, "NumPy priors vs MXNet")
    x = te.placeholder(shape, "float32", name="data")
    func = te.create_prim_func([x, multibox_prior(x, **attrs)])
    arrays = [np.zeros(shape, np.float32), np.zeros(ref.shape, np.float32)]
    assert_close(run_cpu(func, arrays)[1], ref, "TIR priors vs MXNet")


def test_prior_rejects_bad_sizes():
    with pytest.raises(ValueError, match="sizes and ratios must be non-empty and positive"):
        multibox_prior(te.placeholder((1, 3, 4, 4)), sizes=(0.0,))


def _ssd_head(tmp_path, classes=4):
    """A tiny MXNet-style SSD: conv features, anchors from MultiBoxPrior, class and box
    heads, MultiBoxDetection; saved as an MXNet model with random weights."""
    anchors_per_pixel = 3  # 2 sizes + 2 ratios - 1
    x = mx.sym.var("data")
    feat = mx.sym.relu(mx.sym.Convolution(x, num_filter=8, kernel=(3, 3), pad=(1, 1), name="f"))
    cls = mx.sym.Convolution(
        feat, num_filter=anchors_per_pixel * classes, kernel=(3, 3), pad=(1, 1), name="cls"
    )
    cls = mx.sym.reshape(mx.sym.transpose(cls, axes=(0, 2, 3, 1)), shape=(0, -1, classes))
    cls_prob = mx.sym.transpose(mx.sym.softmax(cls, axis=2), axes=(0, 2, 1))
    loc = mx.sym.Convolution(
        feat, num_filter=anchors_per_pixel * 4, kernel=(3, 3), pad=(1, 1), name="loc"
    )
    loc = mx.sym.flatten(mx.sym.transpose(loc, axes=(0, 2, 3, 1)))
    anchors = mx.sym.contrib.MultiBoxPrior(feat, sizes=(0.3, 0.6), ratios=(1, 2), clip=True)
    out = mx.sym.contrib.MultiBoxDetection(
        cls_prob, loc, anchors, nms_threshold=0.45, nms_topk=50, name="det"
    )
    rng = np.random.RandomState(11)
    params = {}
    for name, shape in [("f", (8, 3, 3, 3)), ("cls", (12, 8, 3, 3)), ("loc", (12, 8, 3, 3))]:
        params[f"arg:{name}_weight"] = rng.standard_normal(shape).astype(np.float32) * 0.3
        params[f"arg:{name}_bias"] = rng.standard_normal(shape[0]).astype(np.float32) * 0.1
    out.save(str(tmp_path / "ssd-symbol.json"))
    mx.nd.save(str(tmp_path / "ssd-0000.params"), {k: mx.nd.array(v) for k, v in params.items()})
    return tmp_path / "ssd-symbol.json", tmp_path / "ssd-0000.params"


@pytest.fixture(scope="module")
def ssd_head(tmp_path_factory):
    return _ssd_head(tmp_path_factory.mktemp("ssd_head"))


@pytest.mark.parametrize(
    "profile",
    [
        "cpu",
        # heavy: the work-group version deployed; by default the deeplens case deploys the
        # GPU version (launch, package, load) and test_opencl_matches_mxnet runs that kernel
        pytest.param("aisage", marks=pytest.mark.heavy),
        "deeplens",
    ],
)
def test_imported_ssd_head_matches_mxnet(tmp_path, ssd_head, profile):
    import json

    from conftest import mxnet_forward

    from edgecv.board.model import load
    from edgecv.deploy import deploy
    from edgecv.pipelines import BuildOptions

    if profile != "cpu" and not HAVE_INTEL:
        pytest.skip("no Intel OpenCL runtime here")
    symbol, params = ssd_head
    pkg = deploy(
        str(symbol),
        tmp_path / "pkg",
        profile,
        params=str(params),
        input_shape=(2, 3, 12, 12),
        options=BuildOptions(layout="NCHW"),  # not about layouts: no graph-tuner timings
    )
    if profile != "cpu":  # the GPU version ran: its NMS is one work-group per batch
        launches = json.loads((pkg / "kernels" / "opencl_launches.json").read_text())
        (det,) = [v for k, v in launches.items() if "multibox_detection" in k]
        assert det[-1]["global_size"][0] == 2 * det[-1]["local_size"][0]
        # deeplens has Intel subgroups: the subgroup variants, one subgroup of 16 a row
        source = read_package_text(pkg / "kernels" / "opencl.cl.gz")
        assert ("intel_reqd_sub_group_size(16)" in source) == (profile == "deeplens")
        assert (det[-1]["local_size"][0] == 16) == (profile == "deeplens")
    x = np.random.RandomState(12).uniform(0, 1, (2, 3, 12, 12)).astype(np.float32)
    ours = load(pkg, on="intel" if profile != "cpu" else None).run(x)[0]
    ref = mxnet_forward(symbol, params, x)[0]
    assert (ref[..., 0] >= 0).sum() > 10  # real detections, some suppressed or cut
    np.testing.assert_array_equal(ours[..., 0], ref[..., 0])
    assert_close(ours, ref, "detections")
