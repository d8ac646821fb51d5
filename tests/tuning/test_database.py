"""Tuning databases end to end on a tiny model: `edgecv tune` with a handful of trials,
the records found again by structure, pruned for shipping, applied at deploy with the
same numbers as the default build and MXNet; a stale or corrupt database gives a
warning and the default build (the lookup itself: tests/schedules/test_stage.py)."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import tvm
from tuning_kernels import export_tiny, matmul_task, serial

from edgecv.board.model import load
from edgecv.cli import main
from edgecv.deploy import deploy
from edgecv.pipelines import BuildOptions
from edgecv.profiles import load_profile
from edgecv.schedules.database import GZ, META, RECORDS, WORKLOADS, TuningDatabase
from edgecv.schedules.device_class import cpu_class
from edgecv.testing import assert_close
from edgecv.tuning.command import in_deploy_layouts
from edgecv.tuning.records import commit_schedule, open_database, records_of, ship
from edgecv.tuning.tasks import extract_tasks, import_model

SHAPE = (1, 8, 16, 16)


def tiny_input():
    return np.random.RandomState(0).normal(size=SHAPE).astype(np.float32)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """The tiny model and its database after `edgecv tune --trials 4`."""
    root = tmp_path_factory.mktemp("tuned")
    symbol = export_tiny(root / "model")
    db = root / "db"
    # the heaviest workload searched (4 trials); every workload gets its default record
    status = main(
        [
            "tune",
            str(symbol),
            "--input-shape",
            "1,8,16,16",
            "--trials",
            "4",
            "--tasks",
            "1",
            "--db",
            str(db),
        ]
    )
    assert status == 0
    return symbol, db


def tiny_tasks(symbol, db=None):
    """The tasks of the tiny model in the layouts `tune --db db` chose (its layout costs
    are cached in ``db``, so the graph tuner plans the same again); NCHW without ``db``."""
    mod, _ = import_model(str(symbol), None, SHAPE, False, 0, lambda m: None)
    profile = load_profile("cpu")
    if db is not None:
        mod, winograd = in_deploy_layouts(mod, profile, "auto", [db], lambda m: None)
        return extract_tasks(mod, profile, winograd)
    return extract_tasks(mod, profile)


def search_won_everywhere(db, destination):
    """A copy of ``db`` whose summary says the search beat the default rule on every
    workload: deploy then replays every record (with 4 trials the search rarely wins)."""
    import shutil

    shutil.copytree(db, destination)
    meta_path = destination / "edgecv_database.json"
    meta = json.loads(meta_path.read_text())
    for entry in meta["workloads"].values():
        entry["best_s"] = entry["default_s"] / 2
    meta_path.write_text(json.dumps(meta))
    return destination


def test_records_are_found_by_structure_whatever_the_kernel_is_named(tuned, tmp_path):
    symbol, db = tuned
    target = load_profile("cpu").tvm_target()
    database = TuningDatabase([db])
    meta = json.loads((db / "edgecv_database.json").read_text())
    won = TuningDatabase([search_won_everywhere(db, tmp_path / "won")])
    for task in tiny_tasks(symbol, db):
        renamed = task.mod["main"].with_attr("global_symbol", "another_name")
        assert won.query(renamed, target) is not None, task.name
        assert won.best_seconds(renamed, target) is not None, task.name
        # replayed only where the search beat the default rule; else the rule schedules it
        facts = meta["workloads"][str(task.key)]
        searched_won = facts["best_s"] < facts["default_s"]
        assert (database.query(renamed, target) is not None) == searched_won, task.name
        assert (database.best_seconds(renamed, target) is not None) == searched_won, task.name
        assert len(records_of(open_database(db), task.mod)) >= 1
        # layered, the first database holding the workload decides
        assert TuningDatabase([tmp_path / "won", db]).query(renamed, target) is not None
        layered = TuningDatabase([db, tmp_path / "won"]).query(renamed, target)
        assert (layered is not None) == searched_won, task.name
    searched = max(len(records_of(open_database(db), t.mod)) for t in tiny_tasks(symbol, db))
    assert searched >= 5  # its default and 4 trials
    assert database.query(matmul_task().mod["main"], target) is None
    meta = json.loads((db / "edgecv_database.json").read_text())
    assert meta["tvm"] == tvm.__version__ and meta["device"] == cpu_class(target).key
    for entry in meta["workloads"].values():
        assert entry["default_rule"].startswith("cpu.")
        assert entry["best_s"] <= entry["default_s"]  # the default is a record too


def test_shipping_keeps_the_best_record_of_each_workload(tuned, tmp_path):
    symbol, db = tuned
    target = load_profile("cpu").tvm_target()
    (tmp_path / "shipped").mkdir()
    costs = tmp_path / "shipped" / "layout_costs.json"
    costs.write_text('{"the graph tuner": "costs"}')
    count = ship(db, tmp_path / "shipped", cpu_class(target), {})
    assert costs.read_text() == '{"the graph tuner": "costs"}'  # shipped beside, kept
    tasks = tiny_tasks(symbol, db)
    assert count == len(tasks)
    assert len(shipped_records(tmp_path / "shipped")) == len(tasks)
    shipped = open_database(tmp_path / "shipped")
    full = open_database(db)
    for task in tasks:
        (best,) = records_of(shipped, task.mod)
        times = [float(np.mean([float(s) for s in r.run_secs])) for r in records_of(full, task.mod)]
        assert float(np.mean([float(s) for s in best.run_secs])) == pytest.approx(min(times))
    # shipped again (the folder already holds these workloads): still one record each
    assert ship(db, tmp_path / "shipped", cpu_class(target), {}) == len(tasks)
    assert len(shipped_records(tmp_path / "shipped")) == len(tasks)


def shipped_records(folder):
    """The record lines of a shipped (gzipped) database folder."""
    return gzip.decompress((folder / f"{RECORDS}{GZ}").read_bytes()).decode().splitlines()


def test_shipped_databases_hold_what_deploy_replays_gzipped(tuned, tmp_path):
    """Shipping keeps the workloads whose search beat the default rule (the only records
    deploy replays), gzipped; deploy reads the shipped folder as it read the plain one."""
    symbol, db = tuned
    target = load_profile("cpu").tvm_target()
    plain = search_won_everywhere(db, tmp_path / "plain")
    meta = json.loads((plain / META).read_text())
    lost = sorted(meta["workloads"])[1:]  # the search beat the default on one workload
    for key in lost:
        meta["workloads"][key]["best_s"] = meta["workloads"][key]["default_s"]
    (plain / META).write_text(json.dumps(meta))
    assert ship(plain, tmp_path / "shipped", cpu_class(target), meta["workloads"]) == 1
    assert sorted(p.name for p in (tmp_path / "shipped").iterdir()) == sorted(
        [META, f"{RECORDS}{GZ}", f"{WORKLOADS}{GZ}"]
    )
    assert len(shipped_records(tmp_path / "shipped")) == 1
    before, after = TuningDatabase([plain]), TuningDatabase([tmp_path / "shipped"])
    replayed = 0
    for task in tiny_tasks(symbol, db):
        ours, theirs = after.query(task.mod["main"], target), before.query(task.mod["main"], target)
        assert (ours is None) == (theirs is None)
        if ours is not None:
            tvm.ir.assert_structural_equal(ours, theirs)
            replayed += 1
    assert replayed == 1


def test_an_old_shipped_record_timed_faster_does_not_replace_the_one_just_raced(tuned, tmp_path):
    """The work folder's verdict was decided on its own best record: shipping keeps that
    record, whatever time an older shipped record of the workload claims."""
    from tvm.s_tir import meta_schedule as ms

    symbol, db = tuned
    target = load_profile("cpu").tvm_target()
    work, old = open_database(db), open_database(tmp_path / "shipped")

    def mean(record) -> float:
        return float(np.mean([float(s) for s in record.run_secs]))

    for task in tiny_tasks(symbol, db):  # its slowest schedule, claiming a nanosecond
        slowest = max(records_of(work, task.mod), key=mean)
        old.commit_tuning_record(
            ms.database.TuningRecord(
                slowest.trace, old.commit_workload(task.mod), [1e-9], target, slowest.args_info
            )
        )
    ship(db, tmp_path / "shipped", cpu_class(target), {})
    shipped = open_database(tmp_path / "shipped")
    for task in tiny_tasks(symbol, db):
        (kept,) = records_of(shipped, task.mod)
        assert mean(kept) == pytest.approx(min(mean(r) for r in records_of(work, task.mod)))


def test_a_tuned_deploy_gives_the_numbers_of_the_default_build_and_mxnet(tuned, tmp_path):
    from conftest import mxnet_forward

    symbol, db = tuned
    db = search_won_everywhere(db, tmp_path / "won")
    with_db = deploy(
        str(symbol), tmp_path / "tuned", "cpu", input_shape=SHAPE, options=BuildOptions(tuning=[db])
    )
    without = deploy(
        str(symbol),
        tmp_path / "default",
        "cpu",
        input_shape=SHAPE,
        options=BuildOptions(tuning=None),
    )
    manifest = json.loads((with_db / "manifest.json").read_text())
    assert set(manifest["build"]["schedules"]["cpu"]["rules"]) == {"tuned"}
    x = tiny_input()
    reference = mxnet_forward(symbol, symbol.with_name("tiny-0000.params"), x)[0]
    assert_close(load(with_db).run(x)[0], reference)
    assert_close(load(without).run(x)[0], reference)


def test_python_deploy_reads_the_databases_the_cli_reads(tuned, tmp_path, monkeypatch):
    """`edgecv.deploy()` without options finds the records in the user's folder of this
    device class, as `edgecv deploy` does (it used to build the defaults only)."""

    import shutil

    from edgecv.graph_tuner.costs import COSTS_FILE

    symbol, db = tuned
    device = cpu_class(load_profile("cpu").tvm_target())
    costs = device.user_folder() / COSTS_FILE  # where `tune` cached the layout costs
    monkeypatch.setenv("EDGECV_TUNING_DIR", str(tmp_path / "tuning"))
    folder = search_won_everywhere(db, device.user_folder())
    if costs.exists():  # the plan `tune` chose, not a new measurement that noise may
        shutil.copy(costs, folder / COSTS_FILE)  # turn into kernels the database lacks
    path = deploy(str(symbol), tmp_path / "pkg", "cpu", input_shape=SHAPE)
    manifest = json.loads((path / "manifest.json").read_text())
    assert set(manifest["build"]["schedules"]["cpu"]["rules"]) == {"tuned"}


def test_a_stale_record_warns_and_the_default_rule_builds_it(tuned, tmp_path):
    from conftest import mxnet_forward

    symbol, _ = tuned
    target = load_profile("cpu").tvm_target()
    conv = next(t for t in tiny_tasks(symbol) if "conv2d" in t.name)
    stale = open_database(tmp_path / "stale")
    # a record of another kernel's schedule filed under the conv: its trace cannot replay
    # (TVM checks every trace as it loads a database: the whole database is passed over)
    commit_schedule(stale, conv.mod, serial(matmul_task(), gpu=False), [1e-9], target)
    with pytest.warns(UserWarning, match="stale cannot be read"):
        path = deploy(
            str(symbol),
            tmp_path / "pkg",
            "cpu",
            input_shape=SHAPE,
            options=BuildOptions(tuning=[tmp_path / "stale"], layout="NCHW"),
        )
    kernels = json.loads((path / "manifest.json").read_text())["build"]["schedules"]["cpu"]
    entry = kernels["kernels"][conv.name]
    assert entry["rule"] == "cpu.Conv2D"
    x = tiny_input()
    reference = mxnet_forward(symbol, symbol.with_name("tiny-0000.params"), x)[0]
    assert_close(load(path).run(x)[0], reference)


def test_a_corrupt_database_warns_and_deploy_builds_the_defaults(tuned, tmp_path):
    symbol, _ = tuned
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "database_workload.json").write_text('["truncated\n')
    (corrupt / "database_tuning_record.json").write_text("")
    with pytest.warns(UserWarning, match="cannot be read"):
        path = deploy(
            str(symbol),
            tmp_path / "pkg",
            "cpu",
            input_shape=SHAPE,
            options=BuildOptions(tuning=[corrupt]),
        )
    rules = json.loads((path / "manifest.json").read_text())["build"]["schedules"]["cpu"]["rules"]
    assert "tuned" not in rules


def test_the_cpu_search_space_leaves_weights_in_their_layout():
    from edgecv.tuning.search import postprocs

    names = [type(p).__name__ for p in postprocs(load_profile("cpu").tvm_target())]
    assert "RewriteLayout" not in names and "RewriteParallelVectorizeUnroll" in names


def test_deploy_reads_the_users_and_the_shipped_database_of_this_device_class():
    from edgecv.cli import build_parser
    from edgecv.commands.deploy import build_options

    def tuning(*flags):  # the databases `edgecv deploy m --device cpu FLAGS` builds with
        args = build_parser().parse_args(["deploy", "m", *flags])
        return build_options(args, load_profile("cpu")).tuning

    device_class = cpu_class(load_profile("cpu").tvm_target())
    user, shipped = tuning()
    assert user == str(device_class.user_folder())
    assert shipped.endswith(f"device_profiles/tuning/{device_class.name}")
    assert tuning("--db", "/my/db") == ["/my/db", shipped]
    assert tuning("--no-tuning") is None


def test_tuning_for_cuda_without_a_gpu_is_refused_with_what_to_do(capsys):
    from edgecv.board.runtime.cuda import cuda_devices

    if cuda_devices():
        pytest.skip("this machine has a CUDA GPU")
    assert main(["tune", "mobilenet1.0", "--device", "jetson_nano", "--random-weights"]) == 2
    err = capsys.readouterr().err
    assert "cannot tune for `jetson_nano` (CUDA)" in err and "no CUDA driver or GPU" in err


def test_a_record_for_an_opencl_profile_applies_at_deploy_and_matches_mxnet(tuned, tmp_path):
    """GPU records replay at deploy through deploy's own lowering (the replayed kernel
    keeps its name: host/device splitting needs an entry function). The tasks are those
    of the layouts deploy chooses (`tune` puts the model in them first)."""
    from conftest import mxnet_forward

    from edgecv.schedules.database import write_meta
    from edgecv.schedules.fingerprint import rules_fingerprint
    from edgecv.schedules.orders import gpu_order
    from edgecv.tuning.command import in_deploy_layouts
    from edgecv.tuning.tasks import default_schedules

    symbol, _ = tuned
    profile = load_profile("deeplens")
    target = profile.tvm_target()
    mod, _ = import_model(str(symbol), None, SHAPE, False, 0, lambda m: None)
    mod, _ = in_deploy_layouts(mod, profile, "auto", [tmp_path / "gpu"], lambda m: None)
    database = open_database(tmp_path / "gpu")
    order = gpu_order(target, profile.intel_subgroup_size)
    tasks = extract_tasks(mod, profile)
    for task in tasks:
        _, sch = next(default_schedules(task, order))
        commit_schedule(database, task.mod, sch, [1e-4], target)
    # each record shown to beat today's GPU rules (else deploy keeps the rule)
    won = {"default_s": 2e-4, "best_s": 1e-4, "rules": rules_fingerprint(gpu=True)}
    write_meta(tmp_path / "gpu", {"kind": "opencl"}, {str(t.key): won for t in tasks})
    path = deploy(
        str(symbol),
        tmp_path / "pkg",
        "deeplens",
        input_shape=SHAPE,
        host="native",
        options=BuildOptions(tuning=[tmp_path / "gpu"]),
    )
    rules = json.loads((path / "manifest.json").read_text())["build"]["schedules"]["gpu"]["rules"]
    # every GPU kernel of the plan takes its record (how many there are depends on the
    # layouts the measured costs chose: 3 or 4 on Intel's runtime)
    assert rules == {"tuned": sum(len(t.kernels) for t in tasks)}
    x = tiny_input()
    reference = mxnet_forward(symbol, symbol.with_name("tiny-0000.params"), x)[0]
    assert_close(load(path, on="intel").run(x)[0], reference)


def test_a_void_verdict_first_does_not_hide_a_current_one_after_it(tuned, tmp_path):
    """A user's folder compared under rules since edited (void) layered over a shipped
    one compared under today's: the shipped verdict decides."""
    symbol, db = tuned
    target = load_profile("cpu").tvm_target()
    won = search_won_everywhere(db, tmp_path / "won")
    stale = search_won_everywhere(db, tmp_path / "stale")
    meta = json.loads((stale / "edgecv_database.json").read_text())
    for entry in meta["workloads"].values():
        entry["rules"] = "rules before an edit"
    (stale / "edgecv_database.json").write_text(json.dumps(meta))
    for task in tiny_tasks(symbol, db):
        func = task.mod["main"]
        assert TuningDatabase([stale]).query(func, target) is None, task.name
        assert TuningDatabase([stale, won]).query(func, target) is not None, task.name
        assert TuningDatabase([stale, won]).best_seconds(func, target) is not None, task.name


