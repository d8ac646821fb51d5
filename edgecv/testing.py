"""Numerical comparison used by the tests and benchmarks: one tolerance table by dtype.

Floats compare with ``|a - b| <= atol * scale + rtol * |b|`` where ``scale`` is the
largest magnitude of the reference (at least 1): a network's outputs differ from
MXNet's by accumulated rounding that grows with the size of its activations, not
per element. Integers (class ids, sort and NMS indices) must match exactly.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

# dtype -> (rtol, atol relative to the reference's scale)
TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-5, 1e-5),
    "float16": (1e-3, 1e-3),
    "bfloat16": (1e-2, 1e-2),
}


def assert_close(
    actual: np.ndarray,
    expected: np.ndarray,
    name: str = "output",
    loosen: float = 1.0,
    scale: float | None = None,
) -> None:
    """Assert ``actual`` matches ``expected`` per :data:`TOLERANCES` (exact for integers).

    ``loosen`` multiplies both tolerances; a caller that passes more than 1 must say why.
    ``scale`` raises the magnitude ``atol`` is relative to, for values computed from
    larger ones (box corners from pixel-sized anchors, which cancel to near 0).
    """
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    if not np.issubdtype(expected.dtype, np.floating):
        np.testing.assert_array_equal(actual, expected, err_msg=name)
        return
    rtol, atol = TOLERANCES[str(expected.dtype)]
    scale = max(1.0, scale or 0.0, float(np.abs(expected).max(initial=0.0)))
    np.testing.assert_allclose(
        actual, expected, rtol=rtol * loosen, atol=atol * loosen * scale, err_msg=name
    )


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
