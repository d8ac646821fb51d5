"""Ship the graph tuner's measured costs with edgecv: merge a ``layout_costs.json`` (a
user's folder, or the ``--costs`` folder of ``benchmarks/graph_tuner.py``) into the
shipped database folder of each device class it holds, so a deploy of the same models
on the same device class measures nothing.

    python benchmarks/ship_layout_costs.py /tmp/edgecv-gt-costs/cpu

Only devices whose database folder is shipped (``device_profiles/tuning/<class>/``)
are merged (a CPU's costs key is its tuning device class and thread count); entries of
another edgecv or TVM version, or measured under default rules other than today's, are not read
(:class:`edgecv.graph_tuner.costs.CostCache`). Entries already shipped are replaced by
the newer measurement.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from edgecv.graph_tuner.costs import COSTS_FILE, CostCache, costs_folder_name
from edgecv.profiles import profiles_dir
from edgecv.schedules.fingerprint import rules_fingerprint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path, help=f"a folder holding {COSTS_FILE}")
    args = parser.parse_args()
    devices = json.loads((args.folder / COSTS_FILE).read_text()).get("devices", {})
    for device in devices:
        shipped = profiles_dir() / "tuning" / costs_folder_name(device)
        if not shipped.is_dir():
            print(f"{device}: no shipped database folder, skipped")
            continue
        rules = rules_fingerprint(gpu=not device.startswith("llvm"))  # the CPU meter's key
        source = CostCache([args.folder], None, device, rules)
        target = CostCache([shipped], shipped, device, rules)
        for key, seconds in source.entries.items():
            target.put(key, seconds)
        target.save()
        print(f"{device}: {len(source.entries)} costs -> {shipped / COSTS_FILE}")


if __name__ == "__main__":
    main()
