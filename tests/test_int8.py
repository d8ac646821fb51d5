"""INT8 packages: the option and its errors, calibration statistics, the quantization
pass, and accuracy against the float32 package of the same weights.

- A small conv net with seeded random weights (BatchNorm statistics random too, so the
  folding of BatchNorm into the requantization is exercised) deployed fp32 and int8:
  the outputs agree within the tolerance derived from the quantization step
  (:data:`edgecv.testing.INT8_PER_LAYER`).
- A network trained here on scikit-learn's digits (:mod:`digits`): INT8 accuracy on
  the held-out images within 1 point of FP32.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from digits import accuracy, train_digits
from helpers import assert_one_error_line, cli_here
from matrix import each_once

import edgecv
from edgecv._mxnet import import_mxnet
from edgecv.board.errors import EdgecvError
from edgecv.board.imaging import preprocess
from edgecv.board.package import sha256
from edgecv.deploy import PREPROCESSING, deploy
from edgecv.lowering import lower
from edgecv.lowering.calibration import BINS, TensorQuant, TensorStats
from edgecv.lowering.quantize import quantize
from edgecv.lowering.quantize_sites import find_sites
from edgecv.pipelines import BuildOptions
from edgecv.pipelines.int8 import model_key, quantize_model, read_calibration, reusable_statistics
from edgecv.profiles import load_profile
from edgecv.schedules.cpu.dot_product import dot_product_of
from edgecv.testing import assert_close_int8

SHAPE = (1, 3, 24, 24)


def _small_net(prefix: Path, seed: int = 0) -> Path:
    """conv3x3+BN+ReLU -> depthwise 3x3+BN+ReLU -> conv1x1(bias)+ReLU -> residual
    conv3x3+BN, add, ReLU -> max pool -> global pool -> dense: every arrangement the
    pass handles, with random BatchNorm statistics. Returns the symbol file."""
    mx = import_mxnet()
    nn = mx.gluon.nn
    mx.random.seed(seed)

    class Net(mx.gluon.HybridBlock):
        def __init__(self):
            super().__init__()
            with self.name_scope():
                self.c1 = nn.Conv2D(16, 3, padding=1, use_bias=False)
                self.b1 = nn.BatchNorm()
                self.dw = nn.Conv2D(16, 3, padding=1, groups=16, use_bias=False)
                self.b2 = nn.BatchNorm()
                self.pw = nn.Conv2D(16, 1)
                self.c3 = nn.Conv2D(16, 3, padding=1, use_bias=False)
                self.b3 = nn.BatchNorm()
                self.fc = nn.Dense(10)

        def hybrid_forward(self, F, x):
            x = F.relu(self.b1(self.c1(x)))
            x = F.relu(self.pw(F.relu(self.b2(self.dw(x)))))
            x = F.relu(x + self.b3(self.c3(x)))
            x = F.Pooling(x, kernel=(2, 2), stride=(2, 2), pool_type="max")
            return self.fc(F.Pooling(x, kernel=(1, 1), global_pool=True, pool_type="avg"))

    net = Net()
    net.initialize(mx.init.Xavier(magnitude=2.0))
    net.hybridize()
    rng = np.random.RandomState(seed)
    x = mx.nd.array(rng.normal(size=SHAPE).astype(np.float32))
    net(x)  # shapes are known after a first call
    for name, param in net.collect_params().items():
        shape = param.shape
        if name.endswith("running_mean") or name.endswith("beta"):
            param.set_data(mx.nd.array(rng.normal(0, 0.2, shape)))
        elif name.endswith("running_var") or name.endswith("gamma"):
            param.set_data(mx.nd.array(rng.uniform(0.5, 2.0, shape)))
    net(x)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    net.export(str(prefix))
    return Path(f"{prefix}-symbol.json")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """(symbol file, calibration .npy, its inputs, fp32 package) of the small net."""
    root = tmp_path_factory.mktemp("int8")
    symbol = _small_net(root / "small")
    inputs = np.random.RandomState(1).normal(size=(16, *SHAPE[1:])).astype(np.float32)
    npy = root / "calibration.npy"
    np.save(npy, inputs)
    fp32 = deploy(symbol, root / "fp32", input_shape=SHAPE, options=_options())
    return symbol, npy, inputs, fp32


@pytest.fixture(scope="module")
def int8_minmax(small, tmp_path_factory):
    """The small net's int8 package, min/max calibration on its inputs, NCHW."""
    symbol, npy, _, _ = small
    return deploy(
        symbol,
        tmp_path_factory.mktemp("int8") / "NCHW",
        input_shape=SHAPE,
        options=_options(precision="int8", calibrate=npy, calibration_method="minmax"),
    )


def _options(**fields) -> BuildOptions:
    """A build without the graph tuner's measurements or tuning records: fast, and the
    same kernels on every machine."""
    return BuildOptions(layout="NCHW", tuning=None, **fields)


# --- the option and its errors ------------------------------------------------------


def test_int8_without_calibration_is_refused_with_what_to_pass(tmp_path, capfd):
    result = cli_here(capfd, "deploy", "mobilenet", "--precision", "int8", "-o", tmp_path / "p")
    line = assert_one_error_line(result, "--precision int8 needs calibration data")
    assert "--calibrate DIR" in line and "--calibrate X.npy" in line
    assert not (tmp_path / "p").exists()


def test_int8_on_a_gpu_profile_is_refused_before_anything_is_built(small, tmp_path):
    with pytest.raises(EdgecvError, match="`deeplens` runs on the opencl backend"):
        deploy(
            small[0],
            tmp_path / "p",
            profile="deeplens",
            input_shape=SHAPE,
            options=_options(precision="int8", calibrate=small[1]),
        )
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize(
    "fields, fragment",
    [
        ({"calibrate": "x.npy"}, "apply to --precision int8 only"),
        ({"precision": "int8", "calibrate": "missing"}, "no such file or folder"),
        ({"precision": "int8", "calibrate": "."}, "holds no images"),
        ({"precision": "int8", "calibrate": "wrong.npy"}, "expected N x 1x3x24x24"),
        ({"precision": "int8", "calibrate": "x.npy", "calibration_size": 0}, ">= 1"),
        ({"precision": "int16"}, "--precision must be one of fp32, int8"),
        ({"precision": "int8", "calibrate": "x.npy", "calibration_method": "mean"}, "minmax"),
    ],
)
def test_bad_calibration_requests_are_refused(small, tmp_path, monkeypatch, fields, fragment):
    symbol = small[0]
    monkeypatch.chdir(tmp_path)
    np.save("x.npy", np.zeros((2, *SHAPE[1:]), np.float32))
    np.save("wrong.npy", np.zeros((2, 3, 32, 32), np.float32))
    with pytest.raises(EdgecvError, match=fragment.replace("+", r"\+")):
        deploy(symbol, tmp_path / "p", input_shape=SHAPE, options=_options(**fields))
    assert not (tmp_path / "p").exists()


