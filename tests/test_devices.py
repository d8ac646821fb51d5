"""OpenCL devices from pip-installed runtimes are found with no environment set-up."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import numpy as np
import pytest

from edgecv.board.runtime.opencl_devices import opencl_devices, register_pip_runtimes

X86 = platform.machine() in ("x86_64", "AMD64")


def test_finds_pocl_and_intel_runtimes():
    devices = opencl_devices()
    pocl = [d for d in devices if d.matches("portable computing")]
    assert pocl and not pocl[0].intel_subgroups
    if X86:
        intel = [d for d in devices if d.matches("intel")]
        assert intel and intel[0].intel_subgroups


def test_no_environment_needed(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OCL_ICD_VENDORS"}
    env["XDG_CACHE_HOME"] = str(tmp_path)  # a fresh cache: the .icd is written anew
    out = subprocess.run(
        [sys.executable, "-m", "edgecv.cli", "devices"], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "Portable Computing Language" in out.stdout
    if X86:
        assert "Intel(R) OpenCL" in out.stdout and "intel subgroups" in out.stdout


@pytest.mark.parametrize("query", ["pocl", "intel"])
def test_kernel_runs_on_each_device(query):
    import pyopencl as cl

    register_pip_runtimes()
    if query == "intel" and not X86:
        pytest.skip("Intel's CPU runtime installs only on x86-64")
    label = "portable computing" if query == "pocl" else "intel(r) opencl"
    matches = [
        dev
        for plat in cl.get_platforms()
        for dev in plat.get_devices()
        if label in f"{plat.name} / {dev.name}".lower()
    ]
    assert matches, f"no {query} device"
    ctx = cl.Context([matches[0]])
    queue = cl.CommandQueue(ctx)
    src = "__kernel void axpy(__global float* y, __global const float* x) {"
    src += " int i = get_global_id(0); y[i] = 2.0f * x[i] + y[i]; }"
    try:
        program = cl.Program(ctx, src).build()
    except cl.RuntimeError as err:
        if query == "pocl" and "unknown target CPU 'generic'" in str(err):
            # PoCL 3.0-rc2 (bundled in pyopencl) links LLVM 14, which cannot name CPUs
            # newer than it (here AMD Zen 5), so its compiler refuses every kernel.
            pytest.skip("PoCL's LLVM 14 does not know this host CPU: it compiles nothing here")
        raise
    x = np.arange(1000, dtype=np.float32)
    y = np.ones(1000, dtype=np.float32)
    mf = cl.mem_flags
    x_buf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
    y_buf = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=y)
    program.axpy(queue, (1000,), None, y_buf, x_buf)
    out = np.empty_like(y)
    cl.enqueue_copy(queue, out, y_buf)
    np.testing.assert_array_equal(out, 2 * x + 1)


def test_a_stale_driver_file_is_replaced_whole(tmp_path, monkeypatch):
    """A process that opened the cache's Intel ``.icd`` before another rewrote it reads a
    whole file (it was truncated and rewritten in place: empty for a moment)."""
    import edgecv.board.runtime.opencl_devices as devices

    if devices._intel_runtime() is None:
        pytest.skip("Intel's CPU OpenCL runtime is not installed")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("OCL_ICD_VENDORS", raising=False)
    monkeypatch.setattr(devices, "_REGISTERED", False)
    icd = tmp_path / "edgecv" / "icd" / "intel-cpu.icd"
    icd.parent.mkdir(parents=True)
    icd.write_text("/an/old/path/libintelocl.so\n")
    with open(icd) as reader:  # opened by a process starting at the same time
        register_pip_runtimes()
        assert reader.read() == "/an/old/path/libintelocl.so\n"
    assert icd.read_text().strip() == str(devices._intel_runtime())
