"""Bad input gives one clear message (and, from the CLI, a non-zero exit, no traceback)."""

from __future__ import annotations

import json
import shutil

import cv2
import numpy as np
import pytest
from helpers import assert_one_error_line, cli_here, run_cli

from edgecv._mxnet import import_mxnet
from edgecv.board.errors import (
    ConversionError,
    GraphError,
    ModelNotFoundError,
    PackageError,
    ParamsError,
    ProfileError,
    ShapeError,
    UnsupportedOpsError,
)
from edgecv.cli import main
from edgecv.frontend.mxnet.importer import from_mxnet
from edgecv.frontend.mxnet.mxnet_graph import load_params, load_symbol, parse_symbol
from edgecv.testing import assert_close

mx = import_mxnet()
S = mx.sym


def small_net():
    d = S.var("data")
    conv = S.Convolution(d, kernel=(3, 3), num_filter=4, name="conv")
    # flatten written out: MXNet's ONNX exporter (edgecv bench's baselines) reads a
    # missing `flatten` as False, unlike MXNet itself
    return S.FullyConnected(S.relu(conv), num_hidden=3, flatten=True, name="fc")


def small_params(shape=(1, 2, 5, 5)):
    sym = small_net()
    arg_shapes, _, _ = sym.infer_shape(data=shape)
    rng = np.random.RandomState(0)
    return {
        n: rng.normal(size=s).astype(np.float32)
        for n, s in zip(sym.list_arguments(), arg_shapes, strict=True)
        if n != "data"
    }


def test_unsupported_ops_listed_together_with_counts():
    d = S.var("data")
    raw = json.loads(S.Group([S.relu(d), S.relu(d), S.sigmoid(d), S.exp(d)]).tojson())
    for node, op in zip(raw["nodes"][1:], ["Custom", "Custom", "_contrib_Proposal"], strict=False):
        node["op"] = op
    graph = parse_symbol(json.dumps(raw))
    with pytest.raises(UnsupportedOpsError) as err:
        from_mxnet(graph, {}, {"data": (1, 3, 4, 4)})
    message = str(err.value)
    assert "`Custom` (x2)" in message and "`_contrib_Proposal` (x1)" in message
    assert "Convolution" in message  # lists what is supported
    assert err.value.counts == {"Custom": 2, "_contrib_Proposal": 1}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"nodes": [', "not valid JSON"),
        ("[1, 2]", "not an MXNet symbol graph"),
        (
            '{"nodes": [{"op": "null", "name": "data", "inputs": []}, '
            '{"op": "relu", "name": "r", "inputs": [[5, 0, 0]]}], "heads": [[1, 0, 0]]}',
            "does not come before",
        ),
        ('{"nodes": [{"op": "null", "name": "data", "inputs": []}], "heads": []}', "no outputs"),
    ],
)
def test_malformed_symbol(text, fragment):
    with pytest.raises(GraphError, match=fragment):
        parse_symbol(text)


def test_truncated_symbol_file(tmp_path):
    path = tmp_path / "m-symbol.json"
    text = small_net().tojson()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(GraphError, match="truncated"):
        load_symbol(path)


def test_missing_and_misshaped_params():
    graph = parse_symbol(small_net().tojson())
    params = small_params()
    missing = dict(params)
    del missing["fc_weight"]
    with pytest.raises(ParamsError, match="fc_weight"):
        from_mxnet(graph, missing, {"data": (1, 2, 5, 5)})
    wrong = dict(params)
    wrong["conv_weight"] = np.zeros((4, 3, 3, 3), np.float32)
    with pytest.raises((ParamsError, ConversionError), match="conv"):
        from_mxnet(graph, wrong, {"data": (1, 2, 5, 5)})


def test_input_shape_incompatible_with_params():
    graph = parse_symbol(small_net().tojson())
    with pytest.raises(ConversionError, match="fc"):
        from_mxnet(graph, small_params(), {"data": (1, 2, 7, 7)})


def test_corrupt_params_file(tmp_path):
    path = tmp_path / "bad.params"
    path.write_bytes(b"not a params file at all")
    with pytest.raises(ParamsError, match="cannot read params"):
        load_params(path)


