"""The schedule order of each target kind: tuned record -> default rules -> safe rule."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import tvm

from .database import GZ, RECORDS, WORKLOADS, TuningDatabase
from .stage import ScheduleOrder


def cpu_order(target: tvm.target.Target, database: TuningDatabase | None = None) -> ScheduleOrder:
    """edgecv's CPU rules for an LLVM target."""
    from . import cpu

    return ScheduleOrder(target, cpu.default_rules(target), cpu.safe_rule(), database)


def gpu_order(
    target: tvm.target.Target, subgroup: int | None, database: TuningDatabase | None = None
) -> ScheduleOrder:
    """edgecv's GPU rules for an OpenCL or CUDA target (``subgroup``: the device's Intel
    subgroup size, which adds the subgroup variants)."""
    from . import gpu

    return ScheduleOrder(target, gpu.default_rules(target, subgroup), gpu.safe_rule(), database)


def tuning_database(folders: Sequence[str | Path] | None) -> TuningDatabase | None:
    """The layered database of ``folders`` (first wins); None when tuning is off.

    Read once per process while its files stay as they are: parsing the shipped
    AVX-512 database (24 MB) takes 9 s, and a deploy asks for it twice (the graph
    tuner's meter, then the kernel compiles). A file rewritten since (``edgecv tune``
    in the same process) changes the key and is read again."""
    if folders is None:
        return None
    key = tuple((str(f), *_stamp(Path(f))) for f in folders)
    if key not in _DATABASES:
        _DATABASES.clear()  # one layered database at a time is all a process needs
        _DATABASES[key] = TuningDatabase(folders)
    return _DATABASES[key]


_DATABASES: dict[tuple, TuningDatabase] = {}


def _stamp(folder: Path) -> tuple:
    """What changes when a database folder's files are rewritten."""
    stamps = []
    for name in (WORKLOADS, RECORDS, WORKLOADS + GZ, RECORDS + GZ):
        try:
            stat = (folder / name).stat()
            stamps.append((stat.st_mtime_ns, stat.st_size))
        except OSError:
            stamps.append(None)
    return tuple(stamps)
