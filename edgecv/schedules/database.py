"""Tuned schedules, looked up per kernel: MetaSchedule's JSON database.

A database is a folder holding MetaSchedule's two JSON-lines files
(``database_workload.json``, ``database_tuning_record.json``); a kernel's record is
found by the structural hash of the kernel (as an IRModule whose one function is
``main``) and replayed on it as a schedule trace. Databases are kept one per device
class (MetaSchedule keys records by workload only, not target). Several databases layer:
the first that holds a kernel's record with a current verdict (below) decides (a user's
over the shipped one).

A database from another TVM version, or one that cannot be read, is skipped with a
warning: tuned records are an optimization, never a reason for a build to fail.

Shipped databases are stored gzipped (``database_workload.json.gz``, ...: each workload
line embeds a whole IRModule, and MetaSchedule's JSON compresses 15-fold) and pruned to
the workloads deploy can replay (:func:`pack`); deploy reads them through a plain copy
in the cache (:func:`plain_copy`), and a folder of plain files, a user's or an older
shipped one, reads as before.

A record is replayed only where tuning found a schedule faster than edgecv's default
rule, and only under the default rules it was compared with (``edgecv_database.json``
says so per workload, with :func:`~.fingerprint.target_rules`; the first database
holding a verdict under today's rules decides: a void verdict in a user's folder, from
before a rule edit, does not hide the shipped one compared since). Where the default won,
the record is that day's default; where the rules changed since, the record may have
beaten a rule that is gone; a record with no verdict (another tool's, or a search
stopped before its summary) was never compared: today's default rule schedules the
kernel in each case. (A record of the old default kept a kernel slow after its rule had
become far faster, and records with no verdict slowed a model:
benchmarks/results/packed_max_pool-2026-11-24.md.)

A folder may be written by several ``edgecv tune`` processes at once and read by deploys
meanwhile: every append takes the folder's lock (:func:`locked`, exclusive) and every
read holds it shared, so a reader never sees a record whose workload line it has not
read. A last line cut short (a process killed while writing it, a power loss) is left
out with a warning (:func:`read_database`; the next tune into the folder cuts it).
"""

from __future__ import annotations

import fcntl
import gzip
import json
import logging
import os
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import tvm
import tvm_ffi
from tvm import tirx

from ..board.errors import foreign_message
from .fingerprint import target_rules

log = logging.getLogger(__name__)

WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"
# Written beside the two files by edgecv: the TVM version that produced the records.
META = "edgecv_database.json"
GZ = ".gz"  # the shipped form of WORKLOADS and RECORDS
# flock()ed by whoever appends to the two files (exclusive) or reads them (shared): a
# record line names its workload by the workload's line number, so writers must number
# from the same lines, and a reader must not read a record before its workload's line.
LOCK = "edgecv_database.lock"
LOCK_NOTICE_S = 2.0  # a wait for the lock longer than this is said


class TuningDatabase:
    """Tuned records from one or more database folders (first one wins).

    Parameters
    ----------
    folders : sequence of path
        Database folders, highest priority first; missing folders are skipped.
    """

    def __init__(self, folders: Sequence[str | Path]):
        self._databases = []
        self.folders: list[Path] = []
        # per database: each workload's verdict (edgecv_database.json)
        self._verdicts: list[dict[int, dict]] = []
        self._fingerprints: dict[bool, str] = {}
        for folder in (Path(f) for f in folders):
            files = plain_copy(folder)
            if files is None:
                continue
            version = _recorded_version(folder)
            if version is not None and version != tvm.__version__:
                warnings.warn(
                    f"tuning database {folder} was written by TVM {version}, this is "
                    f"{tvm.__version__}: its records are ignored (re-tune with `edgecv tune`)",
                    stacklevel=2,
                )
                continue
            try:
                database = read_database(files)
            except Exception as err:  # corrupt or foreign files: build with the defaults
                warnings.warn(
                    f"tuning database {folder} cannot be read ({foreign_message(err, 160)}); "
                    "its records are ignored",
                    stacklevel=2,
                )
                continue
            self._databases.append(database)
            self.folders.append(folder)
            self._verdicts.append(_verdicts(folder))

    def _rules(self, target: tvm.target.Target) -> str:
        """Today's rules for ``target``, hashed once per rule set (CPU, GPU)."""
        gpu = "gpu" in target.keys
        if gpu not in self._fingerprints:
            self._fingerprints[gpu] = target_rules(target)
        return self._fingerprints[gpu]

    def __bool__(self) -> bool:
        return bool(self._databases)

    def _deciding(self, func: tirx.PrimFunc, target: tvm.target.Target):
        """The workload of ``func``, and the first database holding it with a verdict
        under today's rules, with that verdict; ``(mod, None, None)`` when none has."""
        mod = tvm.IRModule({"main": _workload(func)})
        key = int(tvm_ffi.structural_hash(mod))
        for database, verdicts in zip(self._databases, self._verdicts, strict=True):
            facts = verdicts.get(key)
            if _current(facts, self._rules(target)) and database.has_workload(mod):
                return mod, database, facts
        return mod, None, None  # never compared under today's rules anywhere

    def query(self, func: tirx.PrimFunc, target: tvm.target.Target) -> tirx.PrimFunc | None:
        """``func`` scheduled by its best tuned record, or None when no database has one
        that beat the default rule."""
        mod, database, facts = self._deciding(func, target)
        if database is None or not _beat_default(facts):
            return None
        sch = database.query_schedule(mod, target, workload_name="main")
        if sch is None:
            return None
        # the kernel's own name back: GPU lowering splits host and device code only for
        # an entry function
        symbol = func.attrs.get("global_symbol") if func.attrs else None
        return sch.mod["main"].with_attr("global_symbol", symbol) if symbol else sch.mod["main"]

    def best_seconds(self, func: tirx.PrimFunc, target: tvm.target.Target) -> float | None:
        """The measured time of ``func``'s best tuned record (the graph tuner's cost),
        or None when no database has one that :meth:`query` would replay."""
        mod, database, facts = self._deciding(func, target)
        if database is None or not _beat_default(facts):
            return None  # not replayed: the default rule's time counts
        record = database.query_tuning_record(mod, target, workload_name="main")
        if record is None or not record.run_secs:
            return None
        seconds = min(float(s) for s in record.run_secs)
        return seconds if seconds < 1e9 else None  # failed measurements: 1e10 s


