"""The schedule order of each target kind: tuned record -> default rules -> safe rule."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import tvm

from ..schedules.database import TuningDatabase
from ..schedules.stage import ScheduleOrder


def cpu_order(target: tvm.target.Target, database: TuningDatabase | None = None) -> ScheduleOrder:
    """edgecv's CPU rules for an LLVM target."""
    from ..schedules import cpu

    return ScheduleOrder(target, cpu.default_rules(target), cpu.safe_rule(), database)


def gpu_order(
    target: tvm.target.Target, subgroup: int | None, database: TuningDatabase | None = None
) -> ScheduleOrder:
    """edgecv's GPU rules for an OpenCL or CUDA target (``subgroup``: the device's Intel
    subgroup size, which adds the subgroup variants)."""
    from ..schedules import gpu

    return ScheduleOrder(target, gpu.default_rules(target, subgroup), gpu.safe_rule(), database)


def tuning_database(folders: Sequence[str | Path] | None) -> TuningDatabase | None:
    """The layered database of ``folders`` (first wins); None when tuning is off."""
    return None if folders is None else TuningDatabase(folders)
