"""The tuning database on disk: MetaSchedule's JSON database, one folder per device class.

Layout of a folder (``<cache>/tuning/<class>/`` while tuning, pruned copies under
``device_profiles/tuning/<class>/`` for shipping)::

    database_workload.json       MetaSchedule: one line per workload (structural hash + IR)
    database_tuning_record.json  MetaSchedule: one line per measured schedule (trace, seconds)
    edgecv_database.json         edgecv: TVM version, device class key, per-workload summary

Both JSON-lines files are append-only: a tuning run stopped at any point (Ctrl-C, a
crash) leaves every record finished so far. Each workload also holds its *default*
schedule (edgecv's rule, the one deploy uses without a database) as an ordinary trace
record with its measured time, so the best record of a workload is never slower than
the default: deploy never gets slower from tuning.

Several tunes may write one folder at once (two models for one device class, a fleet
each): a record line names its workload by the workload's line number, so each process
appends under the folder's lock, numbering from the lines on disk
(:class:`FolderDatabase`), and the verdicts of ``edgecv_database.json`` are merged
under it, never replaced (:func:`merge_verdicts`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import tvm
import tvm_ffi
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from ..board.errors import EdgecvError, foreign_message
from ..graph_tuner.costs import COSTS_FILE
from ..schedules.database import (
    GZ,
    LOCK,
    META,
    RECORDS,
    WORKLOADS,
    cut_short,
    expand,
    locked,
    pack,
    plain_copy,
    read_database,
    torn_tail,
    write_meta,
)
from ..schedules.device_class import DeviceClass

FAILED_RUN_S = 1e10  # what MetaSchedule stores for a candidate that failed
FAILED_S = 1e9  # a record at or above: failed


def check_database_folder(folder: Path) -> None:
    """Refuse a ``--db`` that edgecv must not write into: a file, or a folder holding
    other files than a tuning database's (``~/Documents`` by a slip of the keyboard)."""
    if folder.exists() and not folder.is_dir():
        raise EdgecvError(
            f"--db {folder} is a file, not a folder: name a folder for the "
            "tuning records (it is created when missing)"
        )
    ours = {WORKLOADS, RECORDS, WORKLOADS + GZ, RECORDS + GZ, META, COSTS_FILE, LOCK}
    # files written beside themselves then renamed, left by a process killed meanwhile
    partial = ("layout_costs.", f".{META}.", f".{WORKLOADS}.", f".{RECORDS}.")
    if folder.is_dir():
        names = [p.name for p in folder.iterdir()]
        others = sorted(n for n in names if n not in ours and not n.startswith(partial))
        if others:
            raise EdgecvError(
                f"--db {folder} holds files that are not an edgecv tuning database "
                f"({', '.join(others[:3])}{' ...' if len(others) > 3 else ''}); edgecv will "
                "not write into it: name a new or empty folder, or an earlier --db folder"
            )


def open_database(folder: Path) -> FolderDatabase:
    """The JSON database in ``folder``, to add records to (created when missing; a
    gzipped, shipped one is made plain first), safe beside other processes writing it."""
    folder.mkdir(parents=True, exist_ok=True)
    return FolderDatabase(folder)


