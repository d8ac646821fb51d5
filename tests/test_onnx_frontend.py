"""The ONNX frontend before anything is compiled: the file (external data, not an ONNX
file), the opset, the operators (every unsupported one in one error, custom domains,
edgecv.register_op by op type), the inputs (initializers are not inputs; symbolic
dimensions need --input-shape) and the module it ends in (the same forms the MXNet
importer writes: no batch_norm triple, clip kept as clip). Graphs from tests/onnx_graphs.py."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import assert_one_error_line, run_cli
from onnx_graphs import classifier, custom_domain, save, with_ops
from tvm import relax, te

from edgecv.board.arguments import parse_shape
from edgecv.board.errors import EdgecvError, GraphError, ShapeError, UnsupportedOpsError
from edgecv.frontend.onnx.importer import from_onnx
from edgecv.frontend.onnx.model_file import load_model, max_opset
from edgecv.op_registry import register_op, unregister_op
from edgecv.source import OnnxSource, resolve_source


def _ops(mod) -> list[str]:
    """The operators of main's bindings, in order."""
    return [
        b.value.op.name
        for block in mod["main"].body.blocks
        for b in block.bindings
        if isinstance(b.value, relax.Call) and hasattr(b.value.op, "name")
    ]


def test_the_classifier_imports_in_the_pipelines_forms():
    imported = from_onnx(classifier(), {"x": (2, 3, 32, 32)})
    assert imported.input_names == ["x"]
    assert imported.input_shapes == {"x": (2, 3, 32, 32)}
    assert imported.output_names == ["probs"]
    assert imported.output_shapes == [(2, 10)]
    assert imported.output_dtypes == ["float32"]
    ops = _ops(imported.mod)
    assert "relax.nn.batch_norm" not in ops  # decomposed into per-channel arithmetic
    assert "relax.call_tir" not in ops  # Clip is R.clip, not TVM's topi maximum/minimum
    assert ops.count("relax.clip") == 3  # HardSwish, HardSigmoid, Clip
    assert ops.count("relax.nn.conv2d") == 6
    # weights are bound constants, not parameters of main
    assert [p.name for p in imported.mod["main"].params] == ["x"]


def test_symbolic_dimensions_are_named_in_one_error():
    with pytest.raises(ShapeError) as err:
        from_onnx(classifier(batch="N"), source="cls.onnx")
    message = str(err.value)
    assert "x [N, 3, 32, 32]" in message and "--input-shape x=1,3,32,32" in message
    # one shape for the one input, or by name, fills them
    assert from_onnx(classifier(batch="N"), (1, 3, 32, 32)).input_shapes["x"] == (1, 3, 32, 32)


def test_a_given_shape_keeps_the_graphs_rank_and_fixed_sizes():
    with pytest.raises(ShapeError, match="keep its rank and its fixed sizes"):
        from_onnx(classifier(batch="N"), {"x": (1, 3, 64, 64)})
    with pytest.raises(ShapeError, match="no input called"):
        from_onnx(classifier(batch="N"), {"image": (1, 3, 32, 32)})


def test_initializers_listed_as_inputs_are_weights():
    model = classifier(batch=1)
    model.graph.input.extend(
        [
            onnx.helper.make_tensor_value_info(w.name, w.data_type, w.dims)
            for w in model.graph.initializer
        ]
    )
    assert from_onnx(model).input_names == ["x"]


def test_every_unsupported_op_in_one_error_with_counts():
    model = with_ops(["Relu", "FooOp", "Relu", "FooOp", "BarOp"])
    with pytest.raises(UnsupportedOpsError) as err:
        from_onnx(model)
    assert err.value.counts == {"FooOp": 2, "BarOp": 1}
    assert "Supported ONNX ops:" in str(err.value) and "Conv" in str(err.value)


def test_a_custom_domain_op_is_unsupported_until_registered():
    with pytest.raises(UnsupportedOpsError) as err:
        from_onnx(custom_domain())
    assert err.value.counts == {"com.example::ScaledSoftsign": 1}


@pytest.fixture
def scaled_softsign():
    """``x / (1 + |x|) * alpha + w`` of the custom-domain node, registered by op type."""

    def compute(inputs, attrs):
        x, w = inputs
        assert attrs == {"alpha": 0.5, "mode": "soft"}  # ONNX attributes as Python values
        return te.compute(
            x.shape,
            lambda i, j: x[i, j] / (1 + te.abs(x[i, j])) * attrs["alpha"] + w[0, j],
            name="scaled_softsign",
        )

    def reference(x, w, alpha, mode):
        return x / (1 + np.abs(x)) * alpha + w

    register_op("ScaledSoftsign", compute, shape=lambda s, a: s[0], reference=reference)
    yield reference
    unregister_op("ScaledSoftsign")


