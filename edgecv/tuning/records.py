"""The tuning database on disk: MetaSchedule's JSON database, one folder per device class.

Layout of a folder (``<cache>/tuning/<class>/`` while tuning, pruned copies under
``edgecv/data/device_profiles/tuning/<class>/`` for shipping)::

    database_workload.json       MetaSchedule: one line per workload (structural hash + IR)
    database_tuning_record.json  MetaSchedule: one line per measured schedule (trace, seconds)
    edgecv_database.json         edgecv: TVM version, device class key, per-workload summary

Both JSON-lines files are append-only: a tuning run stopped at any point (Ctrl-C, a
crash) leaves every record finished so far. Each workload also holds its *default*
schedule (edgecv's rule, the one deploy uses without a database) as an ordinary trace
record with its measured time, so the best record of a workload is never slower than
the default: deploy never gets slower from tuning.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms

from ..graph_tuner.costs import COSTS_FILE
from ..schedules.database import (
    GZ,
    META,
    RECORDS,
    WORKLOADS,
    expand,
    pack,
    plain_copy,
    write_meta,
)
from ..schedules.device_class import DeviceClass

FAILED_RUN_S = 1e10  # what MetaSchedule stores for a candidate that failed
FAILED_S = 1e9  # a record at or above: failed


def check_database_folder(folder: Path) -> None:
    """Refuse a ``--db`` that edgecv must not write into: a file, or a folder holding
    other files than a tuning database's (``~/Documents`` by a slip of the keyboard)."""
    from ..errors import EdgecvError

    if folder.exists() and not folder.is_dir():
        raise EdgecvError(
            f"--db {folder} is a file, not a folder: name a folder for the "
            "tuning records (it is created when missing)"
        )
    ours = {WORKLOADS, RECORDS, WORKLOADS + GZ, RECORDS + GZ, META, COSTS_FILE}
    if folder.is_dir():
        # a costs file is written beside itself then renamed (``layout_costs.<pid>.tmp``)
        names = [p.name for p in folder.iterdir()]
        others = sorted(n for n in names if n not in ours and not n.startswith("layout_costs."))
        if others:
            raise EdgecvError(
                f"--db {folder} holds files that are not an edgecv tuning database "
                f"({', '.join(others[:3])}{' ...' if len(others) > 3 else ''}); edgecv will "
                "not write into it: name a new or empty folder, or an earlier --db folder"
            )


def open_database(folder: Path) -> ms.database.JSONDatabase:
    """The JSON database in ``folder`` (created when missing; a gzipped, shipped one is
    made plain first, so records can be added)."""
    folder.mkdir(parents=True, exist_ok=True)
    expand(folder)
    return ms.database.JSONDatabase(
        path_workload=str(folder / WORKLOADS),
        path_tuning_record=str(folder / RECORDS),
        module_equality="structural",
    )


def commit_schedule(db, mod: tvm.IRModule, sch, seconds: list[float], target) -> None:
    """Store ``sch`` (a schedule of the workload ``mod``) as a record measured at
    ``seconds``."""
    args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    record = ms.database.TuningRecord(sch.trace, db.commit_workload(mod), seconds, target, args)
    db.commit_tuning_record(record)


def records_of(db, mod: tvm.IRModule) -> list:
    """Every record of the workload ``mod`` (failed ones included)."""
    if not db.has_workload(mod):
        return []
    return list(db.get_top_k(db.commit_workload(mod), 1 << 30))


def best_seconds(db, mod: tvm.IRModule) -> float | None:
    """Mean seconds of the workload's best record, None when it has none that ran."""
    best = None
    for record in records_of(db, mod):
        if record.run_secs:
            mean = sum(float(s) for s in record.run_secs) / len(record.run_secs)
            if mean < FAILED_S and (best is None or mean < best):
                best = mean
    return best


def ship(work: Path, destination: Path, device: DeviceClass, summary: dict) -> int:
    """Merge the records of ``work`` into ``destination`` (the shipped folder), keeping
    only the best record per workload (``Database.dump_pruned``), among ``work``'s for
    the workloads it holds (below); returns the number of
    workloads shipped. The folder is written aside and renamed in, whole, with the
    graph tuner's layout costs it held."""
    merged = ms.database.MemoryDatabase(module_equality="structural")
    # The work folder's records first, and the shipped folder's only for workloads the
    # work folder lacks: a workload's verdict was decided on the work folder's best
    # record, and a shipped record timed faster in another session (another moment)
    # would otherwise take its place unraced.
    held: set[int] = set()
    for folder in (work, destination):
        if plain_copy(folder) is None:
            continue
        added = set()
        for record in open_database(folder).get_all_tuning_records():
            key = int(tvm_ffi.structural_hash(record.workload.mod))
            if key in held or not record.run_secs:
                continue
            if min(float(s) for s in record.run_secs) < FAILED_S:
                # under the merged database's own workload: a record keeps its source's,
                # and pruning is per workload object (two folders holding one workload
                # shipped it twice)
                same = merged.commit_workload(record.workload.mod)
                merged.commit_tuning_record(
                    ms.database.TuningRecord(
                        record.trace, same, record.run_secs, record.target, record.args_info
                    )
                )
                added.add(key)
        held |= added
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}-", dir=destination.parent))
    try:
        pruned = open_database(staging)
        merged.dump_pruned(pruned)
        if (destination / COSTS_FILE).is_file():  # the graph tuner's, beside the records
            shutil.copy2(destination / COSTS_FILE, staging / COSTS_FILE)
        shipped = _summary_of(destination) | summary
        write_meta(staging, device.key, shipped)
        count, _ = pack(staging)  # only what deploy replays, gzipped
        old = destination.with_name(destination.name + ".old")
        if destination.exists():
            destination.rename(old)
        staging.rename(destination)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return count


def _summary_of(folder: Path) -> dict:
    try:
        return json.loads((folder / META).read_text()).get("workloads", {})
    except (OSError, ValueError, AttributeError):
        return {}
