"""Where the graph tuner's costs come from for a profile: the meter that times kernels
on the device, and the cost files it reads and writes.

Costs are read from the user's folder (``--db DIR``, else
``$EDGECV_TUNING_DIR/<device>``, else ``tuning/<device>`` beside edgecv's kernel cache:
``~/.cache/edgecv/tuning/<device>``) and from the profile's tuning database folders;
new measurements are written to the user's folder only.
"""

from __future__ import annotations

import platform
import re
from pathlib import Path

from ..profiles import Profile
from ..schedules.device_class import cpu_class, user_tuning_dir
from ..schedules.fingerprint import target_rules
from ..schedules.orders import cpu_order, tuning_database
from .costs import CostCache


def user_costs_folder(device_key: str) -> Path:
    """The default folder of a device's measured costs: the device's folder among the
    user's tuning databases (:func:`edgecv.schedules.device_class.user_tuning_dir`)."""
    return user_tuning_dir() / re.sub(r"[^A-Za-z0-9_.-]+", "-", device_key).strip("-")


def meter_for(profile: Profile, options):
    """(meter, cost cache, why not): the meter is None when the profile's device is not
    on this machine."""
    database = tuning_database(options.tuning)
    if profile.runtime == "cpu":
        from .measure import CpuMeter

        target = profile.tvm_target()
        arch, here = cpu_class(target).key["arch"], platform.machine()
        if arch != here:
            return None, None, f"{arch} kernels cannot be timed on this {here} machine"
        meter = CpuMeter(
            target, cpu_order(target, database), options.kernel_time_limit_s, options.workers
        )
    elif profile.runtime == "opencl":
        from .opencl_meter import opencl_meter

        meter, why_not = opencl_meter(profile, options, database)
        if meter is None:
            return None, None, why_not
    else:
        return None, None, f"no way to time kernels on {profile.runtime} devices yet"
    writable = Path(options.layout_costs) if options.layout_costs else None
    writable = writable or user_costs_folder(meter.device_key)
    folders = [writable, *(Path(f) for f in (options.tuning or ()))]
    rules = target_rules(meter.target)
    return meter, CostCache(folders, writable, meter.costs_key, rules), ""
