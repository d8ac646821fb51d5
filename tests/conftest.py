"""Shared fixtures: zoo models exported once per test session, with seeded random weights."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from edgecv._mxnet import import_mxnet

# pytest-xdist's workers (addopts: -n 2) import this file too, with the environment of
# the process that started them: XDIST_WORKER names one, and is absent in that process.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
# Compiled-program cache of this test session (of this worker) only: tests see cold and
# warm starts they caused themselves, never entries left by earlier runs, the other
# worker or the user.
os.environ["EDGECV_CACHE_DIR"] = tempfile.mkdtemp(prefix="edgecv-test-cache-")
# Nor the user's own tuning records: deploys in tests read the shipped databases and the
# layout costs this session measured. One folder for the whole session, made before the
# workers start: a convolution timed by one worker is read by the other (the cost file is
# replaced whole under a lock-free re-read, so a lost entry is only measured again).
if XDIST_WORKER is None:
    os.environ["EDGECV_TUNING_DIR"] = tempfile.mkdtemp(prefix="edgecv-test-tuning-")


def pytest_configure(config):
    """Tell tests/matrix.py whether heavy tests were selected (before collection): the
    marker expression, evaluated for a test marked ``heavy`` and nothing else, is true
    (``-m heavy``, ``-m "heavy or not heavy"``; not the default ``-m "not heavy"``). A
    test that sizes its own matrix by it is unmarked, so it runs whole under ``-m "heavy
    or not heavy"``; the substring test this replaces never saw that expression as
    selecting heavy tests, so those larger matrices never ran."""
    from _pytest.mark.expression import Expression  # -m's own parser (pytest is pinned)
    from matrix import HEAVY_ENV

    expression = config.getoption("markexpr") or ""
    heavy_only = lambda name, **_: name == "heavy"  # noqa: E731
    selected = bool(expression) and Expression.compile(expression).evaluate(heavy_only)
    os.environ[HEAVY_ENV] = "1" if selected else "0"


def pytest_sessionfinish(session, exitstatus):
    """The two folders above are this session's own: remove them when it ends (the
    shared tuning folder by the process that made it, after its workers)."""
    keys = ["EDGECV_CACHE_DIR"] if XDIST_WORKER else ["EDGECV_CACHE_DIR", "EDGECV_TUNING_DIR"]
    for key in keys:
        shutil.rmtree(os.environ[key], ignore_errors=True)


@pytest.fixture(scope="session")
def export_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("zoo")


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """edgecv's wheel, built once per session (once per xdist worker, in its own folder)
    from a copy of the sources: tests/test_wheel.py, tests/test_boards.py and the
    emulated board install it; each install reads it and leaves it as it is."""
    from test_wheel import build_wheel

    return build_wheel(tmp_path_factory.mktemp("wheel"))


_EXPORTS: dict[str, object] = {}


@pytest.fixture(scope="session")
def exported(export_dir):
    """``exported(name)`` -> ExportedModel, built once per session (random weights, seed 0)."""
    from edgecv.frontend.mxnet import zoo

    def get(name: str):
        if name not in _EXPORTS:
            _EXPORTS[name] = zoo.export(name, export_dir / name, pretrained=False, seed=0)
        return _EXPORTS[name]

    return get


def mxnet_forward(symbol_path: Path, params_path: Path, x: np.ndarray) -> list[np.ndarray]:
    """MXNet's own forward pass of an exported graph: the independent reference."""
    mx = import_mxnet()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = mx.gluon.SymbolBlock.imports(str(symbol_path), ["data"], str(params_path))
    out = net(mx.nd.array(x))
    outs = out if isinstance(out, (list, tuple)) else [out]
    return [o.asnumpy() for o in outs]


def random_input(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """A real photo (scikit-image's astronaut) preprocessed to ``shape``, plus seeded noise.

    Models with random weights are calibrated on a photo; a photo input keeps their
    scores and boxes in a sane range. The noise makes different seeds differ.
    """
    import cv2
    import skimage.data

    from edgecv.frontend.mxnet.zoo import MEAN_RGB, STD_RGB

    rgb = cv2.resize(skimage.data.astronaut(), (shape[3], shape[2]), interpolation=cv2.INTER_AREA)
    x = (rgb.astype(np.float32) / 255.0 - np.float32(MEAN_RGB)) / np.float32(STD_RGB)
    x = np.broadcast_to(x.transpose(2, 0, 1)[None], shape)
    noise = np.random.RandomState(seed).normal(0.0, 0.1, size=shape)
    return (x + noise).astype(np.float32)


@pytest.fixture(scope="session")
def detector_package(tmp_path_factory) -> Path:
    """test_demo's tiny detector (SSD's tail, no parameters) deployed for the CPU once per
    session: the demo's, the video pipeline's and ``bench --video``'s tests share it."""
    from test_demo import SIZE, tiny_detector

    from edgecv.cli import main

    root = tmp_path_factory.mktemp("demo")
    symbol = root / "tiny_det-symbol.json"
    tiny_detector().save(str(symbol))
    argv = ["deploy", str(symbol), "--input-shape", f"1,3,{SIZE},{SIZE}"]
    assert main([*argv, "-o", str(root / "pkg")]) == 0  # in this process: seconds less
    return root / "pkg"


_POCL: dict[str, str | None] = {}


def pocl_unusable() -> str | None:
    """None when PoCL's compiler builds a kernel on this machine, else why not.

    PoCL as bundled in pyopencl (3.0-rc2) links LLVM 14, which names only CPUs it knows:
    on AMD Zen 5 every build fails with "unknown target CPU 'generic'" (on Zen 4 it
    works, as znver3). The tests that run on PoCL skip with that reason there.
    """
    if "reason" not in _POCL:
        import pyopencl as cl

        from edgecv.board.runtime.opencl_devices import register_pip_runtimes

        register_pip_runtimes()
        devices = [
            d for p in cl.get_platforms() if "Portable Computing" in p.name for d in p.get_devices()
        ]
        if not devices:
            _POCL["reason"] = "PoCL is not installed"
        else:
            try:
                context = cl.Context(devices[:1])
                cl.Program(context, "__kernel void k(__global int* a) { a[0] = 1; }").build()
                _POCL["reason"] = None
            except cl.RuntimeError as err:
                first = str(err).strip().splitlines()[-1][:120]
                _POCL["reason"] = f"PoCL's compiler fails on this CPU: {first}"
    return _POCL["reason"]


def needs_pocl():
    """A skip mark for tests that need a working PoCL (evaluated at collection)."""
    reason = pocl_unusable()
    return pytest.mark.skipif(reason is not None, reason=reason or "")