# --- statistics ---------------------------------------------------------------------


def test_histogram_grows_its_range_exactly_and_thresholds_order():
    rng = np.random.RandomState(0)
    batches = [np.abs(rng.normal(0, s, 5000)).astype(np.float32) for s in (0.1, 1.0, 7.0)]
    grown = TensorStats()
    for b in batches:
        grown.update(b)
    at_once = TensorStats()
    at_once.update(np.concatenate(batches))
    # doubling the range merges bin pairs: the same counts as one pass over all values
    assert grown.edge == at_once.edge
    np.testing.assert_array_equal(grown.histogram, at_once.histogram)
    assert grown.histogram.sum() == grown.count == 15000 and len(grown.histogram) == BINS
    values = np.concatenate(batches)
    assert grown.nonnegative and grown.threshold("minmax") == values.max()
    # the percentile: the upper edge of the bin of the smallest value that 99.99% of
    # the values do not exceed
    exact = np.sort(values)[int(np.ceil(0.9999 * len(values))) - 1]
    assert exact <= grown.threshold("percentile") <= exact + grown.edge / BINS
    assert grown.threshold("entropy") <= grown.threshold("minmax")
    restored = TensorStats.from_json(json.loads(json.dumps(grown.to_json())))
    assert {m: restored.threshold(m) for m in ("minmax", "percentile", "entropy")} == {
        m: grown.threshold(m) for m in ("minmax", "percentile", "entropy")
    }


def test_a_relu_spike_of_zeros_does_not_drag_the_entropy_threshold_down():
    rng = np.random.RandomState(0)
    relu = np.maximum(rng.normal(0, 1, 200_000), 0).astype(np.float32)  # half zeros
    stats = TensorStats()
    stats.update(relu)
    assert stats.zeros > 90_000
    # a Gaussian's tail: KL clips a little, never half the range
    assert 0.6 * stats.threshold("minmax") < stats.threshold("entropy") <= stats.maximum


# --- the pass -------------------------------------------------------------------------


def test_the_pass_folds_batchnorm_and_passes_uint8_between_convolutions(small):
    mod = _imported(small[0])
    found = find_sites(mod)
    assert [s.name for s in found.sites] == [
        "conv2d_0",
        "conv2d_1",
        "conv2d_2",
        "conv2d_3",
        "dense_0",
    ]
    quants = {k: TensorQuant(0.05, "int8" if k == "t0" else "uint8") for k in found.tensors}
    quantized, records = quantize(mod, quants)
    # BatchNorm's multiply + add (and the 1x1's bias) folded into the requantization
    assert {r["name"]: r["epilogue"] for r in records}["conv2d_0"] == ["multiply", "add"]
    lowered = lower(quantized)
    ops = list(lowered.kernel_ops.values())
    # the first convolution's kernel: int8 conv, requantization + BatchNorm in one
    # multiply-add, ReLU, and the next convolution's quantization, one kernel
    assert [
        "conv2d",
        "cast",
        "multiply",
        "add",
        "relu",
        "multiply",
        "tir_round",
        "tir_clip",
        "cast",
    ] in ops
    plan = lowered.plan
    conv_inputs = [
        plan.buffers[s.args[0]].dtype
        for s in plan.steps
        if lowered.kernel_ops[s.kernel][0] in ("conv2d", "matmul")
    ]
    assert conv_inputs == ["int8", "uint8", "uint8", "uint8", "uint8"]
    assert sum(o[0] == "conv2d" for o in ops) == 4


def test_a_residual_add_reads_the_8_bit_tensor_the_next_convolution_reads(small):
    """The residual block's input is read by its 3x3 convolution and by the add. With
    ``residual_adds`` the add reads the uint8 tensor (dequantized in its own kernel):
    the 1x1 that makes it writes 8 bits only, and no kernel of its own quantizes it."""
    mod = _imported(small[0])
    found = find_sites(mod)
    quants = {k: TensorQuant(0.05, "int8" if k == "t0" else "uint8") for k in found.tensors}
    lowered = {}
    for residual_adds in (False, True):
        quantized, records = quantize(mod, quants, residual_adds=residual_adds)
        adds = [r for r in records if r["op"] == "add"]
        assert [(r["input"], r["input_dtype"]) for r in adds] == (
            [("t3", "uint8")] if residual_adds else []
        )
        lowered[residual_adds] = lower(quantized)
    quantizing = ["multiply", "tir_round", "tir_clip", "cast"]
    for residual_adds, low in lowered.items():
        plan, ops = low.plan, low.kernel_ops
        alone = [  # kernels that only quantize a tensor, by its shape
            tuple(plan.buffers[s.args[0]].shape) for s in plan.steps if ops[s.kernel] == quantizing
        ]
        assert ((1, 16, 24, 24) in alone) != residual_adds, alone
        add = next(s for s in plan.steps if ops[s.kernel].count("add") == 2)  # bias + residual
        reads = sorted(
            plan.buffers[a].dtype for a in add.args[:-1] if plan.buffers[a].kind != "const"
        )
        # with the 8-bit residual, the convolution and the add read the same uint8 tensor
        assert reads == (["uint8"] if residual_adds else ["float32", "uint8"]), reads