def test_a_registered_custom_domain_op_converts(scaled_softsign):
    imported = from_onnx(custom_domain())
    funcs = [gv.name_hint for gv in imported.mod.functions]
    assert "ScaledSoftsign" in funcs
    assert imported.output_shapes == [(2, 8)]


def test_registering_a_standard_op_edgecv_converts_is_refused():
    register_op("Relu", lambda inputs, attrs: inputs[0], shape=lambda s, a: s[0])
    try:
        with pytest.raises(EdgecvError, match="converts this standard ONNX op already"):
            from_onnx(with_ops(["Relu"]))
    finally:
        unregister_op("Relu")


@pytest.mark.parametrize("opset", [6, max_opset() + 1])
def test_an_opset_the_frontend_does_not_import_is_one_line(opset):
    with pytest.raises(GraphError, match=f"opset {opset}; edgecv imports opsets 7 to"):
        from_onnx(with_ops(["Relu"], opset=opset), source="m.onnx")


def test_external_data_is_read_from_the_files_folder(tmp_path):
    path = save(classifier(batch=1), tmp_path / "cls.onnx", external=True)
    assert (tmp_path / "cls.data").stat().st_size > 4 * 16 * 27  # the weights went there
    source = resolve_source(str(path), tmp_path)
    assert isinstance(source, OnnxSource)
    assert source.import_model().output_shapes == [(1, 10)]
    (tmp_path / "cls.data").unlink()
    with pytest.raises(GraphError, match="external data files"):
        load_model(path)


def test_a_file_that_is_not_onnx_is_one_error(tmp_path):
    path = tmp_path / "bad.onnx"
    path.write_bytes(b"\x08\x01garbage that is not a protobuf" * 10)
    with pytest.raises(GraphError, match="not a readable ONNX file|holds no graph"):
        load_model(path)
    with pytest.raises(EdgecvError, match="does not exist"):
        load_model(tmp_path / "missing.onnx")


def test_the_source_records_the_file_by_absolute_path_and_hash(tmp_path):
    import hashlib

    path = save(classifier(batch=1), tmp_path / "cls.onnx")
    source = resolve_source(str(path), tmp_path)
    assert source.name == "cls" and source.task == "classification"
    assert source.record == {
        "kind": "onnx",
        "path": str(path.resolve()),
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "input_shapes": {"x": [1, 3, 32, 32]},
    }
    with pytest.raises(EdgecvError, match="--params does not apply"):
        resolve_source(str(path), tmp_path, params="w.params")


def test_a_named_input_shape_takes_any_rank():
    assert parse_shape("tokens=1,128") == ("tokens", (1, 128))
    assert parse_shape("1,3,224,224") == (1, 3, 224, 224)


def test_deploy_errors_are_one_line(tmp_path):
    """An unsupported op and a symbolic dimension, as the command line says them."""
    unsupported = save(with_ops(["Relu", "FooOp", "BarOp", "FooOp"]), tmp_path / "ops.onnx")
    line = assert_one_error_line(run_cli("deploy", unsupported, "--device", "cpu"), "`FooOp` (x2)")
    assert "`BarOp` (x1)" in line
    symbolic = save(classifier(batch="N"), tmp_path / "cls.onnx")
    assert_one_error_line(
        run_cli("deploy", symbolic, "--device", "cpu"), "--input-shape x=1,3,32,32"
    )


def test_the_two_frontends_stand_side_by_side():
    """The ONNX frontend imports nothing of the MXNet one but what both share (the module
    they end in, registered operators as PrimFuncs); nothing below the frontend imports
    either (tests/test_layering.py holds the floors)."""
    from test_layering import EDGECV, imports_of

    shared = {"edgecv.frontend.imported", "edgecv.frontend.registered"}
    for path in sorted((EDGECV / "frontend" / "onnx").glob("*.py")):
        frontend = {m for m in imports_of(path) if m.startswith("edgecv.frontend.")}
        mxnet_side = {
            m
            for m in frontend
            if not m.startswith("edgecv.frontend.onnx")
            and not any(m == s or m.startswith(s + ".") for s in shared)
        }
        assert not mxnet_side, (path.name, mxnet_side)