def test_unknown_names():
    from edgecv.frontend.mxnet.zoo import resolve
    from edgecv.profiles import load_profile

    with pytest.raises(ModelNotFoundError, match="ssd_mobilenet"):
        resolve("ssd_mobilnet")
    with pytest.raises(ProfileError, match="deeplens"):
        load_profile("deeplense")


@pytest.fixture(scope="module")
def tiny_package(tmp_path_factory):
    root = tmp_path_factory.mktemp("pkg")
    prefix = root / "tiny"
    sym = small_net()
    sym.save(f"{prefix}-symbol.json")
    mx.nd.save(
        f"{prefix}-0000.params", {f"arg:{k}": mx.nd.array(v) for k, v in small_params().items()}
    )
    assert (
        main(
            ["deploy", f"{prefix}-symbol.json", "--input-shape", "1,2,5,5", "-o", str(root / "pkg")]
        )
        == 0
    )
    return root / "pkg"


def _cli_error_cases(tiny_package, tmp_path):
    """(argv, expected fragment, extra environment) of bad inputs the CLI must refuse."""
    cases = [
        (["deploy", "not_a_model"], "unknown model", {}),
        (["deploy", "mobilenet", "--device", "nope"], "unknown device profile", {}),
        (["run", tmp_path / "missing"], "does not exist", {}),
    ]
    text = small_net().tojson()
    truncated = tmp_path / "cut-symbol.json"
    truncated.write_text(text[: len(text) // 3])
    cases.append((["deploy", truncated, "--params", tiny_package / "params.npz"], "truncated", {}))
    other = tmp_path / "other-0000.params"
    mx.nd.save(str(other), {"arg:fc_weight": mx.nd.zeros((3, 4))})
    (tmp_path / "other-symbol.json").write_text(text)
    cases.append(
        (
            ["deploy", tmp_path / "other-symbol.json", "--input-shape", "1,2,5,5"],
            "not in the params",
            {},
        )
    )
    bad_input = tmp_path / "x.npy"
    np.save(bad_input, np.zeros((1, 2, 6, 6), np.float32))
    cases.append((["run", tiny_package, "--input", bad_input], "has shape (1, 2, 6, 6)", {}))
    # A truncated params file: MXNet's reason, without MXNet's traceback text.
    cut = tmp_path / "cut-0000.params"
    whole = tmp_path / "whole.params"
    mx.nd.save(str(whole), {k: mx.nd.array(v) for k, v in small_params().items()})
    cut.write_bytes(whole.read_bytes()[:200])
    (tmp_path / "cut2-symbol.json").write_text(text)
    cases.append(
        (
            ["deploy", tmp_path / "cut2-symbol.json", "--params", cut],
            "Invalid NDArray file format",
            {},
        )
    )
    # Profiles TVM or edgecv reject (TVM raises ValueError on these).
    for i, change in enumerate(
        [
            {"target": {"kind": "no_such_target"}},
            {"runtime": "opencl", "gpu": {"intel_subgroups": True, "subgroup_size": 3}},
        ]
    ):
        raw = {
            "name": f"broken{i}",
            "runtime": "cpu",
            "target": {"kind": "llvm"},
            "host": {"kind": "llvm"},
            **change,
        }
        path = tmp_path / f"broken{i}.json"
        path.write_text(json.dumps(raw))
        cases.append(
            (["deploy", tmp_path / "other-symbol.json", "--device", path], "malformed", {})
        )
    # No C compiler for the CPU kernel library: export_library fails.
    cases.append(
        (
            [
                "deploy",
                f"{tiny_package.parent}/tiny-symbol.json",
                "--input-shape",
                "1,2,5,5",
                "-o",
                tmp_path / "nocc",
            ],
            "cannot link the CPU kernels",
            {"CXX": "/nonexistent/g++", "CC": "/nonexistent/cc"},
        )
    )
    photo = tmp_path / "photo.png"
    cv2.imwrite(str(photo), np.zeros((8, 8, 3), np.uint8))
    cases.append(
        (["run", tiny_package, photo, "--save", tmp_path / "out.unknownext"], "no writer", {})
    )
    cases.append(
        (["run", tiny_package, photo, "--save", tmp_path / "no" / "out.jpg"], "does not exist", {})
    )
    cases.append(
        (
            ["run", tiny_package, "--input", bad_input, "--output", tmp_path / "no" / "y.npz"],
            "does not exist",
            {},
        )
    )
    return cases


def test_cli_errors_exit_nonzero_with_one_line(tiny_package, tmp_path, monkeypatch, capfd):
    """Each case through main() in this process; the first also as its own process (the
    exit status a shell sees)."""
    cases = _cli_error_cases(tiny_package, tmp_path)
    argv, fragment, _ = cases[0]
    assert_one_error_line(run_cli(*argv), fragment)
    for argv, fragment, env in cases:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        result = cli_here(capfd, *argv)
        for key in env:
            monkeypatch.delenv(key)
        assert_one_error_line(result, fragment)
    assert not (tmp_path / "nocc").exists()  # the failed deploy left nothing behind
    assert not (tmp_path / "out.unknownext").exists()


def test_verbose_shows_the_traceback(tmp_path, capfd):
    result = run_cli("-v", "run", tmp_path / "missing")
    assert result.returncode == 2
    assert "Traceback" in result.stderr and "PackageError" in result.stderr
    assert result.stderr.count("edgecv: error:") == 1
    after = cli_here(capfd, "run", tmp_path / "missing", "-v")  # -v after the command too
    assert "Traceback" in after.stderr


def test_unsupported_ops_come_before_missing_params(tmp_path, capfd):
    d = S.var("data")
    raw = json.loads(S.FullyConnected(S.relu(d), num_hidden=3, name="fc").tojson())
    raw["nodes"][1]["op"] = "Custom"
    (tmp_path / "odd-symbol.json").write_text(json.dumps(raw))  # no params file beside it
    result = cli_here(capfd, "deploy", tmp_path / "odd-symbol.json")
    line = assert_one_error_line(result, "`Custom` (x1)")
    assert "--params" not in line


def test_graph_without_parameters_deploys_without_params_and_says_the_shape(tmp_path, capfd):
    d = S.var("data")
    S.Pooling(S.relu(d), kernel=(2, 2), stride=(2, 2), pool_type="avg").save(
        str(tmp_path / "pool-symbol.json")
    )
    # in this process: what the deploy does and says, not the process (the next tests')
    result = cli_here(capfd, "deploy", tmp_path / "pool-symbol.json", "-o", tmp_path / "pkg")
    assert result.returncode == 0, result.stderr
    assert "assuming data 1x3x224x224" in result.stderr
    from edgecv.board.model import load

    x = np.random.RandomState(0).normal(size=(1, 3, 224, 224)).astype(np.float32)
    expected = mx.nd.Pooling(
        mx.nd.relu(mx.nd.array(x)), kernel=(2, 2), stride=(2, 2), pool_type="avg"
    ).asnumpy()
    assert_close(load(tmp_path / "pkg").run(x)[0], expected)


def test_graph_with_parameters_and_no_params_file_names_them(tmp_path, capfd):
    small_net().save(str(tmp_path / "bare-symbol.json"))
    result = cli_here(capfd, "deploy", tmp_path / "bare-symbol.json")
    assert_one_error_line(result, "conv_weight")


def test_package_checks(tiny_package, tmp_path):
    from edgecv.board.model import load

    corrupt = tmp_path / "corrupt"
    shutil.copytree(tiny_package, corrupt)
    with open(corrupt / "params.npz", "r+b") as f:
        f.seek(100)
        f.write(b"\x00\x01\x02")
    with pytest.raises(PackageError, match="corrupt"):
        load(corrupt)
    missing = tmp_path / "missing"
    shutil.copytree(tiny_package, missing)
    (missing / "plan.json").unlink()
    with pytest.raises(PackageError, match="missing plan.json"):
        load(missing)
    old = tmp_path / "old"
    shutil.copytree(tiny_package, old)
    manifest = json.loads((old / "manifest.json").read_text())
    manifest["versions"]["edgecv"] = "0.0.1"
    (old / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PackageError, match="redeploy"):
        load(old)


def test_run_rejects_wrong_input_shape(tiny_package):
    from edgecv.board.model import load

    model = load(tiny_package)
    with pytest.raises(ShapeError, match="--input-shape"):
        model.run(np.zeros((1, 2, 6, 6), np.float32))


def _only_error_line(result) -> str:
    """The CLI's one error line, and nothing else on stderr but ``[edgecv]`` stage lines
    (no traceback text, no warning a library prints on its way out)."""
    line = assert_one_error_line(result, "edgecv: error:")
    others = [s for s in result.stderr.splitlines() if not s.startswith("[edgecv] ")]
    assert others == [line], result.stderr
    return line


def test_unreadable_params_file_gives_mxnet_reason_in_one_line(tmp_path):
    small_net().save(str(tmp_path / "tiny-symbol.json"))
    whole = tmp_path / "whole.params"
    mx.nd.save(str(whole), {f"arg:{k}": mx.nd.array(v) for k, v in small_params().items()})
    data = whole.read_bytes()
    (tmp_path / "tiny-0000.params").write_bytes(data[: len(data) // 2])  # found beside it
    result = run_cli(
        "deploy", tmp_path / "tiny-symbol.json", "--input-shape", "1,2,5,5", "-o", tmp_path / "pkg"
    )
    line = _only_error_line(result)
    assert "tiny-0000.params: Invalid NDArray file format (truncated" in line, line
    # The operators are still checked first, before the params file is read.
    raw = json.loads(small_net().tojson())
    next(n for n in raw["nodes"] if n["op"] == "relu")["op"] = "Custom"
    (tmp_path / "odd-symbol.json").write_text(json.dumps(raw))
    result = run_cli(
        "deploy",
        tmp_path / "odd-symbol.json",
        "--params",
        tmp_path / "tiny-0000.params",
        "-o",
        tmp_path / "pkg",
    )
    assert "`Custom` (x1)" in _only_error_line(result)
    # A zoo model's params file goes through Gluon: the same reason, the same one line.
    result = run_cli(
        "deploy",
        "mobilenet",
        "--random-weights",
        "--params",
        tmp_path / "tiny-0000.params",
        "-o",
        tmp_path / "pkg",
    )
    assert "Invalid NDArray file format (truncated" in _only_error_line(result)


def test_params_of_another_graph_give_one_line(tmp_path):
    small_net().save(str(tmp_path / "tiny-symbol.json"))
    d = S.var("data")
    other = S.FullyConnected(
        S.Convolution(d, kernel=(1, 1), num_filter=8, name="stem"), num_hidden=10, name="head"
    )
    shapes, _, _ = other.infer_shape(data=(1, 3, 8, 8))
    arrays = {
        f"arg:{n}": mx.nd.zeros(s)
        for n, s in zip(other.list_arguments(), shapes, strict=True)
        if n != "data"
    }
    mx.nd.save(str(tmp_path / "other.params"), arrays)
    result = run_cli(
        "deploy",
        tmp_path / "tiny-symbol.json",
        "--params",
        tmp_path / "other.params",
        "--input-shape",
        "1,2,5,5",
    )
    line = _only_error_line(result)
    assert "conv_weight, conv_bias, fc_weight, fc_bias" in line and "not in the params" in line
    # Gluon's refusal of a zoo model's params: its first sentence, not its links.
    result = run_cli(
        "deploy",
        "mobilenet",
        "--random-weights",
        "--params",
        tmp_path / "other.params",
        "-o",
        tmp_path / "pkg",
    )
    line = _only_error_line(result)
    assert "does not hold weights for mobilenet1.0: Parameter 'conv0_weight' is missing" in line
    assert "http" not in line


def test_failed_conversion_prints_only_the_error_line(tmp_path):
    # A node that fails inside the importer's Relax function: TVM's builder must not
    # warn about blocks left open after the error line.
    raw = json.loads(S.Activation(S.var("data"), act_type="relu", name="act").tojson())
    raw["nodes"][1]["attrs"]["act_type"] = "selu"
    (tmp_path / "selu-symbol.json").write_text(json.dumps(raw))
    result = run_cli(
        "deploy", tmp_path / "selu-symbol.json", "--input-shape", "1,3,4,4", "-o", tmp_path / "pkg"
    )
    assert "act_type `selu` is not supported" in _only_error_line(result)
    assert not (tmp_path / "pkg").exists()
