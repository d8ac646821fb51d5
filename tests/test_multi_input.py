"""Models with several inputs (a tracker's template and search image, as GluonCV's
SiamRPN): deployed from a symbol file with one ``NAME=N,C,H,W`` per input, run with one
``--input`` per input, compared with MXNet's forward pass on the same weights; the
commands that feed one image refuse them with one line."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from helpers import assert_one_error_line, run_cli

from edgecv._mxnet import import_mxnet
from edgecv.cli import main
from edgecv.testing import assert_close

mx = import_mxnet()
S = mx.sym
SHAPES = {"data0": (1, 3, 8, 8), "data1": (1, 3, 12, 12)}


@pytest.fixture(scope="module")
def two_inputs(tmp_path_factory):
    """A template and a search image through their own convs, then correlated as a
    conv of the search features with the template's (as a Siamese tracker does)."""
    template = S.Convolution(S.var("data0"), kernel=(3, 3), num_filter=4, name="t")
    search = S.Convolution(S.var("data1"), kernel=(3, 3), num_filter=4, name="s")
    pooled = S.Pooling(template, kernel=(6, 6), pool_type="avg", global_pool=True)
    net = S.Group([S.broadcast_mul(S.relu(search), pooled), S.sigmoid(template)])
    arg_shapes, _, _ = net.infer_shape(**SHAPES)
    rng = np.random.RandomState(0)
    params = {
        n: mx.nd.array(rng.normal(size=s).astype(np.float32))
        for n, s in zip(net.list_arguments(), arg_shapes, strict=True)
        if n not in SHAPES
    }
    prefix = tmp_path_factory.mktemp("two") / "two"
    net.save(f"{prefix}-symbol.json")
    mx.nd.save(f"{prefix}-0000.params", {f"arg:{k}": v for k, v in params.items()})
    return prefix


def in_process(capsys, *args) -> subprocess.CompletedProcess:
    """``edgecv ARGS`` run by ``edgecv.cli.main`` in this process (the refusals and the
    deploy here are about what the command does, not the process: the two-input run is a
    real one)."""
    capsys.readouterr()
    try:
        code = main([str(a) for a in args])
    except SystemExit as exited:  # argparse's refusals
        code = exited.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def shape_args() -> list[str]:
    return [a for n, s in SHAPES.items() for a in ("--input-shape", f"{n}={','.join(map(str, s))}")]


def test_a_two_input_model_deploys_and_runs_as_mxnet(two_inputs, tmp_path, capsys):
    symbol = f"{two_inputs}-symbol.json"
    package = tmp_path / "pkg"
    # NCHW: the graph tuner's layouts are not what this test is about (tests/graph_tuner)
    result = in_process(capsys, "deploy", symbol, "-o", package, *shape_args(), "--layout", "NCHW")
    assert result.returncode == 0, result.stderr
    rng = np.random.RandomState(1)
    xs = [rng.normal(size=s).astype(np.float32) for s in SHAPES.values()]
    for i, x in enumerate(xs):
        np.save(tmp_path / f"x{i}.npy", x)
    out = tmp_path / "out.npz"
    args = ["--input", tmp_path / "x0.npy", "--input", tmp_path / "x1.npy", "--output", out]
    result = run_cli("run", package, *args)
    assert result.returncode == 0, result.stderr
    net = mx.gluon.SymbolBlock.imports(symbol, list(SHAPES), f"{two_inputs}-0000.params")
    reference = [r.asnumpy() for r in net(*[mx.nd.array(x) for x in xs])]
    ours = np.load(out)
    for i, want in enumerate(reference):
        assert_close(ours[f"output{i}"], want, f"output {i}")
    # one image or one tensor cannot feed it: one clear line each
    one = ["--input", tmp_path / "x0.npy"]
    refused = assert_one_error_line(in_process(capsys, "run", package, *one), "2")
    assert "--input was given 1 time" in refused
    refused = assert_one_error_line(in_process(capsys, "bench", package), "data0, data1")
    assert "takes 2 inputs" in refused


def test_input_shapes_must_name_every_input_or_none(two_inputs, tmp_path, capsys):
    symbol = f"{two_inputs}-symbol.json"
    mixed = ["--input-shape", "data0=1,3,8,8", "--input-shape", "1,3,12,12"]
    result = in_process(capsys, "deploy", symbol, "-o", tmp_path / "a", *mixed)
    assert "NAME=N,C,H,W per input" in assert_one_error_line(result, "--input-shape")
    wrong = ["--input-shape", "data0=1,3,8,8", "--input-shape", "image=1,3,12,12"]
    result = in_process(capsys, "deploy", symbol, "-o", tmp_path / "b", *wrong)
    assert_one_error_line(result, "image")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