def test_a_concatenation_only_quantized_operators_read_is_made_in_8_bits(tmp_path):
    """A fire module: two convolutions concatenated and read only by the next
    convolution. The pieces are quantized in their own kernels and concatenated as
    uint8 (quantizing is elementwise: the same values); no float32 concatenation and
    no kernel of its own quantizing it."""
    mx = import_mxnet()
    nn = mx.gluon.nn

    class Fire(mx.gluon.HybridBlock):
        def __init__(self):
            super().__init__()
            with self.name_scope():
                self.squeeze = nn.Conv2D(8, 1, activation="relu")
                self.e1 = nn.Conv2D(8, 1, activation="relu")
                self.e3 = nn.Conv2D(8, 3, padding=1, activation="relu")
                self.out = nn.Conv2D(16, 1)

        def hybrid_forward(self, F, x):
            s = self.squeeze(x)
            return self.out(F.concat(self.e1(s), self.e3(s), dim=1))

    net = Fire()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(mx.nd.zeros(SHAPE))
    net.export(str(tmp_path / "fire"))
    mod = _imported(tmp_path / "fire-symbol.json")
    found = find_sites(mod)
    quants = {k: TensorQuant(0.05, "int8" if k == "t0" else "uint8") for k in found.tensors}
    lowered = lower(quantize(mod, quants)[0])
    plan, ops = lowered.plan, lowered.kernel_ops
    concat = next(s for s in plan.steps if ops[s.kernel][0] == "concatenate")
    assert ops[concat.kernel] == ["concatenate"]
    assert [plan.buffers[a].dtype for a in concat.args] == ["uint8"] * 3
    assert concat.elided  # the pieces are written in place, in 8 bits
    quantizers = [o for o in ops.values() if "tir_round" in o and "conv2d" not in o]
    assert len(quantizers) == 1, quantizers  # the model's input only


def test_taps_follow_a_nested_tuple_of_outputs():
    """A detector's ``main`` may return a tuple holding a tuple: the calibration build
    returns its leaves, then the taps, as one flat list (a nested output once broke
    the memory plan of an INT8 SSD deploy)."""
    from tvm import relax

    from edgecv.lowering.quantize_sites import with_taps

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.relu(x))
            b = bb.emit(relax.op.exp(a))
            pair = bb.emit_output(relax.Tuple([a, b]))
            c = bb.emit_output(relax.op.negative(b))
        bb.emit_func_output(relax.Tuple([pair, c]))
    mod = bb.get()
    tapped = with_taps(mod, [a])
    lowered = lower(tapped)
    assert all(isinstance(o, int) for o in lowered.plan.outputs)
    assert len(lowered.plan.outputs) == 4  # a, b, c, then the tap of a


