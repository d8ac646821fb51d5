"""What several tests share that is not a fixture: synthetic detector inputs, and the
``edgecv`` command line run as a user runs it with its one-line errors checked.
Imported by name (``from helpers import run_cli``): tests/ is on the path of the suite,
as it is for conftest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np


def detector_inputs(rng, batch, classes, n, levels=None):
    """Softmax-like class probabilities, regressions, anchors inside the unit square."""
    if levels is None:
        cls = rng.uniform(0, 1, (batch, classes, n))
    else:  # few distinct values: equal scores and equal best classes
        cls = rng.choice(levels, (batch, classes, n))
    cls = (cls / cls.sum(1, keepdims=True)).astype(np.float32)
    loc = (rng.standard_normal((batch, n * 4)) * 0.5).astype(np.float32)
    centre, size = rng.uniform(0.1, 0.9, (1, n, 2)), rng.uniform(0.05, 0.5, (1, n, 2))
    anchors = np.concatenate([centre - size / 2, centre + size / 2], -1).astype(np.float32)
    return cls, loc, anchors


def run_cli(*args, cwd: str | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run ``python -m edgecv.cli ARGS`` as a user would, in a fresh process importing this
    checkout of edgecv; returns the finished process (stdout/stderr as text)."""
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "edgecv.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
    )


def cli_here(capfd, *args) -> subprocess.CompletedProcess:
    """``edgecv ARGS`` through ``edgecv.cli.main`` in this process, as the console script
    calls it: its exit status and what it wrote to stdout and stderr (file descriptors
    included), shaped as :func:`run_cli`'s result. For what the command does; what the
    process does (its imports, what prints on exit) is ``run_cli``'s, a few seconds more."""
    import warnings

    from edgecv.cli import main

    capfd.readouterr()
    formatwarning = warnings.formatwarning  # main() sets the user's warning format
    try:
        code = main([str(a) for a in args])
    except SystemExit as exit_:  # argparse's refusals
        code = exit_.code
    finally:
        warnings.formatwarning = formatwarning
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(["edgecv", *map(str, args)], code, out, err)


def assert_one_error_line(result: subprocess.CompletedProcess, fragment: str) -> str:
    """A CLI failure: non-zero exit, exactly one ``edgecv: error:`` line holding
    ``fragment``, no traceback. Returns that line."""
    err = result.stderr
    assert result.returncode != 0, (result.returncode, result.stdout, err)
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("edgecv: error:")]
    assert len(lines) == 1, err
    assert fragment in err, (fragment, err)
    return lines[0]
