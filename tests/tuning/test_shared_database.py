"""One tuning database folder shared over time and by processes at once: a tune of
another model keeps the verdicts already there, two tunes (or any two writers) at once
leave every record on its own workload, and a last line cut short by a kill or a power
loss is left out with a warning instead of losing the whole folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import tvm_ffi
from tuning_kernels import export_tiny, matmul_task, serial
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms

from edgecv.cli import main
from edgecv.profiles import load_profile
from edgecv.schedules.database import META, RECORDS, WORKLOADS, TuningDatabase, write_meta
from edgecv.schedules.fingerprint import target_rules
from edgecv.tuning.records import commit_schedule, open_database, records_of
from edgecv.tuning.tasks import extract_tasks, import_model

TINY = (1, 8, 16, 16)
OTHER = (1, 4, 12, 12)


def export_other(folder: Path) -> Path:
    """A second small MXNet graph (other shapes, so other workloads than the tiny one's)."""
    from edgecv._mxnet import import_mxnet

    mx = import_mxnet()
    from mxnet import gluon

    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(6, 3, padding=1, activation="relu"), gluon.nn.Dense(5))
    net.initialize(mx.init.Xavier(rnd_type="gaussian"))
    net.hybridize()
    net(mx.nd.ones(OTHER))
    folder.mkdir(parents=True, exist_ok=True)
    net.export(str(folder / "other"))
    return folder / "other-symbol.json"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {TINY: export_tiny(root / "tiny"), OTHER: export_other(root / "other")}


def tune_command(symbol: Path, shape: tuple, db: Path, trials: int) -> list[str]:
    return [
        "tune",
        str(symbol),
        "--input-shape",
        ",".join(map(str, shape)),
        "--layout",
        "NCHW",
        "--trials",
        str(trials),
        "--tasks",
        "1",
        "--db",
        str(db),
    ]


def workload_keys(symbol: Path, shape: tuple) -> set[str]:
    mod, _ = import_model(str(symbol), None, shape, False, 0, lambda m: None)
    return {str(t.key) for t in extract_tasks(mod, load_profile("cpu"))}


def verdicts(db: Path) -> dict:
    return json.loads((db / META).read_text())["workloads"]


def assert_every_record_on_its_workload(db: Path) -> list:
    """Every record of ``db``, read as deploy reads it (TVM's own reader), measured on
    the workload it points at: its arguments are that workload's and its trace replays
    on it. MetaSchedule links a record to its workload by line number."""
    database = ms.database.JSONDatabase(
        path_workload=str(db / WORKLOADS), path_tuning_record=str(db / RECORDS), allow_missing=False
    )
    records = database.get_all_tuning_records()
    for record in records:
        expected = ms.arg_info.ArgInfo.from_prim_func(record.workload.mod["main"])
        assert [str(a.as_json()) for a in record.args_info] == [str(a.as_json()) for a in expected]
        record.trace.apply_to_schedule(s_tir.Schedule(record.workload.mod), remove_postproc=False)
    lines = (db / WORKLOADS).read_text().splitlines()
    assert len({json.loads(line)[0] for line in lines}) == len(lines)  # each workload once
    return records


def test_tuning_another_model_keeps_the_verdicts_of_the_first(models, tmp_path):
    """Without --resume the verdict file was written from empty: tuning model B into the
    folder made deploy fall back to the default rules for everything tuned for A."""
    db = tmp_path / "db"
    assert main(tune_command(models[TINY], TINY, db, 0)) == 0
    first = verdicts(db)
    assert set(first) == workload_keys(models[TINY], TINY)
    assert main(tune_command(models[OTHER], OTHER, db, 0)) == 0
    both = verdicts(db)
    assert {k: both.get(k) for k in first} == first
    assert workload_keys(models[OTHER], OTHER) <= set(both)


def test_two_tunes_at_once_keep_every_record_on_its_workload(models, tmp_path):
    """Two `edgecv tune` of two models into one folder at the same time: each appended
    workload lines numbered from what it had read, and the other's lines in between
    moved its records onto the wrong workloads."""
    db = tmp_path / "db"
    env = dict(os.environ, EDGECV_PROGRESS="0")
    runs = []
    for n, shape in enumerate((TINY, OTHER)):
        log = (tmp_path / f"tune{n}.log").open("w")
        command = [sys.executable, "-m", "edgecv.cli", *tune_command(models[shape], shape, db, 0)]
        runs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env))
    for n, run in enumerate(runs):
        assert run.wait(timeout=600) == 0, (tmp_path / f"tune{n}.log").read_text()[-3000:]
    records = assert_every_record_on_its_workload(db)
    keys = {str(int(tvm_ffi.structural_hash(r.workload.mod))) for r in records}
    for shape in (TINY, OTHER):
        mine = workload_keys(models[shape], shape)
        assert mine <= keys  # every workload of both models has its default's record
        assert mine <= set(verdicts(db))


