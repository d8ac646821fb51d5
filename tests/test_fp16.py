"""``--precision fp16`` on GPU profiles: the per-operator table as the pass applies it,
fp16 kernels keyed apart from fp32 ones, a small seeded Gluon classifier deployed for
``deeplens`` in fp16 and run on Intel's OpenCL runtime against MXNet's float32 forward
pass (whole, and with its convolutions moved to the CPU, where they run in float32), the
package's size, and the refusals (``cpu``, a device without ``cl_khr_fp16``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import mxnet_forward, random_input
from tvm import relax

from edgecv.board.errors import EdgecvError
from edgecv.board.runtime.opencl_devices import opencl_devices
from edgecv.lowering.precision import HALF_PRECISION, to_half
from edgecv.testing import FP16_PER_LAYER, assert_close_fp16

SHAPE = (1, 3, 32, 32)
# The model below: conv 3->16 (K 27), depthwise 3x3 (K 9), conv 1x1 16->32 (K 16), conv
# 3x3 32->32 (K 288) with a residual add, global average pooling, dense 32->10 (K 32).
LAYERS, REDUCTION = 5, 288


def _intel() -> str:
    if not any(d.matches("intel(r) opencl") and d.fp16 for d in opencl_devices()):
        pytest.skip("no Intel OpenCL runtime with cl_khr_fp16 on this machine")
    return "intel"


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    """A seeded classifier with the operators the table decides about: convolutions,
    a depthwise one, BatchNorm, ReLU, a residual add, pooling and a dense layer."""
    from user_models import _export

    from edgecv._mxnet import import_mxnet

    mx = import_mxnet()
    nn = mx.gluon.nn

    class Small(mx.gluon.HybridBlock):
        def __init__(self):
            super().__init__()
            with self.name_scope():
                self.stem = nn.HybridSequential()
                self.stem.add(
                    nn.Conv2D(16, 3, padding=1, use_bias=False),
                    nn.BatchNorm(),
                    nn.Activation("relu"),
                    nn.MaxPool2D(2),
                )
                self.dw = nn.Conv2D(16, 3, padding=1, groups=16, use_bias=False)
                self.pw = nn.Conv2D(32, 1)
                self.conv = nn.Conv2D(32, 3, padding=1)
                self.pool = nn.GlobalAvgPool2D()
                self.dense = nn.Dense(10)

        def hybrid_forward(self, F, x):
            x = F.relu(self.pw(F.relu(self.dw(self.stem(x)))))
            x = F.relu(self.conv(x) + x)
            return self.dense(F.flatten(self.pool(x)))

    folder = tmp_path_factory.mktemp("fp16")
    symbol, params = _export(Small(), SHAPE, folder / "small", seed=3)
    return symbol, params, folder


def _manifest(package: Path) -> dict:
    return json.loads((package / "manifest.json").read_text())


def _params_bytes(package: Path) -> int:
    with np.load(package / "params.npz") as npz:
        return sum(npz[k].nbytes for k in npz.files)


@pytest.fixture(scope="module")
def packages(small_model):
    """The fp32 and fp16 packages of the small model for deeplens (NCHW: the graph
    tuner's measurements would only add time here)."""
    from edgecv.pipelines import BuildOptions

    def options(precision):
        return BuildOptions(tuning=None, layout="NCHW", precision=precision)

    symbol, params, folder = small_model
    from edgecv.deploy import deploy

    return {
        precision: deploy(
            str(symbol),
            folder / precision,
            profile="deeplens",
            params=str(params),
            input_shape=SHAPE,
            force=True,
            options=options(precision),
        )
        for precision in ("fp32", "fp16")
    }


def test_table_is_what_the_pass_does():
    """Before/after on a module holding one op of each kind the table decides: the
    convolution and dense in float16, leaky ReLU and pad following them, softmax, exp
    and sums in float32; inputs and outputs keep float32."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 8, 8), "float32"))
    w = relax.const(np.ones((4, 4, 3, 3), np.float32))
    with bb.function("main", [x]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, w, padding=1))
            leaky = bb.emit(relax.op.nn.leakyrelu(conv, 0.1))
            padded = bb.emit(relax.op.nn.pad(leaky, [0, 0, 0, 0, 1, 1, 1, 1]))
            total = bb.emit(relax.op.sum(padded, axis=[2, 3]))
            soft = bb.emit(relax.op.nn.softmax(total))
            out = bb.emit_output(relax.op.exp(soft))
        bb.emit_func_output(out)
    main = to_half(bb.get())["main"]
    dtypes = {}
    for binding in main.body.blocks[0].bindings:
        value = binding.value
        if isinstance(value, relax.Call) and value.op.name != "relax.astype":
            dtypes[value.op.name] = str(binding.var.ty.dtype)
    assert dtypes == {
        "relax.nn.conv2d": "float16",
        "relax.nn.leakyrelu": "float16",
        "relax.nn.pad": "float16",
        "relax.sum": "float32",
        "relax.nn.softmax": "float32",
        "relax.exp": "float32",
    }
    assert str(main.params[0].ty.dtype) == "float32" == str(main.body.body.ty.dtype)
    for op, (policy, why) in HALF_PRECISION.items():
        assert policy in ("fp16", "follow", "fp32") and why, op


def test_a_vision_operator_after_a_half_convolution_reads_float32():
    """Detectors' own operators are ``call_tir``s (box decode, MultiBox, NMS) fed by
    float16 convolutions: TVM's pass alone fails on them ("Expected TensorType, but got
    R.Callable"); converted, the call_tir reads a float32 cast of the convolution and
    its output feeds the next convolution as float16, with no float32-to-float32 cast."""
    from tvm import te

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 8, 8), "float32"))
    w = relax.const(np.ones((4, 4, 3, 3), np.float32))
    with bb.function("main", [x]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, w, padding=1))
            decoded = bb.emit_te(
                lambda a: te.compute(a.shape, lambda *i: a(*i) * 2.0, name="decode"), conv
            )
            out = bb.emit_output(relax.op.nn.conv2d(decoded, w, padding=1))
        bb.emit_func_output(out)
    main = to_half(bb.get())["main"]
    bindings = main.body.blocks[0].bindings
    kinds = [
        (b.value.op.name, str(b.var.ty.dtype), str(b.value.args[0].ty.dtype))
        if b.value.op.name == "relax.astype"
        else (b.value.op.name, str(getattr(b.var.ty, "dtype", "")))
        for b in bindings
    ]
    call_tir = next(b for b in bindings if b.value.op.name == "relax.call_tir")
    (arg,) = call_tir.value.args[1].fields
    assert str(arg.ty.dtype) == "float32" and str(call_tir.var.ty.dtype) == "float32", kinds
    assert [k for k in kinds if k[0] == "relax.nn.conv2d"] == [("relax.nn.conv2d", "float16")] * 2
    assert ("relax.astype", "float32", "float32") not in kinds, kinds


def test_fp16_kernels_are_keyed_apart_from_fp32_ones():
    """The graph tuner's cost cache and the tuning databases find a kernel by the
    structural hash of its PrimFunc, which holds its buffers' dtypes: the fp16 version
    of a convolution is another workload, not the fp32 record."""
    from edgecv.graph_tuner.costs import kernel_key
    from edgecv.lowering import lower
    from edgecv.schedules.database import workload

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 16, 16), "float32"))
    w = relax.const(np.ones((8, 8, 3, 3), np.float32))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv2d(x, w, padding=1))
        bb.emit_func_output(out)
    mod = bb.get()

    def conv_of(module):
        (func,) = [
            f for gv, f in lower(module).kernels.functions.items() if "conv2d" in gv.name_hint
        ]
        return func

    fp32, fp16 = conv_of(mod), conv_of(to_half(mod))
    assert kernel_key(fp32) != kernel_key(fp16)
    assert not workload(fp32).same_as(workload(fp16))
    import tvm_ffi

    assert tvm_ffi.structural_hash(workload(fp32)) != tvm_ffi.structural_hash(workload(fp16))


def test_fp16_package_matches_mxnet_on_intel_and_is_half_the_size(small_model, packages):
    from edgecv.board.model import load

    device = _intel()
    symbol, params, _ = small_model
    fp32, fp16 = _manifest(packages["fp32"]), _manifest(packages["fp16"])
    x = random_input(SHAPE, seed=1)
    ref = mxnet_forward(symbol, params, x)[0]
    out = load(packages["fp16"], on=device).run(x)[0]
    assert out.dtype == np.float32  # the outputs keep the model's dtype
    error = assert_close_fp16(out, ref, LAYERS, REDUCTION)
    assert error > 0  # computed in float16 for real, not float32 again
    assert int(np.argmax(out)) == int(np.argmax(ref))
    assert set(np.argsort(out[0])[-5:]) == set(np.argsort(ref[0])[-5:])
    # weights stored as float16: half the bytes; activations about half
    assert fp16["build"]["constant_bytes"] * 2 == fp32["build"]["constant_bytes"]
    assert _params_bytes(packages["fp16"]) * 2 == _params_bytes(packages["fp32"])
    # both plans at their live lower bound; fp16's peak is the float32 input of the
    # global average pool (the table's `mean`, 32 KB) beside its float16 source (16 KB):
    # 0.6 of fp32's peak (80 KB) in this 32x32 model
    for package in (fp32, fp16):
        assert package["build"]["intermediate_bytes"] == package["build"]["live_bytes_lower_bound"]
    ratio = fp16["build"]["intermediate_bytes"] / fp32["build"]["intermediate_bytes"]
    assert ratio <= 0.6, ratio
    # the manifest: precision per launch; the program needs cl_khr_fp16
    build = fp16["build"]
    assert build["precision"] == "fp16" and "cl_khr_fp16" in build["requires"]
    precisions = {launch["kernel"]: launch["precision"] for launch in build["fp16"]["launches"]}
    assert any("conv2d" in k and p == "fp16" for k, p in precisions.items())
    assert all(p == "fp32" for k, p in precisions.items() if k.startswith("mean"))
    # the fp32 package: as before (no fp16 facts, float32 throughout)
    assert fp32["build"]["precision"] == "fp32" and "fp16" not in fp32["build"]
    assert "cl_khr_fp16" not in fp32["build"]["requires"]
    plan = json.loads((packages["fp32"] / "plan.json").read_text())
    assert {b["dtype"] for b in plan["buffers"]} == {"float32"}


def test_launches_moved_to_the_cpu_run_in_float32(small_model):
    """--cpu-ops conv2d: the convolutions run on the CPU in float32 (their weights
    stored again as float32), the copies convert, and the answer still matches."""
    from edgecv.board.model import load
    from edgecv.pipelines import BuildOptions

    device = _intel()
    symbol, params, folder = small_model
    from edgecv.deploy import deploy

    options = BuildOptions(cpu_ops=["conv2d"], tuning=None, layout="NCHW", precision="fp16")
    package = deploy(
        str(symbol),
        folder / "fp16-cpu",
        profile="deeplens",
        params=str(params),
        input_shape=SHAPE,
        force=True,
        options=options,
    )
    build = _manifest(package)["build"]
    cpu = [launch for launch in build["fp16"]["launches"] if launch["device"] == "cpu"]
    assert cpu and all(launch["precision"] == "fp32" for launch in cpu)
    copies = build["placement"]["copies"]
    assert any(c.get("to_dtype") == "float32" and c["dtype"] == "float16" for c in copies)
    plan = json.loads((package / "plan.json").read_text())
    assert "float16" not in {b["dtype"] for b in plan["buffers"] if b["device"] == "cpu"}
    with np.load(package / "params.npz") as npz:
        assert any(k.endswith("_fp32") and npz[k].dtype == np.float32 for k in npz.files)
    x = random_input(SHAPE, seed=2)
    ref = mxnet_forward(symbol, params, x)[0]
    out = load(package, on=device).run(x)[0]
    assert_close_fp16(out, ref, LAYERS, REDUCTION)


def test_fp16_package_refused_on_a_device_without_fp16(packages, capsys):
    """PoCL has no cl_khr_fp16: loading there is refused with one line naming the
    extension and the device that has it."""
    from edgecv.cli import main

    if not any(d.matches("portable computing") and not d.fp16 for d in opencl_devices()):
        pytest.skip("no OpenCL device without cl_khr_fp16 (PoCL) on this machine")
    x = packages["fp16"].parent / "x.npy"
    np.save(x, random_input(SHAPE))
    assert main(["run", str(packages["fp16"]), "--on", "portable", "--input", str(x)]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("edgecv: error:"), lines
    assert "cl_khr_fp16" in lines[0]
    if any(d.fp16 for d in opencl_devices()):
        assert "devices that have it" in lines[0]


def test_cpu_profile_refuses_fp16_with_one_line(tmp_path, capsys):
    from edgecv.cli import main

    argv = [
        "deploy",
        str(tmp_path / "none-symbol.json"),
        "--device",
        "cpu",
        "--precision",
        "fp16",
        "-o",
        str(tmp_path / "out"),
    ]
    assert main(argv) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("edgecv: error:"), lines
    assert "--precision fp16" in lines[0] and "GPU profiles" in lines[0]
    assert not (tmp_path / "out").exists()


def test_check_on_a_device_without_fp16_is_said_before_compiling():
    from edgecv.pipelines import BuildOptions
    from edgecv.pipelines.fp16 import check_request
    from edgecv.profiles import load_profile

    if not any(d.matches("portable computing") and not d.fp16 for d in opencl_devices()):
        pytest.skip("no OpenCL device without cl_khr_fp16 (PoCL) on this machine")
    said: list[str] = []
    options = BuildOptions(precision="fp16", check_on="portable computing")
    check_request(options, load_profile("aisage"), said.append)
    assert len(said) == 1 and "cl_khr_fp16" in said[0], said
    with pytest.raises(EdgecvError, match="GPU profiles"):
        check_request(options, load_profile("cpu"), said.append)


def test_explain_says_what_fp16_saves_and_which_launches_run_in_it(packages):
    from edgecv.board.manifest import Manifest
    from edgecv.pipelines.fp16 import explain_lines

    fp32_lines = explain_lines(Manifest(_manifest(packages["fp32"])))
    assert len(fp32_lines) == 1 and "--precision fp16 would store the weights" in fp32_lines[0]
    fp16_lines = explain_lines(Manifest(_manifest(packages["fp16"])))
    assert fp16_lines[0].startswith("precision: fp16")
    assert any("mean" in line for line in fp16_lines[1:])  # global pooling stays fp32


def _depth_and_reduction(symbol: Path, params: Path) -> tuple[int, int]:
    """Weighted layers (convolutions and dense: every one, a bound on the longest path)
    and the most products one of their outputs sums (in_channels/groups * kh * kw)."""
    from edgecv.frontend.mxnet.mxnet_graph import load_params

    text = Path(symbol).read_text()
    layers = text.count('"op": "Convolution"') + text.count('"op": "FullyConnected"')
    weights = [w for name, w in load_params(params).items() if name.endswith("weight")]
    return layers, max(int(np.prod(w.shape[1:])) for w in weights if w.ndim in (2, 4))


@pytest.mark.heavy
@pytest.mark.parametrize("name", ["mobilenet1.0", "squeezenet1.0", "resnet50_v1"])
def test_zoo_classifier_in_fp16_agrees_with_mxnet_on_intel(exported, tmp_path, name):
    """A zoo classifier (seeded random weights) deployed for deeplens in fp16 against
    MXNet float32 on two sample photos: the logits within the fp16 bound, and top-1 the
    same wherever MXNet's top two lie further apart than that bound (random weights give
    nearly flat logits; a closer pair may swap under any rounding)."""
    from edgecv.board.model import load

    device = _intel()
    model = exported(name)
    package = deploy_fp16(model, tmp_path / name)
    layers, reduction = _depth_and_reduction(model.symbol_path, model.params_path)
    deployed = load(package, on=device)
    for seed in (1, 2):
        x = random_input(model.input_shape, seed=seed)
        ref = mxnet_forward(model.symbol_path, model.params_path, x)[0]
        out = deployed.run(x)[0]
        error = assert_close_fp16(out, ref, layers, reduction, f"{name}, photo {seed}")
        top2 = np.sort(ref[0])[-2:]
        if (top2[1] - top2[0]) / np.abs(ref).max() > 2 * error:
            assert int(np.argmax(out)) == int(np.argmax(ref)), f"{name}, photo {seed}"


@pytest.mark.heavy
@pytest.mark.parametrize(
    "name",
    [
        "ssd_512_mobilenet1.0_voc",
        "ssd_512_resnet50_v1_voc",
        "yolo3_mobilenet1.0_coco",
        "yolo3_darknet53_voc",
    ],
)
def test_zoo_detector_convolutions_in_fp16_agree_with_mxnet_on_intel(exported, tmp_path, name):
    """A zoo detector (seeded random weights) in fp16 on deeplens: every convolution's
    output against MXNet float32 on a sample photo (edgecv.testing.probe), each within
    the fp16 bound of the float16 layers up to it. The vision operators after them run in
    float32 (tested exact against MXNet in tests/ops/); the detections themselves are not
    compared: random weights amplify a one-step input change about 200x into the SSD boxes
    (MXNet's own drift), so float16's rounding moves them by tens of pixels."""
    assert_convolutions_within_fp16_bound(exported(name), _intel(), tmp_path, minimum=40)


def assert_convolutions_within_fp16_bound(model, device: str, work, minimum: int) -> None:
    """Every convolution of ``model`` deployed for deeplens in fp16 against MXNet float32
    on a sample photo (edgecv.testing.probe): at least ``minimum`` of them, each within
    the fp16 bound of the float16 layers up to it."""
    from edgecv.pipelines import BuildOptions
    from edgecv.testing import probe_divergence

    _, reduction = _depth_and_reduction(model.symbol_path, model.params_path)
    report = probe_divergence(
        model.symbol_path,
        model.params_path,
        {"data": random_input(model.input_shape, seed=1)},
        "deeplens",
        ops=["Convolution"],
        options=BuildOptions(tuning=None, layout="NCHW", precision="fp16"),
        on=device,
        trials=1,
        workdir=work,
    )
    assert len(report.stages) >= minimum, [s.name for s in report.stages]
    for depth, stage in enumerate(report.stages, start=1):  # at most `depth` layers deep
        assert stage.scale > 0, stage
        bound = FP16_PER_LAYER[1] * depth * float(np.sqrt(reduction / 6 + 2))
        error = stage.max_abs_diff / stage.scale
        assert error <= bound, f"{stage.name}: fp16 error {error:.3%} > {bound:.3%}"


def deploy_fp16(model, folder) -> Path:
    """``model`` (an exported zoo model) deployed for deeplens in fp16, NCHW, untuned."""
    from edgecv.deploy import deploy
    from edgecv.pipelines import BuildOptions

    return deploy(
        str(model.symbol_path),
        folder,
        profile="deeplens",
        params=str(model.params_path),
        input_shape=model.input_shape,
        options=BuildOptions(tuning=None, layout="NCHW", precision="fp16"),
    )


@pytest.mark.parametrize("devices", [("gpu", "cpu"), ("cpu", "gpu")])
def test_copies_convert_and_a_weight_read_on_both_devices_is_stored_for_each(devices):
    """A float16 weight read by a GPU and a CPU launch (in either order): the GPU reads
    it as stored, the CPU a float32 copy under its own name; the tensor between the
    launches is float16 on the GPU, float32 on the CPU, and the copy converts."""
    from edgecv.board.plan import Buffer, Plan, Step
    from edgecv.fallback import Placement, insert_copies, widened_constants

    buffers = [
        Buffer(0, (4,), "float16", "input", "x"),
        Buffer(1, (4,), "float16", "const", "w"),
        Buffer(2, (4,), "float16", "temp"),
        Buffer(3, (4,), "float16", "temp"),
    ]
    steps = [Step("first", [0, 1, 2]), Step("second", [2, 1, 3])]
    plan, copies = insert_copies(
        Plan(buffers, steps, [0], [3]), Placement(list(devices)), widen_on_cpu=True
    )
    consts = {(b.device, b.name, b.dtype) for b in plan.buffers if b.kind == "const"}
    assert consts == {("gpu", "w", "float16"), ("cpu", "w_fp32", "float32")}
    for b in plan.buffers:
        assert b.dtype == ("float32" if b.device == "cpu" else "float16"), b
    (copy,) = [c for c in copies if c.source == 2]
    assert {copy.dtype, copy.to_dtype} == {"float16", "float32"}
    params = widened_constants(plan, {"w": np.arange(4, dtype=np.float16)})
    assert params["w"].dtype == np.float16 and params["w_fp32"].dtype == np.float32
    np.testing.assert_array_equal(params["w_fp32"], np.arange(4))


# One member of each GluonCV family beyond the seven (tests/test_zoo_families.py's list)
FAMILY_SAMPLE = [
    ("pose", "simple_pose_resnet18_v1b"),
    ("segmentation", "fastscnn_citys"),
    ("other", "monodepth2_resnet18_kitti_mono_640x192"),
    ("centernet", "center_net_resnet18_v1b_voc"),
    ("yolo3", "yolo3_mobilenet0.25_coco"),
    ("rcnn", "faster_rcnn_resnet50_v1b_voc"),
]
DETECTOR_FAMILIES = {"centernet", "yolo3", "rcnn"}


@pytest.mark.heavy
@pytest.mark.parametrize(("family", "name"), FAMILY_SAMPLE, ids=[f for f, _ in FAMILY_SAMPLE])
def test_family_member_in_fp16_agrees_with_mxnet_on_intel(exported, tmp_path, family, name):
    """A member of each other zoo family (seeded random weights) deployed for deeplens in
    fp16 on Intel's runtime against MXNet float32: a dense predictor's outputs (pose
    heatmaps, segmentation logits, depth) within the fp16 bound; a detector's every
    convolution within the bound of the float16 layers up to it, as for the zoo detectors
    above (their detections move with rounding on random weights)."""
    from edgecv.board.model import load
    from edgecv.frontend.mxnet import zoo

    assert zoo.family_of(name).family == family
    device = _intel()
    model = exported(name)
    if family in DETECTOR_FAMILIES:
        assert_convolutions_within_fp16_bound(model, device, tmp_path, minimum=10)
        return
    layers, reduction = _depth_and_reduction(model.symbol_path, model.params_path)
    x = random_input(model.input_shape, seed=1)
    package = deploy_fp16(model, tmp_path / name)
    outputs = load(package, on=device).run(x)
    refs = mxnet_forward(model.symbol_path, model.params_path, x)
    assert len(outputs) == len(refs)
    for i, (out, ref) in enumerate(zip(outputs, refs, strict=True)):
        assert_close_fp16(out, ref, layers, reduction, f"{name} output {i}")