def workload(func: tirx.PrimFunc) -> tvm.IRModule:
    """The IRModule a kernel is tuned and looked up as."""
    return tvm.IRModule({"main": _workload(func)})


def _workload(func: tirx.PrimFunc) -> tirx.PrimFunc:
    # The kernel's name is not part of what it computes: two models' identical convs
    # share one record.
    named = func.attrs is not None and "global_symbol" in func.attrs
    return func.without_attr("global_symbol") if named else func


def _verdicts(folder: Path) -> dict[int, dict]:
    """What tuning found per workload of ``folder`` (default vs best time, rules)."""
    try:
        workloads = json.loads((folder / META).read_text()).get("workloads", {})
        return {int(key): facts for key, facts in workloads.items() if isinstance(facts, dict)}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def _current(facts: dict | None, rules: str) -> bool:
    """Whether a workload's verdict compared its records with the default ``rules``."""
    return bool(facts) and facts.get("rules") == rules and facts.get("default_s") is not None


def _beat_default(facts: dict) -> bool:
    """Whether a workload's search beat the default rule (a current verdict)."""
    return facts.get("best_s") is not None and facts["best_s"] < facts["default_s"]


def _recorded_version(folder: Path) -> str | None:
    try:
        return json.loads((folder / META).read_text()).get("tvm")
    except (OSError, ValueError, AttributeError):
        return None


def write_meta(folder: Path, device_key: dict, workloads: dict | None = None) -> None:
    """Record which TVM wrote a database, the device class it holds records for and,
    per workload (structural hash), what tuning found (kernels, default vs best time).
    The file is replaced whole: a process killed while writing it (a second Ctrl-C, a
    power loss) leaves the verdicts before, not an empty file that voids them all."""
    from ..board.durable import write_bytes

    meta = {"tvm": tvm.__version__, "device": device_key}
    if workloads:
        meta["workloads"] = workloads
    write_bytes(folder / META, (json.dumps(meta, indent=1) + "\n").encode())


@contextmanager
def locked(folder: Path, exclusive: bool = True) -> Iterator[None]:
    """Hold ``folder``'s database lock (:data:`LOCK`): exclusive to append to or rewrite
    its two files, shared to read them. A reader of a folder with no lock file (a shipped
    one, a read-only one) reads without: no edgecv process writes there."""
    from ..board.errors import EdgecvError

    fd = None
    try:
        if exclusive:
            fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        else:
            fd = os.open(folder / LOCK, os.O_RDONLY)
    except OSError as err:
        if exclusive:
            raise EdgecvError(
                f"cannot write to the tuning database {folder} ({err.strerror}): "
                "name a folder you can write with --db"
            ) from None
    if fd is None:
        yield
        return
    try:
        _acquire(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, folder)
        yield
    finally:
        os.close(fd)  # releases the lock


def _acquire(fd: int, mode: int, folder: Path) -> None:
    """flock ``fd``, saying so once when another process holds it for long (a tune
    opening or a deploy reading a large folder: seconds)."""
    notice = time.monotonic() + LOCK_NOTICE_S
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if notice is not None and time.monotonic() > notice:
                from ..board import progress

                progress.say(f"waiting for another edgecv process using {folder}")
                notice = None
            time.sleep(0.01)