WRITER = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[4])
from tuning_kernels import matmul_task, serial
from edgecv.profiles import load_profile
from edgecv.tuning.records import commit_schedule, open_database

folder, me, sizes = Path(sys.argv[1]), sys.argv[2], [int(n) for n in sys.argv[3].split(",")]
target = load_profile("cpu").tvm_target()
tasks = [matmul_task(n) for n in sizes]
db = open_database(folder)
(folder.parent / f"opened-{me}").touch()
while len(list(folder.parent.glob("opened-*"))) < 2:  # both opened before either writes
    time.sleep(0.01)
for _ in range(3):
    for n, task in zip(sizes, tasks):
        # the time says which workload the record was measured on
        commit_schedule(db, task.mod, serial(task, gpu=False), [n * 1e-6], target)
        time.sleep(0.002)
"""


def test_two_writers_at_once_keep_every_record_on_its_workload(tmp_path):
    """The database writer of `tune` driven from two processes at once, both having read
    the folder before either writes (the order that lost records in a real tune)."""
    db = tmp_path / "db"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    here = str(Path(__file__).parent)
    sizes = {"a": (8, 16, 24, 32), "b": (12, 20, 28, 36)}
    runs = [
        subprocess.Popen(
            [sys.executable, str(script), str(db), me, ",".join(map(str, n)), here],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for me, n in sizes.items()
    ]
    for run in runs:
        output, _ = run.communicate(timeout=300)
        assert run.returncode == 0, output[-3000:]
    records = assert_every_record_on_its_workload(db)
    assert len(records) == 3 * 8
    for record in records:
        size = int(ms.arg_info.ArgInfo.from_prim_func(record.workload.mod["main"])[0].shape[0])
        assert round(float(record.run_secs[0]) * 1e6) == size


def won_database(folder: Path, sizes=(16, 32)) -> list:
    """A database of matmul records whose verdicts say they beat today's CPU rules."""
    target = load_profile("cpu").tvm_target()
    db = open_database(folder)
    tasks = [matmul_task(n) for n in sizes]
    for task in tasks:
        commit_schedule(db, task.mod, serial(task, gpu=False), [1e-4], target)
    won = {"default_s": 2e-4, "best_s": 1e-4, "rules": target_rules(target)}
    write_meta(folder, {"kind": "llvm"}, {str(t.key): won for t in tasks})
    return tasks


@pytest.mark.parametrize("torn", [RECORDS, WORKLOADS])
def test_a_last_line_cut_short_is_left_out_with_a_warning(tmp_path, torn):
    """A second Ctrl-C (the process ends from a helper thread) or a power loss can leave
    half a line at the end of a file: deploy read none of the folder, and `tune --resume`
    could not open it."""
    target = load_profile("cpu").tvm_target()
    db = tmp_path / "db"
    tasks = won_database(db)
    path = db / torn
    whole = path.read_bytes()
    lines = whole.count(b"\n")
    path.write_bytes(whole + whole.splitlines(keepends=True)[-1][:20])  # half of a line
    where = rf"{torn}: line {lines + 1} was cut short"
    with pytest.warns(UserWarning, match=where) as caught:
        database = TuningDatabase([db])
    assert len(caught) == 1
    for task in tasks:  # the rest of the folder is read
        assert database.query(task.mod["main"], target) is not None
    assert path.read_bytes() == whole + whole.splitlines(keepends=True)[-1][:20]  # deploy reads
    with pytest.warns(UserWarning, match=where):  # tune (--resume or not) opens it, repaired
        resumed = open_database(db)
    assert path.read_bytes() == whole
    extra = matmul_task(24)
    commit_schedule(resumed, extra.mod, serial(extra, gpu=False), [1e-4], target)
    for task in tasks:
        assert len(records_of(resumed, task.mod)) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = TuningDatabase([db])
        assert again.query(tasks[0].mod["main"], target) is not None
    assert len(assert_every_record_on_its_workload(db)) == 3
