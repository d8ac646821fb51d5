"""The runners time candidates on the real device, on this CPU (LLVM) and on OpenCL
(Intel's runtime and PoCL; candidates of one batch built into one program): a candidate
that does 64 times the work of another takes far longer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tvm
from tuning_kernels import matmul_task, rows_and_columns, serial, target_of
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder import BuilderInput
from tvm.s_tir.meta_schedule.runner import RunnerInput

from edgecv.tuning.builder import ForkedBuilder


def build_and_time(builder, runner, target, task, schedules, tasks=None) -> list[float]:
    """Build ``schedules`` in one batch and time them; ``tasks`` (one per schedule) when
    they are not all schedules of ``task``."""
    built = builder.build(
        [BuilderInput(tvm.IRModule({"main": s.mod["main"]}), target) for s in schedules]
    )
    assert all(b.error_msg is None for b in built), [b.error_msg for b in built]
    kind = str(target.kind.name)
    inputs = [
        RunnerInput(b.artifact_path, kind, ms.arg_info.ArgInfo.from_prim_func(t.mod["main"]))
        for b, t in zip(built, tasks or [task] * len(built), strict=True)
    ]
    results = [f.result() for f in runner.run(inputs)]
    assert all(r.error_msg is None for r in results), [r.error_msg for r in results]
    return [float(r.run_secs[0]) for r in results], built


def test_llvm_runner_times_candidates_by_their_work(tmp_path):
    """The same serial schedule of a 64x64x64 and a 256x256x256 matrix product, 64 times
    the work. A margin between a serial and a scheduled kernel of one size was a timed
    test: in a clean-clone CI run the two came out 1.7x apart against the 1.5x asked.
    Load only adds time and each time is the fastest of 15 runs, so 64 times the work
    cannot time below 8 times."""
    from edgecv.tuning.runners.llvm import LLVMCompiler, LocalLLVMRunner

    target = target_of("llvm")
    small, large = matmul_task(64), matmul_task(256)
    builder = ForkedBuilder(LLVMCompiler(target), tmp_path, workers=2)
    (small_s, large_s), _ = build_and_time(
        builder,
        LocalLLVMRunner(),
        target,
        None,
        [serial(small, gpu=False), serial(large, gpu=False)],
        tasks=[small, large],
    )
    assert 0 < small_s and small_s * 8 < large_s, (small_s, large_s)


@pytest.mark.parametrize("device", ["intel", "pocl"])
def test_opencl_runner_times_candidates_by_their_work(tmp_path, device):
    """One batch (one program): the same schedule of a 64x64x64 and a 256x256x256 matrix
    product, 64 times the work. A wall-clock margin that parallelism or vectorization
    gave (a one-work-item against a scheduled kernel) was a timed test: PoCL vectorizes
    the one-work-item loop too, and with a core busy the two came out level (23 and 25
    ms). Load only adds time and each time is the fastest of several runs, so 64 times
    the work cannot time below 8 times."""
    from conftest import pocl_unusable

    from edgecv.profiles import load_profile
    from edgecv.schedules.device_class import find_device
    from edgecv.tuning.runners.opencl import LocalOpenCLRunner, OpenCLCompiler

    if device == "pocl" and pocl_unusable():
        pytest.skip(pocl_unusable())
    profile = load_profile("deeplens" if device == "intel" else "aisage")
    target = target_of(device)
    small, large = matmul_task(64), matmul_task(256)
    builder = ForkedBuilder(OpenCLCompiler(target), tmp_path, workers=2)
    runner = LocalOpenCLRunner(find_device(profile, device), target)
    (small_s, large_s), built = build_and_time(
        builder,
        runner,
        target,
        None,
        [rows_and_columns(small), rows_and_columns(large)],
        tasks=[small, large],
    )
    assert 0 < small_s and small_s * 8 < large_s, (small_s, large_s)
    programs = {json.loads(Path(b.artifact_path).read_text())["program"] for b in built}
    assert len(programs) == 1  # one OpenCL program for the batch


def test_opencl_batch_with_a_candidate_the_compiler_crashes_on(tmp_path, monkeypatch):
    """The compiler dies on one candidate's program: that candidate fails with the crash
    named, the others of its batch are timed (the batch is split until it stands alone)."""
    import sys

    from test_opencl import device_or_skip

    from edgecv.board.runtime import compiler_process
    from edgecv.board.runtime.opencl_pieces import split_program
    from edgecv.profiles import load_profile
    from edgecv.schedules.device_class import find_device
    from edgecv.tuning.runners.opencl import LocalOpenCLRunner, OpenCLCompiler

    device_or_skip("intel(r) opencl")
    target = target_of("intel")
    task = matmul_task(64)
    schedules = [rows_and_columns(task), serial(task, gpu=True), rows_and_columns(task)]
    built = ForkedBuilder(OpenCLCompiler(target), tmp_path, workers=2).build(
        [BuilderInput(tvm.IRModule({"main": s.mod["main"]}), target) for s in schedules]
    )
    # the program compiles in pieces named by their code: the second candidate's name
    compiler = OpenCLCompiler(target)
    (piece,) = split_program(compiler.source_of([Path(built[1].artifact_path).parent]))
    marker = next(iter(piece.names.values()))
    crashing = [sys.executable, str(Path(__file__).parents[1] / "crashing_compiler.py"), marker]
    monkeypatch.setattr(compiler_process, "worker_command", lambda: crashing)
    monkeypatch.setenv("EDGECV_CACHE_DIR", str(tmp_path / "cache"))
    compiler_process.stop_worker()
    try:
        runner = LocalOpenCLRunner(find_device(load_profile("deeplens"), "intel"), target)
        args = ms.arg_info.ArgInfo.from_prim_func(task.mod["main"])
        results = [
            f.result()
            for f in runner.run([RunnerInput(b.artifact_path, "opencl", args) for b in built])
        ]
    finally:
        compiler_process.stop_worker()
    assert "died (SIGABRT)" in results[1].error_msg
    for fine in (results[0], results[2]):
        assert fine.error_msg is None and float(fine.run_secs[0]) > 0