def test_an_operator_no_integer_kernel_speeds_up_stays_float32():
    """On a CPU with a dot product, a convolution that cannot use it (20 output
    channels: not in 8s) and whose sums float32 cannot hold exactly (64 x 3 x 3 x 255 x
    127 > 2**24) is not quantized at all: int32 lanes would run at half float32's
    speed (SSD's class heads took 75 of 129 ms that way). Its neighbour in 8s is."""
    from tvm import relax

    from edgecv.pipelines.int8 import _arithmetic, _weight_limits

    target = load_profile("cpu").tvm_target()
    if dot_product_of(target) is None:
        pytest.skip("this CPU has no int8 dot-product instruction edgecv uses")
    rng = np.random.RandomState(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 64, 8, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = relax.op.nn.relu(x)
            heads = [
                relax.op.nn.conv2d(
                    y, relax.const(rng.normal(size=(o, 64, 3, 3)).astype("float32")), padding=1
                )
                for o in (20, 24)
            ]
            out = bb.emit_output(relax.op.concat(heads, axis=1))
        bb.emit_func_output(out)
    mod = bb.get()
    found = find_sites(mod)
    quants = {k: TensorQuant(0.05, "uint8") for k in found.tensors}
    dot = dot_product_of(target)
    _, records = quantize(mod, quants, _weight_limits(dot), arithmetic=_arithmetic(dot))
    assert [(r["name"], r["arithmetic"]) for r in records] == [("conv2d_1", "int32")]


def test_a_dense_layer_on_the_dot_product_is_its_1x1_convolution():
    """On a CPU with a dot product, a dense layer of uint8 inputs in fours and outputs in
    the instruction's lanes runs as the 1x1 convolution it is, on the INT8 convolution
    kernels (7-bit weights there): the int32 sums bit for bit those of the generic
    integer dense layer. One whose outputs do not fit the lanes and whose sums float32
    cannot hold stays float32."""
    from tvm import relax

    from edgecv.board.runtime.cpu import CPUBackend
    from edgecv.board.runtime.executor import Executor
    from edgecv.codegen.llvm import build_cpu
    from edgecv.pipelines.int8 import _arithmetic, _weight_limits

    target = load_profile("cpu").tvm_target()
    dot = dot_product_of(target)
    if dot is None:
        pytest.skip("this CPU has no int8 dot-product instruction edgecv uses")
    rng = np.random.RandomState(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 1024), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = relax.op.nn.relu(x)
            heads = [
                relax.op.add(
                    relax.op.matmul(y, relax.const(rng.normal(size=(1024, o)).astype("float32"))),
                    relax.const(rng.normal(size=(o,)).astype("float32")),
                )
                for o in (20, 24)
            ]
            out = bb.emit_output(relax.op.concat(heads, axis=1))
        bb.emit_func_output(out)
    mod = bb.get()
    quants = {k: TensorQuant(0.05, "uint8") for k in find_sites(mod).tensors}
    limits, arithmetic = _weight_limits(dot), _arithmetic(dot)

    conv, records = quantize(mod, quants, limits, arithmetic=arithmetic, dense_as_conv=True)
    assert [(r["name"], r["arithmetic"], r.get("as"), r["weight_max"]) for r in records] == [
        ("dense_1", "int32", "conv2d 1x1", dot.weight_max)
    ]
    plain, _ = quantize(mod, quants, limits, arithmetic=arithmetic)  # int32 by matmul
    lowered = [lower(m) for m in (conv, plain)]
    assert any(ops[0] == "conv2d" for ops in lowered[0].kernel_ops.values())
    x = np.abs(rng.normal(size=(2, 1024))).astype("float32")
    results = [
        Executor(low.plan, CPUBackend(build_cpu(low.kernels, target)), low.constants).run([x])[0]
        for low in lowered
    ]
    np.testing.assert_array_equal(results[0], results[1])


def test_a_signed_input_without_padding_is_shifted_onto_the_dot_product():
    """A linear bottleneck (MobileNetV2's: a 1x1 without ReLU) is signed, and the
    ``u8 x s8`` dot product cannot read it as it is: the 1x1 that expands it reads
    ``q + 128`` in uint8 and its epilogue takes ``128 * sum(w[o])`` back. Its output is
    the generic int8 kernel's up to float32 rounding of the epilogue; the 3x3 with
    padding beside it (whose border would be shifted too) keeps its int8 input."""
    from tvm import relax

    from edgecv.board.runtime.cpu import CPUBackend
    from edgecv.board.runtime.executor import Executor
    from edgecv.codegen.llvm import build_cpu
    from edgecv.pipelines.int8 import _arithmetic, _shifted, _weight_limits

    target = load_profile("cpu").tvm_target()
    dot = dot_product_of(target)
    if dot is None or dot.signed_bytes:
        pytest.skip("this CPU has no u8 x s8 dot product")
    rng = np.random.RandomState(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 32, 8, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            weights = [rng.normal(size=(32, 32, k, k)).astype("float32") for k in (1, 1, 3)]
            bottleneck = relax.op.nn.conv2d(x, relax.const(weights[0]))
            expand = relax.op.nn.conv2d(bottleneck, relax.const(weights[1]))
            shift = relax.const(rng.normal(size=(1, 32, 1, 1)).astype("float32"))
            spatial = relax.op.nn.conv2d(bottleneck, relax.const(weights[2]), padding=1)
            out = bb.emit_output(
                relax.op.concat([relax.op.nn.relu(relax.op.add(expand, shift)), spatial], 1)
            )
        bb.emit_func_output(out)
    mod = bb.get()
    found = find_sites(mod)
    quants = {k: TensorQuant(0.05, "int8") for k in found.tensors}
    limits = _weight_limits(dot)
    shifted, records = quantize(
        mod,
        quants,
        limits,
        arithmetic=_arithmetic(dot),
        shift_signed=lambda site, quant: _shifted(site, quant, dot),
    )
    kinds = {r["name"]: (r["arithmetic"], r["input_dtype"], r.get("input_shift")) for r in records}
    assert kinds["conv2d_0"] == ("int32", "uint8", 128)
    assert kinds["conv2d_1"] == ("int32", "uint8", 128)  # the expansion: same tensor
    assert kinds["conv2d_2"] == ("float32", "int8", None)  # padded: int8, sums exact in float32
    # the same integers read as int8 by the generic int32 kernels
    generic, _ = quantize(mod, quants, limits)
    data = rng.normal(size=(1, 32, 8, 8)).astype("float32")
    outputs = []
    for quantized, block in ((shifted, dot.lanes), (generic, None)):
        lowered = lower(quantized, int8_block=block)
        reads = sorted(
            lowered.plan.buffers[s.args[0]].dtype
            for s in lowered.plan.steps
            if lowered.kernel_ops[s.kernel][0].startswith("conv2d")
        )
        # the two 1x1s read uint8 (shifted) on the dot product, the 3x3 int8 values
        assert reads == (["float32", "uint8", "uint8"] if block else ["int8", "int8", "int8"])
        library = build_cpu(lowered.kernels, target)
        executor = Executor(lowered.plan, CPUBackend(library), lowered.constants)
        outputs.append(executor.run([data])[0])
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=0, atol=1e-4 * np.abs(outputs[1]).max())
    assert np.abs(outputs[1]).max() > 0


def test_float32_arithmetic_on_integer_values_is_the_int32_result(small):
    """Operators whose integer sums stay below 2**24 may compute in float32 kernels:
    bit for bit what the int32 kernels give, for the whole network."""
    import tvm

    from edgecv.board.runtime.cpu import CPUBackend
    from edgecv.board.runtime.executor import Executor
    from edgecv.codegen.llvm import build_cpu

    mod = _imported(small[0])
    found = find_sites(mod)
    quants = {k: TensorQuant(0.02, "int8" if k == "t0" else "uint8") for k in found.tensors}
    target = tvm.target.Target(load_profile("cpu").tvm_target())
    x = small[2][:1]
    results = []
    for arithmetic in (None, lambda site, quant, limit: "float32"):
        quantized, records = quantize(mod, quants, 63, arithmetic=arithmetic)
        lowered = lower(quantized)
        conv_inputs = [
            lowered.plan.buffers[s.args[0]].dtype
            for s in lowered.plan.steps
            if lowered.kernel_ops[s.kernel][0] in ("conv2d", "matmul")
        ]
        if arithmetic is not None:
            # the depthwise convolution reads the integer tensor (a quarter of the
            # bytes) and casts as it loads; the others broadcast float32 values
            assert conv_inputs == ["float32", "uint8", "float32", "float32", "float32"]
        library = build_cpu(lowered.kernels, target)
        results.append(Executor(lowered.plan, CPUBackend(library), lowered.constants).run([x]))
    assert {r["arithmetic"] for r in records} == {"float32"}
    np.testing.assert_array_equal(results[0][0], results[1][0])


# --- the kernel ---------------------------------------------------------------------


def _int8_conv_kernel(
    channels,
    outputs,
    size,
    kernel,
    stride,
    int8_block=None,
    block=None,
    residual=False,
    pairs=False,
):
    """The fused kernel of conv2d(uint8, int8) + requantization, BatchNorm-like affine,
    ReLU and the next layer's uint8 quantization, as the INT8 step leaves it; with
    ``block``, in the graph tuner's packed layout ``NCHW{block}c`` (weights
    ``OIHW{block}i{block}o``, per-channel constants packed alike); ``residual``: a
    float32 input added before the ReLU (a residual block's last convolution); ``pairs``:
    lowered for 7-bit data (``int8_pairs``: packed weights in pairs of steps)."""
    from tvm import relax

    from edgecv.lowering.quantize import quantize_tensor

    R = relax.op
    rng = np.random.RandomState(0)
    bb = relax.BlockBuilder()
    weights = rng.randint(-63, 64, (outputs, channels, kernel, kernel)).astype("int8")
    scale = rng.uniform(2e-4, 4e-4, (1, outputs, 1, 1)).astype("float32")
    shift = rng.uniform(-1, 1, (1, outputs, 1, 1)).astype("float32")
    layouts = {}
    if block:
        weights = weights.reshape(outputs // block, block, channels // block, block, kernel, kernel)
        weights = weights.transpose(0, 2, 4, 5, 3, 1)
        scale, shift = (_pack(v, block) for v in (scale, shift))
        layout = f"NCHW{block}c"
        layouts = dict(data_layout=layout, kernel_layout=f"OIHW{block}i{block}o", out_layout=layout)
        x = relax.Var(
            "x", relax.TensorType(_pack(np.empty((1, channels, size, size)), block).shape, "uint8")
        )
    else:
        x = relax.Var("x", relax.TensorType((1, channels, size, size), "uint8"))
    w, scale, shift = (relax.const(np.ascontiguousarray(v)) for v in (weights, scale, shift))
    params = [x]
    if residual:
        out_size = (size + 2 * (kernel // 2) - kernel) // stride + 1
        shape = (1, outputs, out_size, out_size)
        if block:
            shape = (1, outputs // block, out_size, out_size, block)
        params.append(relax.Var("r", relax.TensorType(shape, "float32")))
    with bb.function("main", params):
        with bb.dataflow():
            y = R.nn.conv2d(x, w, strides=stride, padding=kernel // 2, out_dtype="int32", **layouts)
            y = R.add(R.multiply(R.astype(y, "float32"), scale), shift)
            y = R.nn.relu(R.add(y, params[1]) if residual else y)
            out = bb.emit_output(bb.emit(quantize_tensor(y, TensorQuant(0.02, "uint8"))))
        bb.emit_func_output(out)
    return lower(bb.get(), int8_block=int8_block, int8_pairs=pairs)


def _pack(x: np.ndarray, block: int) -> np.ndarray:
    """NCHW -> NCHW{block}c."""
    n, c, h, w = x.shape
    return np.ascontiguousarray(x.reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2))


# By default each way of packing on a 3x3 of stride 2, and each but the packed weights
# alone on a 1x1; `heavy` adds more shapes of the same ways (same code paths).
_heavy = pytest.mark.heavy


@pytest.mark.parametrize(
    "channels, outputs, size, kernel, stride, packed",
    [
        pytest.param(16, 32, 14, 3, 1, False, marks=_heavy),
        (32, 16, 9, 1, 1, False),
        (16, 24, 15, 3, 2, False),
        pytest.param(64, 64, 7, 1, 1, False, marks=_heavy),
        pytest.param(16, 32, 14, 3, 1, True, marks=_heavy),
        (32, 16, 7, 3, 2, True),
        pytest.param(16, 32, 14, 3, 1, "data", marks=_heavy),
        (32, 64, 7, 1, 1, "data"),
        (32, 16, 15, 3, 2, "data"),
        pytest.param(16, 32, 14, 3, 1, "pairs", marks=_heavy),
        (32, 64, 7, 1, 1, "pairs"),
        pytest.param(64, 64, 7, 3, 1, "pairs", marks=_heavy),
        (32, 16, 15, 3, 2, "pairs"),
    ],
)
def test_dot_product_kernel_matches_the_generic_one_bit_for_bit(
    channels, outputs, size, kernel, stride, packed
):
    """The Conv2DInt8 rule (vpmaddubsw/VNNI) against the generic int32 rules on the same
    fused kernel: integer sums are exact, so the uint8 outputs must be equal; 7-bit
    weights and full-range uint8 data never saturate the int16 pair sums. ``packed``:
    the weights packed for the instruction at build time (the deploy's way), else
    repacked as the kernel runs; ``pairs``: packed data of 7 bits (0..127) and weights
    packed in pairs of steps, summed in int16 two steps at a time where the CPU's dot
    product is ``vpmaddubsw`` (up to 2 x 2 x 127 x 63)."""
    import tvm

    from edgecv.board.runtime.cpu import CPUBackend
    from edgecv.board.runtime.executor import Executor
    from edgecv.schedules.cpu import Conv2DInt8, default_rules, safe_rule
    from edgecv.schedules.stage import ScheduleOrder

    target = load_profile("cpu").tvm_target()
    if dot_product_of(target) is None:
        pytest.skip("this CPU has no int8 dot-product instruction edgecv uses")
    dot = dot_product_of(target)
    lanes = dot.lanes
    block = lanes if packed in ("data", "pairs") else None
    pairs = packed == "pairs" and dot.pairs is not None
    lowered = _int8_conv_kernel(
        channels, outputs, size, kernel, stride, lanes if packed else None, block, pairs=pairs
    )
    weights = [b.shape for b in lowered.plan.buffers if b.kind == "const" and b.dtype == "int8"]
    in_pairs = pairs and kernel > 1  # a 1x1 keeps one step (sums_in_pairs)
    assert len(weights[0]) == (7 if in_pairs else 6 if packed else 4), weights
    order = ScheduleOrder(target, default_rules(target), safe_rule())
    ((name, func),) = [(gv.name_hint, f) for gv, f in lowered.kernels.functions.items()]
    chosen = next(c for c in order.attempts(func) if c.func is not None)
    assert chosen.rule == "cpu.Conv2DInt8"
    generic = [r for r in default_rules(target) if not isinstance(r, Conv2DInt8)]
    top = dot.data_max if packed == "pairs" else 255
    x = np.random.RandomState(1).randint(0, top + 1, (1, channels, size, size)).astype(np.uint8)
    x[0, 0, 0, :] = top  # the largest pair sums: 2 x 255 x 63 (2 x 2 x 127 x 63 in pairs)
    if block:
        x = _pack(x, block)
        assert name.startswith("fused_conv2d_int8_NCHWc"), name
    outputs_ = []
    for rules in (default_rules(target), generic):
        scheduled = ScheduleOrder(target, rules, safe_rule())
        done = next(c for c in scheduled.attempts(func) if c.func is not None).func
        library = tvm.tirx.build(
            tvm.IRModule({name: done.with_attr("global_symbol", name)}), target=target
        )
        executor = Executor(lowered.plan, CPUBackend(library), lowered.constants)
        outputs_.append(executor.run([x])[0])
    assert 0.1 < np.mean(outputs_[0] > 0) < 0.9, "the test output carries little signal"
    np.testing.assert_array_equal(outputs_[0], outputs_[1])


@pytest.mark.parametrize(
    "cpu, instructions, packed",
    # each CPU once, each packing at least once (pairs on AVX2 and on AVX-VNNI); the
    # rest of the product with -m heavy
    each_once(
        [
            ("znver3", {"vpmaddubsw", "vpmaddwd"}),
            ("skylake-avx512", {"vpmaddubsw", "vpmaddwd"}),
            ("znver4", {"vpdpbusd"}),
            ("alderlake", {"vpdpbusd"}),
            ("cortex-a78", {"sdot"}),
        ],
        ["pairs", False, True],
        ["pairs", "plain", "packed"],
    ),
)
def test_dot_product_instruction_is_chosen_from_the_target_features(cpu, instructions, packed):
    """Compiled (not run: this machine may lack them; the Cortex-A78's kernels run on
    the emulated board, tests/emulation) for each CPU, the kernel uses the dot product of
    its features: AVX2 and AVX-512 without VNNI pair bytes into int16 and words into
    int32, VNNI does both in one instruction, ARM's ``sdot`` too (signed bytes: the data
    is 7-bit). ``packed``: the kernel in ``NCHW{lanes}c`` (``NCHW16c`` on the AVX-512
    CPUs, ``NCHW4c`` on ARM)."""
    import tvm

    from edgecv.schedules.cpu import default_rules, safe_rule
    from edgecv.schedules.stage import ScheduleOrder

    triple = "aarch64-linux-gnu" if cpu.startswith("cortex") else "x86_64-linux-gnu"
    target = tvm.target.Target({"kind": "llvm", "mcpu": cpu, "mtriple": triple})
    dot = dot_product_of(target)
    lanes = dot.lanes
    pairs = packed == "pairs" and dot.pairs is not None
    lowered = _int8_conv_kernel(
        32, 32, 8, 3, 1, *((lanes, lanes) if packed else (None, None)), pairs=pairs
    )
    ((name, func),) = [(gv.name_hint, f) for gv, f in lowered.kernels.functions.items()]
    chosen = next(
        c
        for c in ScheduleOrder(target, default_rules(target), safe_rule()).attempts(func)
        if c.func is not None
    )
    assert chosen.rule == "cpu.Conv2DInt8"
    assert name.startswith("fused_conv2d_int8_NCHWc") == bool(packed)
    module = tvm.IRModule({name: chosen.func.with_attr("global_symbol", name)})
    assembly = tvm.tirx.build(module, target=target).inspect_source("asm")
    found = {i for i in ("vpdpbusd", "vpmaddubsw", "vpmaddwd", "sdot") if i in assembly}
    assert found == instructions
    if cpu == "alderlake":  # AVX-VNNI: the VEX form on ymm registers, no AVX-512
        assert re.search(r"\{vex\}\s+vpdpbusd", assembly) and "zmm" not in assembly
    # two steps' int16 pair sums added before one vpmaddwd (VNNI has no int16 step)
    assert ("vpaddw" in assembly) == pairs


@pytest.mark.parametrize("cpu", ["cortex-a57", "cortex-a72"])
def test_arm_cores_without_the_dot_product_keep_the_generic_rules(cpu):
    """The Jetson Nano's and the AI-Sage board's cores (ARMv8.0) have no ``sdot``: no
    dot product, so their INT8 convolutions keep the generic rules and 8-bit data."""
    import tvm

    target = tvm.target.Target({"kind": "llvm", "mcpu": cpu, "mtriple": "aarch64-linux-gnu"})
    assert dot_product_of(target) is None
    a78 = tvm.target.Target({"kind": "llvm", "mcpu": "cortex-a78", "mtriple": "aarch64-linux-gnu"})
    assert dot_product_of(a78).lanes == 4 and dot_product_of(a78).data_max == 127


def arm_cpu_profile(folder: Path, mcpu: str) -> Path:
    """A profile file, as a user writes one, for an aarch64 board's CPU alone
    (``runtime: cpu``): the way to an INT8 package for it."""
    cpu = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": mcpu}
    fields = {"name": f"{mcpu}_cpu", "description": f"a {mcpu} alone", "runtime": "cpu"}
    fields.update(target=cpu, host=cpu, gpu_ops=[], tuning_class=mcpu)
    path = folder / f"{mcpu}_cpu.json"
    path.write_text(json.dumps(fields))
    return path


def test_int8_for_a_cpu_without_a_dot_product_warns_that_it_is_slow(small, tmp_path):
    """An INT8 build for a CPU with no dot product edgecv uses (a profile file for the
    AI-Sage board's Cortex-A72) still builds, correct but in int32 lanes: the deploy
    says so, and what to do."""
    symbol, npy, _, _ = small
    profile = arm_cpu_profile(tmp_path, "cortex-a72")
    with pytest.warns(UserWarning, match=r"cortex-a72\) has no 8-bit dot-product") as caught:
        path = deploy(
            symbol,
            tmp_path / "pkg",
            str(profile),
            input_shape=SHAPE,
            options=_options(precision="int8", calibrate=npy),
        )
    assert "deploy without --precision int8" in str(caught[0].message)
    build = json.loads((path / "manifest.json").read_text())["build"]
    assert build["quantization"]["dot_product"] is None
    assert "cpu.Conv2DInt8" not in build["schedules"]["cpu"]["rules"]


@pytest.mark.parametrize("packed", [False, True])
def test_the_quantization_epilogue_rounds_in_vectors(packed):
    """The next layer's quantization (round half to even, clip, cast) after a residual
    add runs on vectors: TVM does not mark ``nearbyint`` vectorizable, and a vectorized
    loop holding one became scalar code (ResNet-50's last block of a stage: 1.42 ms,
    0.57 once vectorized); edgecv's CPU rules mark it."""
    import tvm

    from edgecv.schedules.cpu import schedule_cpu

    target = load_profile("cpu").tvm_target()
    if dot_product_of(target) is None:
        pytest.skip("this CPU has no int8 dot-product instruction edgecv uses")
    lanes = dot_product_of(target).lanes
    lowered = _int8_conv_kernel(32, 32, 14, 1, 1, lanes, lanes if packed else None, True)
    ((name, func),) = [(gv.name_hint, f) for gv, f in lowered.kernels.functions.items()]
    assert "round" in name and "add1_relu" in name, name  # residual add and quantization fused
    module = tvm.IRModule({name: schedule_cpu(func, target).with_attr("global_symbol", name)})
    assembly = tvm.tirx.build(module, target=target).inspect_source("asm")
    scalar = [i for i in ("vroundss", "vrndscaless") if i in assembly]
    vector = [i for i in ("vroundps", "vrndscaleps") if i in assembly]
    assert not scalar and vector, (scalar, vector)


# --- packages -------------------------------------------------------------------------


def test_int8_package_matches_fp32_within_the_quantization_step(small, int8_minmax):
    symbol, npy, inputs, fp32_path = small
    int8_path = int8_minmax
    fp32, int8 = edgecv.load(fp32_path), edgecv.load(int8_path)
    # min/max calibration on these very inputs: nothing is clipped, the derived bound holds
    errors = [
        assert_close_int8(int8.run(x[None])[0], fp32.run(x[None])[0], layers=5) for x in inputs
    ]
    assert max(errors) > 0, "int8 gave exactly the float32 outputs: was anything quantized?"
    print(f"int8 vs fp32: largest error {max(errors):.2%} of the output's scale (5 layers)")
    build = int8.manifest.build
    dot = dot_product_of(load_profile("cpu").tvm_target())
    if dot is not None:  # the 1x1 and the residual 3x3 (16 -> 16 channels, uint8 inputs)
        assert build["schedules"]["cpu"]["rules"].get("cpu.Conv2DInt8") == 2
        weight_max = {op["name"]: op["weight_max"] for op in build["quantization"]["operators"]}
        assert weight_max == {
            "conv2d_0": 127,
            "conv2d_1": 127,
            "conv2d_2": dot.weight_max,
            "conv2d_3": dot.weight_max,
            "dense_0": 127,
        }
        # the first (signed input), the depthwise and the small dense layer: their
        # integer sums held exactly in float32 kernels
        # 7-bit data for the 3x3 that sums two steps in int16 (vpmaddubsw), 8 for the 1x1
        input_max = {op["name"]: op["input_max"] for op in build["quantization"]["operators"]}
        assert (input_max["conv2d_2"], input_max["conv2d_3"]) == (255, dot.data_max)
        arithmetic = {op["name"]: op["arithmetic"] for op in build["quantization"]["operators"]}
        assert arithmetic == {
            "conv2d_0": "float32",
            "conv2d_1": "float32",
            "conv2d_2": "int32",
            "conv2d_3": "int32",
            "dense_0": "float32",
        }
    assert build["precision"] == "int8" and fp32.manifest.precision.value == "fp32"
    facts = build["quantization"]
    assert facts["quantized"] == {"conv2d": 4, "dense": 1} and facts["method"] == "minmax"
    assert [a["input"] for a in facts["adds_reading_8_bits"]] == ["t3"]  # the residual
    assert facts["calibration"]["inputs"] == 16 and not facts["calibration"]["reused"]
    files = int8.manifest.files
    assert files["calibration.json"] == sha256(Path(int8_path) / "calibration.json")
    saved = json.loads((Path(int8_path) / "calibration.json").read_text())
    assert saved["data"]["sha256"] == facts["calibration"]["sha256"]
    assert set(saved["tensors"]) == {"t0", "t1", "t2", "t3", "t4"}

    # redeploying with the same model and inputs reuses the statistics (no calibration
    # build: a quantize_model of its own runs in a second), another method applied
    mod = _imported(symbol)
    options = _options(
        precision="int8",
        calibrate=npy,
        calibration_method="percentile",
        calibration=read_calibration(npy, SHAPE, PREPROCESSING, None),
        previous_calibration=saved,
    )
    profile = load_profile("cpu")
    dot = dot_product_of(profile.tvm_target())
    _, again, files = quantize_model(mod, profile, options, lambda line: None, dot)
    assert again["calibration"]["reused"] and again["method"] == "percentile"
    resaved = json.loads(files["calibration.json"])
    assert resaved["tensors"]["t1"]["histogram"] == saved["tensors"]["t1"]["histogram"]
    # statistics of other inputs, or of another model, are not reused
    other = read_calibration(npy, SHAPE, PREPROCESSING, 8)
    assert other.sha256 != options.calibration.sha256
    assert reusable_statistics(saved, model_key(mod), other) is None
    assert reusable_statistics(saved, "0" * 16, options.calibration) is None
    assert reusable_statistics(saved, model_key(mod), options.calibration) is not None


def test_int8_convolutions_in_the_packed_layout_give_the_nchw_answers(small, int8_minmax, tmp_path):
    """``--layout packed``: the uint8 x int8 convolutions run in ``NCHW{lanes}c`` on
    the dot product (``conv2d_int8_NCHWc``, data never repacked) beside the packed
    float32 ones. Integer sums are exact in any order and the epilogues are the same
    float32 operations, so every output equals the NCHW package's bit for bit."""
    symbol, npy, inputs, _ = small
    dot = dot_product_of(load_profile("cpu").tvm_target())
    if dot is None:
        pytest.skip("this CPU has no int8 dot-product instruction edgecv uses")
    options = BuildOptions(
        layout="packed", tuning=None, precision="int8", calibrate=npy, calibration_method="minmax"
    )
    packages = {
        "NCHW": edgecv.load(int8_minmax),
        "packed": edgecv.load(
            deploy(symbol, tmp_path / "packed", input_shape=SHAPE, options=options)
        ),
    }
    packed = packages["packed"].manifest.build
    assert packed["layouts"]["chosen"] == f"NCHW{dot.lanes}c"
    kernels = packed["schedules"]["cpu"]["kernels"].values()
    # the 1x1 and the residual 3x3 on the dot product, the first and the depthwise
    # convolutions (float32 arithmetic) in the packed float32 rule
    rules = [k["rule"] for k in kernels if "conv2d_int8_NCHWc" in k["ops"]]
    assert rules == ["cpu.Conv2DInt8"] * 2, packed["schedules"]["cpu"]
    assert packed["schedules"]["cpu"]["rules"].get("cpu.PackedConv2D") == 2
    for x in inputs[:4]:
        np.testing.assert_array_equal(
            packages["packed"].run(x[None])[0], packages["NCHW"].run(x[None])[0]
        )


@pytest.mark.parametrize(
    "data, weight, groups, expected",
    [
        ((1, 16, 8, 8), (32, 16, 3, 3), 1, ("NCHW", "NCHW8c")),
        ((1, 12, 8, 8), (32, 12, 1, 1), 1, ("NCHW",)),  # input channels not in 8s
        ((1, 16, 8, 8), (20, 16, 1, 1), 1, ("NCHW",)),  # output channels not in 8s
        ((1, 16, 8, 8), (16, 1, 3, 3), 16, ("NCHW",)),  # depthwise: no int8 dot product
    ],
)
def test_graph_tuner_packs_int8_convolutions_only_for_the_dot_product(
    data, weight, groups, expected
):
    """The layout candidates of a uint8 x int8 convolution: the packing of the dot
    product's lanes where both channel counts divide into it; plain otherwise, and
    plain in a build without a dot product (nothing else packs integer convolutions)."""
    from tvm import relax

    from edgecv.graph_tuner.stage import conv_candidates

    x = relax.Var("x", relax.TensorType(data, "uint8"))
    w = relax.Var("w", relax.TensorType(weight, "int8"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        call = bb.normalize(relax.op.nn.conv2d(x, w, groups=groups, out_dtype="int32"))
        bb.emit_func_output(bb.emit(call))
    assert conv_candidates(["NCHW8c"], int8_block=8)(call) == expected
    assert conv_candidates(["NCHW8c"], int8_block=16)(call) == ("NCHW",)
    assert conv_candidates(["NCHW8c"])(call) == ("NCHW",)


def _imported(symbol: Path):
    from edgecv.frontend.mxnet.importer import from_mxnet
    from edgecv.frontend.mxnet.mxnet_graph import load_params, load_symbol

    params = symbol.with_name(symbol.name.replace("-symbol.json", "-0000.params"))
    return from_mxnet(load_symbol(symbol), load_params(params), {"data": SHAPE}).mod


def test_calibration_images_are_read_with_the_package_preprocessing(tmp_path):
    """Images are read as `edgecv run` reads them; more than --calibration-size: a
    seeded sample, the same on every deploy."""
    import cv2

    folder = tmp_path / "images"
    (folder / "sub").mkdir(parents=True)
    rng = np.random.RandomState(0)
    images = [rng.randint(0, 255, (30, 40, 3), np.uint8) for _ in range(5)]
    for i, image in enumerate(images):
        cv2.imwrite(str(folder / ("sub" if i % 2 else ".") / f"{i}.png"), image)
    (folder / "notes.txt").write_text("not an image")
    read = read_calibration(folder, SHAPE, PREPROCESSING, 3)
    assert (read.kind, len(read.arrays), read.available) == ("images", 3, 5)
    assert read.arrays.shape == (3, *SHAPE)
    every = read_calibration(folder, SHAPE, PREPROCESSING, None)
    expected = [preprocess(image, PREPROCESSING, SHAPE) for image in images]
    by_name = [expected[i] for i in (0, 2, 4, 1, 3)]  # sorted paths: 0, 2, 4, sub/1, sub/3
    np.testing.assert_array_equal(every.arrays, np.stack(by_name))
    assert read_calibration(folder, SHAPE, PREPROCESSING, 3).sha256 == read.sha256
    assert every.sha256 != read.sha256


@pytest.mark.heavy
def test_int8_package_calibrated_on_a_folder_of_images(small, tmp_path):
    """The whole way from a folder of images (the unit test above checks the reading)."""
    import cv2

    symbol = small[0]
    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.RandomState(0)
    for i in range(5):
        cv2.imwrite(str(folder / f"{i}.png"), rng.randint(0, 255, (30, 40, 3), np.uint8))
    path = deploy(
        symbol,
        tmp_path / "int8",
        input_shape=SHAPE,
        options=_options(precision="int8", calibrate=folder, calibration_size=3),
    )
    model = edgecv.load(path)
    facts = model.manifest.quantization["calibration"]
    assert (facts["kind"], facts["inputs"], facts["available"]) == ("images", 3, 5)
    # the first convolution's input is the preprocessed image: its range is that of
    # ImageNet normalization of pixels in [0, 255]
    saved = json.loads((Path(path) / "calibration.json").read_text())["tensors"]["t0"]
    assert -2.2 < saved["min"] < -1.5 and 2.0 < saved["max"] < 2.7
    assert model.predict(rng.randint(0, 255, (30, 40, 3), np.uint8))  # runs like any package


def test_trained_digits_int8_accuracy_within_one_point_of_fp32(tmp_path):
    digits = train_digits(tmp_path / "digits")
    npy = tmp_path / "train.npy"
    np.save(npy, digits.x_train)
    fp32 = edgecv.load(
        deploy(digits.symbol, tmp_path / "fp32", input_shape=digits.input_shape, options=_options())
    )
    int8 = edgecv.load(
        deploy(
            digits.symbol,
            tmp_path / "int8",
            input_shape=digits.input_shape,
            options=_options(precision="int8", calibrate=npy),
        )
    )
    acc32, predicted32 = accuracy(fp32, digits.x_test, digits.y_test)
    acc8, predicted8 = accuracy(int8, digits.x_test, digits.y_test)
    agreement = 100 * np.mean(predicted8 == predicted32)
    print(
        f"digits: fp32 {acc32:.2f}%, int8 {acc8:.2f}%, top-1 agreement {agreement:.2f}% "
        f"on {len(digits.y_test)} images"
    )
    assert acc32 > 95.0, "the network did not learn: the comparison would prove little"
    assert acc8 >= acc32 - 1.0
    assert np.mean(predicted8 == predicted32) >= 0.98
