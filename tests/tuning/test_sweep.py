"""The tile variants of edgecv's rules, timed before MetaSchedule's search
(:func:`edgecv.tuning.search.sweep_variants`)."""

from __future__ import annotations

import pytest
from test_opencl import device_or_skip
from tuning_kernels import matmul_task, packed_conv_task

from edgecv.profiles import load_profile
from edgecv.tuning.records import open_database, records_of
from edgecv.tuning.search import Budget, head_to_head, measure_defaults, sweep_variants
from edgecv.tuning.tasks import rule_variants


@pytest.fixture(scope="module")
def intel(tmp_path_factory):
    """(order, builder, runner) on Intel's OpenCL runtime for the deeplens profile."""
    from edgecv.schedules.device_class import find_device
    from edgecv.schedules.orders import gpu_order
    from edgecv.tuning.builder import ForkedBuilder
    from edgecv.tuning.runners.opencl import LocalOpenCLRunner, OpenCLCompiler

    device_or_skip("intel(r) opencl")
    profile = load_profile("deeplens")
    target = profile.tvm_target()
    work = tmp_path_factory.mktemp("work")
    builder = ForkedBuilder(OpenCLCompiler(target), work, workers=2)
    runner = LocalOpenCLRunner(find_device(profile, "intel"), target)
    return gpu_order(target, profile.intel_subgroup_size), builder, runner


def test_each_tile_is_timed_once_within_the_trials_and_raced_after(intel, tmp_path):
    order, builder, runner = intel
    # a 1x1 conv: the tiles of a 3x3's, each compiled without its unrolled 3x3 window
    task, said = packed_conv_task(channels=32, size=8, kernel=1), []
    db = open_database(tmp_path / "db")
    measure_defaults([task], order, builder, runner, db, said.append)
    assert task.default_rule == "gpu.PackedConv2D"
    offered = rule_variants(task, order)
    assert len(offered) >= 6
    # 3 trials in batches of 2: three tiles timed (two batches), each stored
    assert (
        sweep_variants([task], order, builder, runner, db, Budget(3, None, 2), said.append)
        == "trials"
    )
    assert len(records_of(db, task.mod)) == 1 + 3
    assert any("3 tile variants" in s for s in said)
    # resumed with more trials: only the tiles not timed yet
    sweep_variants([task], order, builder, runner, db, Budget(4, None, 8), said.append)
    assert len(records_of(db, task.mod)) == 1 + 4
    sweep_variants([task], order, builder, runner, db, Budget(4, None, 8), said.append)
    assert len(records_of(db, task.mod)) == 1 + 4
    # the best of them is raced beside the default and decides the verdict
    head_to_head([task], order, builder, runner, db, said.append)
    assert task.best_s is not None and task.best_s <= task.default_s


def test_a_rule_without_knobs_offers_nothing_and_the_sweep_is_skipped(tmp_path):
    from edgecv.schedules.orders import cpu_order
    from edgecv.tuning.builder import ForkedBuilder
    from edgecv.tuning.runners.llvm import LLVMCompiler, LocalLLVMRunner

    target = load_profile("cpu").tvm_target()
    order, task, said = cpu_order(target), matmul_task(32), []
    db = open_database(tmp_path / "db")
    builder, runner = ForkedBuilder(LLVMCompiler(target), tmp_path / "work"), LocalLLVMRunner()
    measure_defaults([task], order, builder, runner, db, said.append)
    assert rule_variants(task, order) == []
    assert sweep_variants([task], order, builder, runner, db, Budget(8), said.append) == "trials"
    assert len(records_of(db, task.mod)) == 1 and not any("tile variants" in s for s in said)
