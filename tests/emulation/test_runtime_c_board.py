"""The device runtime in C on the emulated aarch64 board: libedgecv_runtime and its demo
cross-built with `zig cc` (the ziglang wheel deploy links board kernels with, for the
boards' oldest glibc), against the board's apache-tvm-ffi wheel and zlib, then run
under qemu-user on a `cpu` package for aiSage's Cortex-A72. Its outputs are the Python
runtime's on the same board, bit for bit; what it installs is measured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import c_library as rc
import numpy as np
import pytest
from conftest import mxnet_forward
from emulation import aarch64
from emulation.test_board_packages import device_runtime, run_on_board  # noqa: F401 (a fixture)
from graph_tuner.small_model import SHAPE, export_small_model
from test_int8 import arm_cpu_profile

from edgecv.deploy import deploy
from edgecv.pipelines import BuildOptions
from edgecv.testing import assert_close


def _unavailable() -> str | None:
    import importlib.util

    if importlib.util.find_spec("ziglang") is None:
        return "the ziglang wheel (edgecv[compiler]) cross-builds the C runtime"
    return aarch64.unavailable_reason() or rc.missing_tools()


pytestmark = pytest.mark.skipif(_unavailable() is not None, reason=str(_unavailable()))


@pytest.fixture(scope="module")
def board_build(tmp_path_factory) -> Path:
    """runtime_c/ built for aarch64 (glibc 2.27) with zig cc, stripped."""
    folder = tmp_path_factory.mktemp("runtime_c_aarch64")
    compiler = folder / "zig-cc"
    compiler.write_text(
        f'#!/bin/sh\nexec {sys.executable} -m ziglang cc -target aarch64-linux-gnu.2.27 "$@"\n'
    )
    compiler.chmod(0o755)
    zlib = aarch64.sysroot() / "lib" / "aarch64-linux-gnu" / "libz.so.1"
    return rc.build(
        folder / "build",
        tvm_ffi_root=aarch64.site_packages() / "tvm_ffi",
        extra=(
            "-DCMAKE_SYSTEM_NAME=Linux",
            "-DCMAKE_SYSTEM_PROCESSOR=aarch64",
            f"-DCMAKE_C_COMPILER={compiler}",
            "-DZLIB_INCLUDE_DIR=/usr/include",  # zlib.h and zconf.h hold no ISA
            f"-DZLIB_LIBRARY={zlib}",
            "-DCMAKE_SHARED_LINKER_FLAGS=-s",
            "-DCMAKE_EXE_LINKER_FLAGS=-s",
        ),
    )


def test_the_c_runtime_runs_a_board_package_as_the_python_runtime_does(
    board_build,
    device_runtime,  # noqa: F811 (the fixture imported above)
    tmp_path,
):
    symbol, params = export_small_model(tmp_path / "export" / "small")
    path = deploy(
        str(symbol),
        tmp_path / "board" / "pkg",
        str(arm_cpu_profile(tmp_path, "cortex-a72")),
        params=str(params),
        input_shape=SHAPE,
        options=BuildOptions(layout="NCHW"),
    )
    x = np.random.RandomState(6).normal(size=SHAPE).astype(np.float32)
    python, facts = run_on_board(device_runtime, path, x, "load")
    assert facts["machine"] == "aarch64" and not facts["tvm_imported"], facts
    np.save(path.parent / "x.npy", x)
    done = subprocess.run(
        [aarch64.QEMU, "-L", str(aarch64.sysroot()), str(board_build / "run_package"), str(path)]
        + [str(path.parent / "x.npy"), "--save", str(path.parent / "c.out")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (path.parent / "c.out").read_bytes() == python[0].tobytes()
    assert_close(python[0], mxnet_forward(symbol, params, x)[0], name="C runtime on the board")
    # what a board installs for it: the library and libtvm_ffi.so (the package brings
    # TVM's runtime library for its CPU kernels, as for the Python runtime)
    library = board_build / "libedgecv_runtime.so"
    ffi = aarch64.site_packages() / "tvm_ffi" / "lib" / "libtvm_ffi.so"
    installed = library.stat().st_size + ffi.stat().st_size
    print(
        f"aarch64: libedgecv_runtime.so {library.stat().st_size:,} B, libtvm_ffi.so "
        f"{ffi.stat().st_size:,} B, package's libtvm_runtime.so "
        f"{(path / 'kernels' / 'libtvm_runtime.so').stat().st_size:,} B"
    )
    assert installed < 15e6  # issue 53's goal for the board's install
