"""`edgecv deploy --layout ... --explain` as a user runs it: the command's own entry
(`edgecv.cli.main`) in this process, and a fresh process for an argument refused at
the command line (its exit status and one line)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import mxnet_forward, needs_pocl
from helpers import run_cli
from small_model import SHAPE, export_small_model

from edgecv.cli import main
from edgecv.testing import assert_close


def test_deploy_layout_auto_explains_and_matches_mxnet(tmp_path, monkeypatch, capsys):
    """`--layout auto --explain` with a `--layout-budget` small enough that the first
    batch spends it: the plan and its costs explained, the costs it predicted said and
    marked, and the package computes what MXNet does."""
    from edgecv.graph_tuner import measure

    monkeypatch.setenv("EDGECV_TUNING_DIR", str(tmp_path / "tuning"))
    monkeypatch.setattr(measure, "FIRST_BATCH", 6)
    symbol, params = export_small_model(tmp_path / "small")
    shape = ",".join(map(str, SHAPE))
    package = str(tmp_path / "pkg")
    argv = ["deploy", str(symbol), "--input-shape", shape, "-o", package, "--layout", "auto"]
    assert main([*argv, "--explain", "--layout-budget", "0.001"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "layouts (auto): dp over 5 convolutions, predicted" in out, out
    assert "transforms inserted:" in out and "costs:" in out, out
    assert "predicted" in out.split("costs:", 1)[1].splitlines()[0], out  # the sources
    assert any(
        line.rstrip().endswith("predicted)") or " predicted," in line
        for line in out.splitlines()
        if line.startswith("  lv")
    ), out
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    ran = main(
        ["run", package, "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npz")]
    )
    assert ran == 0, capsys.readouterr().err
    assert_close(np.load(tmp_path / "y.npz")["output0"], mxnet_forward(symbol, params, x)[0])


def test_deploy_rejects_an_unknown_layout(tmp_path):
    """In a fresh process: argparse's exit status and its one line."""
    done = run_cli("deploy", "mobilenet", "--layout", "NHWC", "-o", tmp_path / "p")
    assert done.returncode == 2 and "invalid choice: 'NHWC'" in done.stderr, done.stderr


@pytest.mark.parametrize("budget", ["-5", "0", "soon"])
def test_deploy_rejects_a_budget_that_is_not_positive_seconds(tmp_path, budget, capsys):
    with pytest.raises(SystemExit) as done:
        main(["deploy", "mobilenet", "--layout-budget", budget, "-o", str(tmp_path / "p")])
    err = capsys.readouterr().err
    assert done.value.code == 2, err
    assert "--layout-budget" in err and "positive seconds or `none`" in err
    assert not (tmp_path / "p").exists()


@needs_pocl()
def test_deploy_on_names_the_device_that_times_the_layouts_and_checks_the_program(
    tmp_path, monkeypatch, capsys
):
    """`--on portable`: a profile without Intel subgroups (aisage) is measured and
    checked on PoCL, not on the first device found (Intel's runtime). A budget the
    first batch (4 kernels) spends: which device measures shows in that batch, and
    the rest are predicted instead of each compiled and timed on PoCL."""
    from edgecv.graph_tuner import measure

    monkeypatch.setenv("EDGECV_TUNING_DIR", str(tmp_path / "tuning"))
    monkeypatch.setattr(measure, "FIRST_BATCH", 4)
    symbol, _ = export_small_model(tmp_path / "small")
    shape = ",".join(map(str, SHAPE))
    argv = ["deploy", str(symbol), "--input-shape", shape, "--device", "aisage"]
    argv += ["--on", "portable", "--layout-budget", "0.001"]
    status = main([*argv, "-o", str(tmp_path / "pkg")])
    err = capsys.readouterr().err
    assert status == 0, err
    assert "graph tuner: measuring" in err, err
    measuring = [line for line in err.splitlines() if "graph tuner: measuring" in line]
    assert all(":Portable Computing Language:" in line for line in measuring), measuring
    assert "compiling the OpenCL program on `portable`" in err, err


def test_deploy_on_a_device_that_is_not_here_is_refused(tmp_path, capsys):
    argv = ["deploy", "mobilenet", "--device", "aisage", "--on", "no-such-gpu"]
    status = main([*argv, "-o", str(tmp_path / "p")])
    err = capsys.readouterr().err
    assert status == 2, err
    assert "no OpenCL device matches `no-such-gpu`" in err, err
    assert "devices here:" in err, err
    assert not (tmp_path / "p").exists()