def test_record_timed_fast_long_ago_loses_to_the_default_timed_beside_it(tmp_path):
    """A record stored with a time from a faster moment (here: a one-thread schedule
    claiming a nanosecond) is timed again beside the default before it may win."""
    from edgecv.schedules.orders import cpu_order
    from edgecv.tuning.builder import ForkedBuilder
    from edgecv.tuning.runners.llvm import LLVMCompiler, LocalLLVMRunner
    from edgecv.tuning.search import head_to_head, measure_defaults

    target = load_profile("cpu").tvm_target()
    order = cpu_order(target)
    task, said = matmul_task(), []
    db = open_database(tmp_path / "db")
    builder, runner = ForkedBuilder(LLVMCompiler(target), tmp_path / "work"), LocalLLVMRunner()
    measure_defaults([task], order, builder, runner, db, said.append)
    commit_schedule(db, task.mod, serial(task, gpu=False), [1e-9], target)
    head_to_head([task], order, builder, runner, db, said.append)
    assert any("1 best records against their defaults" in s for s in said)
    assert task.best_s == task.default_s  # the serial record lost
    assert 1e-6 < task.default_s < 1.0


def test_a_gpu_default_is_not_timed_against_its_own_record(tmp_path):
    """On OpenCL the default's own record (replayed from its trace) is the default's
    code: it is not raced against it (such races came out up to 16% apart)."""
    from test_opencl import device_or_skip

    from edgecv.schedules.device_class import find_device
    from edgecv.schedules.orders import gpu_order
    from edgecv.tuning.builder import ForkedBuilder
    from edgecv.tuning.runners.opencl import LocalOpenCLRunner, OpenCLCompiler
    from edgecv.tuning.search import head_to_head, measure_defaults

    device_or_skip("intel(r) opencl")
    profile = load_profile("deeplens")
    target = profile.tvm_target()
    order = gpu_order(target, profile.intel_subgroup_size)
    task, said = matmul_task(64), []
    db = open_database(tmp_path / "db")
    builder = ForkedBuilder(OpenCLCompiler(target), tmp_path / "work", workers=2)
    runner = LocalOpenCLRunner(find_device(profile, "intel"), target)
    measure_defaults([task], order, builder, runner, db, said.append)
    assert task.default_s is not None and task.default_rule.startswith("gpu.")
    head_to_head([task], order, builder, runner, db, said.append)
    assert task.best_s == task.default_s
    assert not any("against their defaults" in s for s in said)


