"""Operators registered from a user's file (edgecv.register_op, `deploy --ops`): the
three examples of demos/custom_ops/ (a capsule convolution, a dilated depth-to-space, a
parameterized hard-swish), exported from Gluon as MXNet `Custom` ops, deployed for `cpu`,
`deeplens` (Intel's OpenCL runtime) and `aisage` (PoCL) against their NumPy references;
a model mixing them with built-in layers against MXNet (whose Custom forward is the same
reference); edgecv.testing.check_op; `edgecv tune --ops`; a HybridBlock class as the
name; the errors of bad registrations and bad `--ops` files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import mxnet_forward, needs_pocl
from test_opencl import device_or_skip

import edgecv
from edgecv.board.errors import ConversionError, UnsupportedOpsError
from edgecv.cli import main
from edgecv.deploy import deploy
from edgecv.frontend.mxnet.importer import from_mxnet
from edgecv.frontend.mxnet.mxnet_graph import parse_symbol
from edgecv.op_registry import RegistrationError, load_ops, registered_op, unregister_op
from edgecv.pipelines import BuildOptions
from edgecv.testing import assert_close, check_op
from edgecv.testing.op_check import _one_node_symbol

DEMO = Path(__file__).resolve().parent.parent / "demos" / "custom_ops"
OPS = load_ops(DEMO / "my_ops.py")  # as `deploy --ops` does; the models import it again
sys.path.insert(0, str(DEMO))
import custom_op_models  # noqa: E402

# model -> (its registered op, the attributes its block writes into the Custom node)
EXAMPLES = {
    "capsule": ("capsule_conv2d", {"stride": 1, "pad": 1}),
    "depth_to_space": ("dilated_depth_to_space", {"block": 2, "dilation": 2}),
    "hard_swish": ("hard_swish", {"alpha": 0.2, "beta": 0.5}),
}
SAFE_RULES = {"cpu.SafeParallel", "gpu.SafeFallback"}
_EXPORTED: dict = {}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("custom_op_models")

    def get(name):
        if name not in _EXPORTED:
            _EXPORTED[name] = custom_op_models.export_model(name, folder)
        return _EXPORTED[name]

    return get


def fast(layout: str = "NCHW") -> BuildOptions:
    """No tuning records, no separate device check (the run compiles the program)."""
    return BuildOptions(check_on=None, tuning=None, layout=layout)


def test_the_demo_file_registers_the_three_examples():
    assert OPS == ["capsule_conv2d", "dilated_depth_to_space", "hard_swish"]
    assert all(registered_op(n).reference is not None for n in OPS)


@pytest.mark.parametrize(
    ("profile", "on"),
    [
        ("cpu", None),
        ("deeplens", "intel(r) opencl"),
        pytest.param("aisage", "pocl", marks=needs_pocl()),
    ],
    ids=["cpu", "deeplens", "aisage"],
)
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_deploys_and_matches_its_reference(models, name, profile, on, tmp_path):
    if on:
        device_or_skip(on)
    symbol, params, shape = models(name)
    op, attrs = EXAMPLES[name]
    host = "native" if profile == "aisage" else None  # its fallback kernels run here
    path = deploy(
        symbol,
        tmp_path / "pkg",
        profile,
        params=params,
        input_shape=shape,
        options=fast(),
        host=host,
    )
    x = np.random.RandomState(3).normal(size=shape).astype(np.float32)
    (got,) = edgecv.load(path, on=on).run(x)
    weights = list(np.load(path / "params.npz").values()) if params else []
    assert_close(got, registered_op(op).reference(x, *weights, **attrs), f"{op} on {profile}")
    # the kernel is named after the op and scheduled by a default rule, not the safe one
    build = json.loads((path / "manifest.json").read_text())["build"]
    (kernels,) = build["schedules"].values()
    (kernel,) = kernels["kernels"].values()
    assert kernel["ops"] == [op] and kernel["rule"] not in SAFE_RULES, kernel


def test_mixed_model_matches_mxnet_with_layout_transforms_around_the_op(models, tmp_path):
    """The stem conv runs packed (NCHW16c-like), the capsule conv in the layout it was
    written for, with a layout transform between; depth-to-space and hard-swish fuse."""
    symbol, params, shape = models("mixed")
    path = deploy(
        symbol, tmp_path / "pkg", "cpu", params=params, input_shape=shape, options=fast("packed")
    )
    x = np.random.RandomState(5).normal(size=shape).astype(np.float32)
    assert_close(edgecv.load(path).run(x)[0], mxnet_forward(symbol, params, x)[0], "mixed")
    build = json.loads((path / "manifest.json").read_text())["build"]
    ops = list(build["kernel_ops"].values())
    assert ["capsule_conv2d"] in ops
    assert any({"dilated_depth_to_space", "hard_swish"} <= set(k) for k in ops), ops
    assert any("layout_transform" in op for k in ops for op in k), ops
    assert not SAFE_RULES & set(build["schedules"]["cpu"]["rules"]), build["schedules"]


@pytest.mark.heavy
def test_mixed_model_on_intel_opencl_matches_mxnet(models, tmp_path):
    device_or_skip("intel(r) opencl")
    symbol, params, shape = models("mixed")
    path = deploy(symbol, tmp_path / "pkg", "deeplens", params=params, input_shape=shape)
    x = np.random.RandomState(5).normal(size=shape).astype(np.float32)
    got = edgecv.load(path, on="intel").run(x)[0]
    assert_close(got, mxnet_forward(symbol, params, x)[0], "mixed on deeplens")


def test_cpu_ops_moves_a_registered_op_to_the_cpu(models, tmp_path):
    device_or_skip("intel(r) opencl")
    symbol, params, shape = models("hard_swish")
    options = BuildOptions(cpu_ops=["hard_swish"], check_on=None, tuning=None, layout="NCHW")
    path = deploy(symbol, tmp_path / "pkg", "deeplens", input_shape=shape, options=options)
    x = np.random.RandomState(6).normal(size=shape).astype(np.float32)
    assert_close(
        edgecv.load(path, on="intel").run(x)[0],
        registered_op("hard_swish").reference(x, alpha=0.2, beta=0.5),
    )
    placement = json.loads((path / "manifest.json").read_text())["build"]["placement"]
    assert placement["launches"]["cpu"] == 1, placement


@needs_pocl()
def test_check_op_on_every_local_device():
    errors = check_op("dilated_depth_to_space", [(1, 18, 6, 4)], {"block": 3, "dilation": 2})
    assert "cpu" in errors and len(errors) >= 2, errors  # cpu and the OpenCL devices


def test_check_op_fails_on_a_wrong_reference():
    def compute(inputs, attrs):
        from tvm import te

        (x,) = inputs
        return te.compute(x.shape, lambda *i: x(*i) * 2.0, name="twice")

    edgecv.register_op(
        "twice_wrong", compute, shape=lambda s, a: s[0], reference=lambda x: x * 2.001
    )
    try:
        with pytest.raises(AssertionError, match="twice_wrong on cpu"):
            check_op("twice_wrong", [(3, 8)], devices=["cpu"])
    finally:
        unregister_op("twice_wrong")


def test_register_op_refuses_bad_registrations():
    shape = lambda s, a: s[0]  # noqa: E731
    with pytest.raises(RegistrationError, match="not an op name"):
        edgecv.register_op("bad name", lambda i, a: i[0], shape=shape)
    with pytest.raises(RegistrationError, match="compute must be a function"):
        edgecv.register_op("fine_name", "x * 2", shape=shape)
    with pytest.raises(RegistrationError, match="already registered by hard_swish"):
        edgecv.register_op("hard_swish", lambda i, a: i[0], shape=shape)
    assert registered_op("fine_name") is None


def test_a_hybrid_block_class_registers_under_the_op_type_it_exports(tmp_path):
    """register_op(Block, ...) keys the op by the block's `op_type`: the Custom node its
    export writes is converted with the registered compute and matches the reference."""
    from tvm import te

    mx = custom_op_models.mx
    reference = lambda x, scale=1.0: (x * scale + 1).astype(x.dtype)  # noqa: E731

    class Affine(mx.gluon.HybridBlock):
        op_type = "block_affine"

        def hybrid_forward(self, F, x):
            return F.Custom(x, op_type=self.op_type, scale=2.5)

    def compute(inputs, attrs):
        (x,) = inputs
        return te.compute(x.shape, lambda *i: x(*i) * float(attrs["scale"]) + 1.0)

    custom_op_models._custom("block_affine", reference, ["data"], lambda s, a: s[0])
    assert edgecv.register_op(Affine, compute, shape=lambda s, a: s[0]) is compute
    try:
        assert registered_op("block_affine").compute is compute
        shape = (1, 3, 4, 5)
        symbol, _ = custom_op_models.export(Affine(), shape, tmp_path / "affine")
        path = deploy(symbol, tmp_path / "pkg", "cpu", input_shape=shape, options=fast())
        x = np.random.RandomState(8).normal(size=shape).astype(np.float32)
        assert_close(edgecv.load(path).run(x)[0], reference(x, 2.5), "block_affine")
    finally:
        unregister_op("block_affine")

    class NoOpType(mx.gluon.HybridBlock):
        pass

    with pytest.raises(RegistrationError, match="NoOpType.*attribute `op_type"):
        edgecv.register_op(NoOpType, compute, shape=lambda s, a: s[0])
    with pytest.raises(RegistrationError, match="not a Gluon HybridBlock"):
        edgecv.register_op(dict, compute, shape=lambda s, a: s[0])


def graph_of(op_type: str, inputs: int = 1, **attrs):
    return parse_symbol(_one_node_symbol(op_type, inputs, attrs))


def test_an_unregistered_custom_op_is_named_by_its_op_type():
    with pytest.raises(
        UnsupportedOpsError, match=r"Custom\(op_type=capsule_routing\).*register_op"
    ):
        from_mxnet(graph_of("capsule_routing"), {}, {"in0": (1, 4)})


def test_a_compute_that_disagrees_with_its_shape_rule_is_named():
    from tvm import te

    edgecv.register_op(
        "shape_liar",
        lambda i, a: te.compute((2, 2), lambda *j: i[0][0, 0]),
        shape=lambda s, a: s[0],
    )
    try:
        with pytest.raises(ConversionError, match=r"shape_liar.*built \(2, 2\).*say \(1, 4\)"):
            from_mxnet(graph_of("shape_liar"), {}, {"in0": (1, 4)})
    finally:
        unregister_op("shape_liar")


def test_deploy_ops_explain_names_the_op_and_its_rule(models, tmp_path, capsys):
    symbol, _, shape = models("hard_swish")
    code = main(
        [
            "deploy",
            str(symbol),
            "--ops",
            str(DEMO / "my_ops.py"),
            "--explain",
            "--no-tuning",
            "--layout",
            "NCHW",
            "-o",
            str(tmp_path / "pkg"),
            "--input-shape",
            ",".join(map(str, shape)),
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "registered capsule_conv2d, dilated_depth_to_space, hard_swish" in out.err
    assert "hard_swish (hard_swish): cpu.Injective" in out.out, out.out


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (None, "no such file"),
        ("import edgecv\nraise ValueError('bad alpha')\n", "raised ValueError: bad alpha (line 2)"),
        ("x = 1\n", "registers no operator"),
    ],
    ids=["missing", "raises", "registers-nothing"],
)
def test_a_bad_ops_file_is_one_error_line(tmp_path, capsys, content, fragment):
    ops = tmp_path / "my_ops.py"
    if content is not None:
        ops.write_text(content)
    assert main(["deploy", "whatever-symbol.json", "--ops", str(ops)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("edgecv: error:")]
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in err, err


def test_tune_ops_tunes_a_registered_op_and_deploy_applies_the_record(models, tmp_path):
    """`edgecv tune --ops` makes the registered op's kernel a task like any other: its
    records are keyed by the PrimFunc's structure, so deploy replays them (and `--ship`
    would ship them). The CLI takes 4-D input shapes, so the hard-swish model."""
    symbol, _, shape = models("hard_swish")
    db = tmp_path / "db"
    status = main(
        [
            "tune",
            str(symbol),
            "--ops",
            str(DEMO / "my_ops.py"),
            "--input-shape",
            ",".join(map(str, shape)),
            "--layout",
            "NCHW",
            "--trials",
            "3",
            "--db",
            str(db),
        ]
    )
    assert status == 0
    meta_path = db / "edgecv_database.json"
    meta = json.loads(meta_path.read_text())
    entries = [e for e in meta["workloads"].values() if "hard_swish" in str(e["kernels"])]
    assert entries and all(e["default_s"] for e in entries), meta["workloads"]
    # as if the search had won: deploy then replays the record instead of the default rule
    for entry in meta["workloads"].values():
        entry["best_s"] = entry["default_s"] / 2
    meta_path.write_text(json.dumps(meta))
    path = deploy(
        symbol,
        tmp_path / "pkg",
        "cpu",
        input_shape=shape,
        options=BuildOptions(check_on=None, tuning=[str(db)], layout="NCHW"),
    )
    build = json.loads((path / "manifest.json").read_text())["build"]
    (kernels,) = build["schedules"].values()
    (kernel,) = kernels["kernels"].values()
    assert kernel["ops"] == ["hard_swish"] and kernel["rule"] == "tuned", kernel
    x = np.random.RandomState(7).normal(size=shape).astype(np.float32)
    expected = registered_op("hard_swish").reference(x, alpha=0.2, beta=0.5)
    assert_close(edgecv.load(path).run(x)[0], expected, "tuned hard_swish")
