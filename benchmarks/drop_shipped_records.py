"""Drop the records of some workloads from a shipped tuning database.

For records that a quiet re-measurement showed slower than the default rule (tuning
on a loaded machine can time the default badly and keep a worse search result). With
no record left, deploy schedules the workload with the default rule again. The
workload stays in the summary with ``best_s`` set back to ``default_s`` and the reason.

    python benchmarks/drop_shipped_records.py device_profiles/tuning/<class> \
        --kernel mobilenet1.0:fused_conv2d5_multiply3_add3_relu3 --why "..."

Find the candidates with ``edgecv bench PACKAGE --top N`` on a ``--no-tuning`` and a
tuned package of the same model (alternately, several rounds).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from edgecv.schedules.database import META, RECORDS, WORKLOADS, expand, pack


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--kernel", action="append", required=True, metavar="MODEL:KERNEL")
    parser.add_argument("--why", required=True)
    args = parser.parse_args()
    expand(args.folder)  # shipped gzipped: plain while edited, packed again below
    meta = json.loads((args.folder / META).read_text())
    hashes = [json.loads(line)[0] for line in (args.folder / WORKLOADS).read_text().splitlines()]
    dropped = set()
    for spec in args.kernel:
        model, _, kernel = spec.partition(":")
        found = [
            key
            for key, w in meta["workloads"].items()
            if w["model"] == model and kernel in w["kernels"]
        ]
        if len(found) != 1:
            raise SystemExit(f"{spec}: {len(found)} workloads match, expected one")
        entry = meta["workloads"][found[0]]
        entry["best_s"], entry["dropped"] = entry["default_s"], args.why
        dropped.add(hashes.index(found[0]))
    lines = (args.folder / RECORDS).read_text().splitlines()
    kept = [line for line in lines if json.loads(line)[0] not in dropped]
    (args.folder / RECORDS).write_text("".join(f"{line}\n" for line in kept))
    (args.folder / META).write_text(json.dumps(meta, indent=1) + "\n")
    pack(args.folder)  # a workload whose default now wins leaves the shipped files
    print(f"dropped {len(lines) - len(kept)} records of {len(dropped)} workloads")


if __name__ == "__main__":
    main()