def torn_tail(path: Path) -> tuple[int, int] | None:
    """Where the last line of the JSON-lines file ``path`` was cut short: its number
    (from 1) and the offset of its first byte; None when the file ends with a whole
    line. A line and its newline are written at once, so a process killed while writing
    one, or a power loss, leaves a last line without its newline."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None
    if size == 0:
        return None
    with path.open("rb") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return None
        f.seek(0)
        data = f.read()
    start = data.rfind(b"\n") + 1
    return data.count(b"\n", 0, start) + 1, start


def cut_short(path: Path, line: int, what: str) -> str:
    """The warning about a last line cut short (:func:`torn_tail`)."""
    return (
        f"{path}: line {line} was cut short (a tune stopped while writing it, or a power "
        f"loss); it is {what}"
    )


def read_database(folder: Path):
    """MetaSchedule's database of the two plain files in ``folder``, read under the
    folder's shared lock. A last line cut short is left out, with a warning naming the
    file and line: the folder is not changed (the next tune into it cuts the line)."""
    from tvm.s_tir import meta_schedule as ms

    with locked(folder, exclusive=False), tempfile.TemporaryDirectory() as copy:
        paths = {}
        for name in (WORKLOADS, RECORDS):
            paths[name] = folder / name
            tail = torn_tail(folder / name)
            if tail is not None:
                warnings.warn(cut_short(folder / name, tail[0], "left out"), stacklevel=3)
                paths[name] = Path(copy) / name
                paths[name].write_bytes((folder / name).read_bytes()[: tail[1]])
        return ms.database.JSONDatabase(
            path_workload=str(paths[WORKLOADS]),
            path_tuning_record=str(paths[RECORDS]),
            allow_missing=False,
        )


def plain_copy(folder: Path) -> Path | None:
    """A folder holding ``folder``'s two files as plain JSON lines: itself, or for a
    gzipped (shipped) one a copy in the cache, named by the files' contents and written
    once; None when ``folder`` holds no database."""
    if (folder / WORKLOADS).is_file() and (folder / RECORDS).is_file():
        return folder
    packed = [folder / (name + GZ) for name in (WORKLOADS, RECORDS)]
    if not all(p.is_file() for p in packed):
        return None
    from ..board.runtime.kernel_cache import cache_dir, cache_key

    copy = cache_dir().parent / "databases" / cache_key(*(p.read_bytes() for p in packed))[:24]
    if not all((copy / name).is_file() for name in (WORKLOADS, RECORDS)):
        copy.mkdir(parents=True, exist_ok=True)
        for source, name in zip(packed, (WORKLOADS, RECORDS), strict=True):
            partial = copy / f".{name}.{os.getpid()}"
            partial.write_bytes(gzip.decompress(source.read_bytes()))
            os.replace(partial, copy / name)  # concurrent deploys write the same bytes
    return copy


def expand(folder: Path) -> None:
    """Turn a gzipped database folder back into plain files, in place (before tuning
    appends to it)."""
    from ..board.durable import write_bytes

    for name in (WORKLOADS, RECORDS):
        packed = folder / (name + GZ)
        if packed.is_file() and not (folder / name).is_file():
            # whole or not at all: a plain file, once there, is what the folder holds
            write_bytes(folder / name, gzip.decompress(packed.read_bytes()))
            packed.unlink()


def pack(folder: Path) -> tuple[int, int]:
    """The shipped form of a database folder, in place: only the workloads deploy can
    replay (those whose verdict in ``edgecv_database.json`` says a record beat the
    default rule; a workload without a verdict is kept), gzipped without a timestamp
    (the same records give the same bytes). Returns (workloads kept, workloads before)."""
    expand(folder)
    verdicts = _verdicts(folder)

    def kept(line: str) -> bool:
        facts = verdicts.get(int(json.loads(line)[0]))
        return facts is None or facts.get("default_s") is None or _beat_default(facts)

    workloads = (folder / WORKLOADS).read_text().splitlines()
    index = {i for i, line in enumerate(workloads) if kept(line)}
    records = [
        r for r in (folder / RECORDS).read_text().splitlines() if int(json.loads(r)[0]) in index
    ]
    # records point at workloads by line number: renumber them for the kept lines
    renumber = {old: new for new, old in enumerate(sorted(index))}
    records = [
        json.dumps([renumber[row[0]], row[1]], separators=(",", ":"))
        for row in map(json.loads, records)
    ]
    lines = {WORKLOADS: [workloads[i] for i in sorted(index)], RECORDS: records}
    for name, text in lines.items():
        data = "".join(f"{line}\n" for line in text).encode()
        (folder / (name + GZ)).write_bytes(gzip.compress(data, mtime=0))
        (folder / name).unlink()
    return len(index), len(workloads)