def _json_line(value) -> str:
    """A workload's or record's JSON (``WorkloadAsJSON``, ``TuningRecordAsJSON``) as a line
    of MetaSchedule's files, written as TVM's own writer writes it: TVM's numbers as
    numbers, an object a trace takes as input (a layout's IndexMap) as TVM's JSON of it
    in a string."""

    def plain(value):
        if value is None or isinstance(value, (bool, int, float, str)):
            return str(value) if isinstance(value, str) else value
        if isinstance(value, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
            return value.value
        if isinstance(value, (tvm_ffi.Array, list)):
            return [plain(v) for v in value]
        if isinstance(value, tvm_ffi.Map):
            return {str(k): plain(v) for k, v in value.items()}
        return tvm.ir.save_json(value)

    return json.dumps(plain(value), separators=(",", ":"))


_workload_json = tvm_ffi.get_global_func("s_tir.meta_schedule.WorkloadAsJSON")
_record_json = tvm_ffi.get_global_func("s_tir.meta_schedule.TuningRecordAsJSON")


@derived_object
class FolderDatabase(ms.database.PyDatabase):
    """MetaSchedule's JSON database in a folder that other processes may append to at
    the same time, in MetaSchedule's own format (deploy reads it with TVM's reader).

    MetaSchedule's ``JSONDatabase`` numbers the workloads it appends from the lines it
    read when it opened: two tunes into one folder both numbered their first new
    workload as the same line, and the records of one pointed at the other's. Here the
    records live in memory for the search's queries, and every line is appended under
    the folder's lock (:func:`~edgecv.schedules.database.locked`), a new workload at the
    line number the file has then (a workload another process added meanwhile is taken,
    not written twice). A workload line is fsynced before any record names it.
    """

    def __init__(self, folder: Path):
        super().__init__()
        self.folder = folder
        self._memory = ms.database.MemoryDatabase(module_equality="structural")
        self._lines: dict[int, int] = {}  # workload (structural hash) -> its line, from 0
        self._count = 0  # workload lines read
        self._read = 0  # bytes of the workload file read
        with locked(folder):
            expand(folder)
            for name in (WORKLOADS, RECORDS):
                self._cut_torn_tail(name)
            try:
                loaded = ms.database.JSONDatabase(
                    path_workload=str(folder / WORKLOADS),
                    path_tuning_record=str(folder / RECORDS),
                    module_equality="structural",
                )
            except Exception as err:  # TVM's reader: a line edited by hand, a stale trace
                raise EdgecvError(
                    f"tuning database {folder} cannot be read ({foreign_message(err, 160)}): "
                    "move it aside, or tune into another folder with --db"
                ) from None
            self._sync()  # the lines TVM's reader accepted
        # under this database's workload objects: a query then finds a record by identity
        # rather than by comparing whole IRModules
        ours: dict = {}
        for record in loaded.get_all_tuning_records():
            if record.workload not in ours:
                ours[record.workload] = self._memory.commit_workload(record.workload.mod)
            self._memory.commit_tuning_record(
                ms.database.TuningRecord(
                    record.trace,
                    ours[record.workload],
                    record.run_secs,
                    record.target,
                    record.args_info,
                )
            )

    def has_workload(self, mod: tvm.IRModule) -> bool:
        return self._memory.has_workload(mod)

    def commit_workload(self, mod: tvm.IRModule):
        workload = self._memory.commit_workload(mod)
        key = int(tvm_ffi.structural_hash(mod))
        if key not in self._lines:
            with locked(self.folder):
                self._sync()
                if key not in self._lines:
                    self._append(WORKLOADS, _json_line(_workload_json(workload)), durable=True)
                    self._lines[key] = self._count - 1
        return workload

    def commit_tuning_record(self, record) -> None:
        key = int(tvm_ffi.structural_hash(record.workload.mod))
        if key not in self._lines:
            self.commit_workload(record.workload.mod)
        line = _json_line([self._lines[key], _record_json(record)])
        with locked(self.folder):
            self._append(RECORDS, line)
        self._memory.commit_tuning_record(record)

    def get_top_k(self, workload, top_k: int) -> list:
        return self._memory.get_top_k(workload, top_k)

    def get_all_tuning_records(self) -> list:
        return self._memory.get_all_tuning_records()

    def query_tuning_record(self, mod, target, workload_name=None):
        return self._memory.query_tuning_record(mod, target, workload_name)

    def query_schedule(self, mod, target, workload_name=None):
        return self._memory.query_schedule(mod, target, workload_name)

    def query_ir_module(self, mod, target, workload_name=None):
        return self._memory.query_ir_module(mod, target, workload_name)

    def __len__(self) -> int:
        return len(self._memory)

    def _sync(self) -> None:
        """Read the workload lines appended since the last read (by any process); under
        the lock."""
        path = self.folder / WORKLOADS
        if not path.is_file():
            return
        with path.open("rb") as f:
            if os.fstat(f.fileno()).st_size < self._read:
                raise EdgecvError(
                    f"{path} was rewritten by another program while this tune added to it; "
                    "its records cannot be numbered: tune again into another folder (--db)"
                )
            f.seek(self._read)
            data = f.read()
        whole = data[: data.rfind(b"\n") + 1]  # a line cut short is cut before appending
        for line in whole.splitlines():
            # a line is ["<structural hash>","<base64 IRModule>"]: the hash alone is read
            self._lines.setdefault(int(line[2 : line.index(b'"', 2)]), self._count)
            self._count += 1
        self._read += len(whole)

    def _append(self, name: str, line: str, durable: bool = False) -> None:
        """Append ``line`` to the file ``name``, whole; under the lock."""
        self._cut_torn_tail(name)
        data = line.encode() + b"\n"
        fd = os.open(self.folder / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        if name == WORKLOADS:
            self._count += 1
            self._read += len(data)

    def _cut_torn_tail(self, name: str) -> None:
        """Cut a last line cut short (a process killed while writing it), with a
        warning: a line appended after it would join it. Under the lock."""
        path = self.folder / name
        tail = torn_tail(path)
        if tail is not None:
            warnings.warn(cut_short(path, tail[0], "removed"), stacklevel=2)
            os.truncate(path, tail[1])


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
        files = plain_copy(folder)
        if files is None:
            continue
        added = set()
        for record in read_database(files).get_all_tuning_records():
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
        pruned = ms.database.JSONDatabase(  # a folder of this process alone: no lock
            path_workload=str(staging / WORKLOADS),
            path_tuning_record=str(staging / RECORDS),
            module_equality="structural",
        )
        merged.dump_pruned(pruned)
        if (destination / COSTS_FILE).is_file():  # the graph tuner's, beside the records
            shutil.copy2(destination / COSTS_FILE, staging / COSTS_FILE)
        shipped = read_verdicts(destination) | summary
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


def merge_verdicts(folder: Path, device_key: dict, verdicts: dict) -> dict:
    """Write ``verdicts`` (per workload: what this tune found) into ``folder``'s
    ``edgecv_database.json`` over the verdicts already there, and return them all.

    Under the folder's lock, read again: the verdicts of the models tuned into the
    folder before (or meanwhile, by another tune) stay, and deploy keeps replaying
    their records. The records are fsynced first: a verdict never outlives the records
    it was decided on."""
    with locked(folder):
        records = folder / RECORDS
        if records.is_file():
            with records.open("rb") as f:
                os.fsync(f.fileno())
        merged = {**read_verdicts(folder), **verdicts}
        write_meta(folder, device_key, merged)
    return merged


def read_verdicts(folder: Path) -> dict:
    """The per-workload verdicts of ``folder``'s ``edgecv_database.json`` ({} if none)."""
    try:
        workloads = json.loads((folder / META).read_text()).get("workloads", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return workloads if isinstance(workloads, dict) else {}
