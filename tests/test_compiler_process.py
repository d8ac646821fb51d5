"""OpenCL programs are compiled in a process of their own: a compiler that crashes or
hangs is an error (or, in a deploy, a kernel moved to the CPU), never the end of the
process that asked. The crashes here are real ones of a worker process: killed, past
its time limit, or aborting on a marked program (``crashing_compiler.py``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest
from conftest import mxnet_forward
from test_opencl import device_or_skip

from edgecv.board.runtime import compiler_process, opencl_program
from edgecv.board.runtime.opencl import OpenCLBackend
from edgecv.board.runtime.opencl_program import ProgramBuildError

HERE = Path(__file__).parent


@pytest.fixture
def fresh_compiles(monkeypatch, tmp_path):
    """No program comes from the binary cache nor from the programs this process keeps
    built (an earlier test of the same worker may have built the same kernels); the
    worker is new before and after."""
    device_or_skip("intel(r) opencl")
    monkeypatch.setenv("EDGECV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(opencl_program, "_programs", {})
    compiler_process.stop_worker()
    yield
    compiler_process.stop_worker()


@pytest.fixture
def compiler_crashing_on(fresh_compiles, monkeypatch):
    """``crash_on(text)``: from now on the compiler aborts on programs holding ``text``."""

    def crash_on(marker: str) -> None:
        compiler_process.stop_worker()
        command = [sys.executable, str(HERE / "crashing_compiler.py"), marker]
        monkeypatch.setattr(compiler_process, "worker_command", lambda: command)

    return crash_on


def _scale_source(tag: str = "") -> str:
    return (
        f"// {tag or uuid.uuid4()}\n"
        "__kernel void scale(__global const float* x, __global float* y) {\n"
        "  int i = get_global_id(0);\n  y[i] = 2.0f * x[i] + 1.0f;\n}\n"
    )


def _many_kernels(count: int) -> str:
    return f"// {uuid.uuid4()}\n" + "\n".join(
        f"__kernel void k{i}(__global float* a) {{ int g = get_global_id(0); "
        f"a[g] = a[g] * {i}.0f + sin(a[g]); }}"
        for i in range(count)
    )


def test_program_compiled_by_the_worker_runs_here(fresh_compiles):
    import pyopencl as cl

    source = _scale_source()
    backend = OpenCLBackend("intel", source, {})
    (worker,) = compiler_process.workers()
    assert worker.process.poll() is None
    assert worker.process.pid != os.getpid() and not backend.program_cached
    x = np.arange(64, dtype=np.float32)
    flags = cl.mem_flags
    xs = cl.Buffer(backend.context, flags.READ_ONLY | flags.COPY_HOST_PTR, hostbuf=x)
    ys = cl.Buffer(backend.context, flags.WRITE_ONLY, x.nbytes)
    scale = backend.cl_kernel("scale")
    scale.set_args(xs, ys)
    cl.enqueue_nd_range_kernel(backend.queue, scale, x.shape, None)
    y = np.empty_like(x)
    cl.enqueue_copy(backend.queue, y, ys)
    np.testing.assert_array_equal(y, 2 * x + 1)
    assert OpenCLBackend("intel", source, {}).program_cached  # its binary was kept


def test_compiler_that_dies_is_an_error_and_the_next_program_compiles(compiler_crashing_on):
    compiler_crashing_on("CRASH_HERE")
    with pytest.raises(ProgramBuildError) as err:
        OpenCLBackend("intel", _scale_source("CRASH_HERE"), {})
    message = str(err.value)
    assert err.value.crashed and err.value.kernels == ["scale"]
    assert "Intel(R) OpenCL" in message and "died (SIGABRT)" in message
    assert OpenCLBackend("intel", _scale_source(), {}).programs  # a new worker


def test_worker_killed_mid_compile_is_an_error(fresh_compiles):
    OpenCLBackend("intel", _scale_source(), {})  # the worker is up
    (worker,) = compiler_process.workers()
    pid = worker.process.pid
    killer = threading.Timer(0.5, os.kill, (pid, signal.SIGKILL))
    killer.start()
    with pytest.raises(ProgramBuildError) as err:
        OpenCLBackend("intel", _many_kernels(2000), {})  # seconds of compiling
    killer.join()
    assert err.value.crashed and "died (SIGKILL)" in str(err.value)
    assert "2000 kernel(s)" in str(err.value)


def test_compile_past_the_time_limit_is_killed(fresh_compiles):
    from edgecv.board.runtime.opencl_devices import opencl_devices

    intel = next(d for d in opencl_devices() if d.matches("intel(r) opencl"))
    compiler_process.compile_in_worker(intel.platform, intel.name, _scale_source(), [])
    (worker,) = compiler_process.workers()
    with pytest.raises(compiler_process.CompilerCrash) as err:
        compiler_process.compile_in_worker(
            intel.platform, intel.name, _many_kernels(2000), [], time_limit_s=0.2
        )
    assert "ran past 0.2 s (killed)" in str(err.value)
    assert worker.process.poll() is not None  # the hung compiler is gone
    assert compiler_process.workers() == []


def test_deploy_moves_the_kernel_the_compiler_crashes_on_to_the_cpu(
    tmp_path, capsys, compiler_crashing_on
):
    from test_fallback import _tiny_model

    from edgecv.board.model import load
    from edgecv.cli import main
    from edgecv.testing import assert_close

    symbol, params = _tiny_model(tmp_path)
    compiler_crashing_on("matmul")  # the dense layer's kernel; the conv's compiles
    out = tmp_path / "pkg"
    argv = [
        "deploy",
        symbol,
        "--params",
        params,
        "--device",
        "deeplens",
        "--input-shape",
        "1,2,5,5",
        "-o",
        str(out),
        "--explain",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    placement = json.loads((out / "manifest.json").read_text())["build"]["placement"]
    assert placement["launches"] == {"gpu": 1, "cpu": 1}
    (node,) = placement["cpu_nodes"]
    assert node["reason"] == "gpu-build-failed" and "matmul" in node["kernel"]
    assert "crashed" in node["detail"] and "crashed" in printed
    compiler_process.stop_worker()
    x = np.random.RandomState(0).normal(size=(1, 2, 5, 5)).astype(np.float32)
    model = load(out, on="intel")
    assert_close(model.run(x)[0], mxnet_forward(symbol, params, x)[0], "tiny, dense on the CPU")


PARENT = """
import os, subprocess, sys, time
from edgecv.board.runtime.compiler_process import PARENT_ENV, worker_command
source = int(sys.argv[1])
worker = subprocess.Popen(worker_command(), stdin=source, stdout=subprocess.PIPE,
                          pass_fds=(source,), env={**os.environ, PARENT_ENV: str(os.getpid())})
print(worker.pid, flush=True)
time.sleep(120)
"""


def test_a_worker_whose_parent_is_killed_ends_even_with_its_input_open():
    """A parent killed mid-compile leaves the worker's input open while the compile runs
    (here: another process holds the pipe's write end, so no end of input ever comes):
    the worker must still end, not live on as an orphan."""
    import time

    read_end, write_end = os.pipe()
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(read_end)],
        pass_fds=(read_end,),
        stdout=subprocess.PIPE,
        text=True,
    )
    os.close(read_end)
    try:
        worker = int(parent.stdout.readline())
        parent.kill()
        parent.wait()

        def alive() -> bool:
            try:
                state = Path(f"/proc/{worker}/status").read_text()
            except FileNotFoundError:
                return False
            return "State:\tZ" not in state  # a zombie has ended (its reaper is not us)

        deadline = time.monotonic() + 15
        while alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(), "the compiler worker outlived its parent"
    finally:
        os.close(write_end)