def test_ctrl_c_twice_ends_the_search_with_the_records_kept(tmp_path):
    """Ctrl-C asks the search to stop after its batch; a second one stops it at once,
    wherever it lands (in MetaSchedule's C++ too): exit 130, the database readable."""
    import os
    import signal
    import subprocess
    import sys
    import time

    symbol = export_tiny(tmp_path / "model")
    db = tmp_path / "db"
    env = dict(os.environ, EDGECV_PROGRESS="0")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "edgecv.cli",
            "tune",
            str(symbol),
            "--input-shape",
            "1,8,16,16",
            "--layout",  # the search is what Ctrl-C stops: no layouts timed before it
            "NCHW",
            "--trials",
            "512",
            "--db",
            str(db),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    said = []
    for line in process.stdout:  # until the search runs
        said.append(line)
        if "trials each" in line:
            break
    time.sleep(3)
    process.send_signal(signal.SIGINT)
    time.sleep(1)
    process.send_signal(signal.SIGINT)
    rest, _ = process.communicate(timeout=300)
    printed = "".join(said) + rest
    assert process.returncode == 130, printed
    assert "records measured so far are kept" in printed and "Segfault" not in printed
    assert records_of(open_database(db), tiny_tasks(symbol)[0].mod)  # defaults at least


SPIN = """
import sys
import numpy as np
import tvm
from tvm.script import tirx as T
from edgecv.tuning.search import _CtrlC, _Progress

@T.prim_func
def spin(a: T.Buffer((1,), "float32"), n: T.int64):
    for i in range(n):
        a[0] = a[0] * T.float32(0.5) + T.float32(1.0)

kernel = tvm.compile(tvm.IRModule({"main": spin.with_attr("global_symbol", "main")}), "llvm")
x = tvm.runtime.tensor(np.zeros(1, np.float32))
watcher = _CtrlC(_Progress([], 1, None))
print("spinning", flush=True)
kernel["main"](x, 40_000_000_000)  # a minute or more in native code, never back in Python
print("returned", flush=True)
"""


def test_ctrl_c_is_answered_while_native_code_runs(tmp_path):
    """Python runs a signal handler only when the main thread is back in the interpreter,
    and MetaSchedule samples a batch for minutes in C++: the search answers Ctrl-C from a
    thread of its own, at once."""
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "spin.py"
    script.write_text(SPIN)
    process = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert process.stdout.readline().strip() == "spinning"
    time.sleep(1)
    process.send_signal(signal.SIGINT)
    time.sleep(1)
    process.send_signal(signal.SIGINT)
    try:
        rest, _ = process.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError("Ctrl-C twice did not end the process in 20 s") from None
    assert process.returncode == 130, rest
    assert "stopping after this batch" in rest and "returned" not in rest
