"""Which default rules a measurement was made under.

Any edit to a rule can change a kernel's time. What was measured against the rules
(the graph tuner's cached costs, a tuning record's win over the default) holds only
for the rules of that day: a hash of their source says which those were, so nobody
has to remember to invalidate anything after an edit, at the price of a re-measure
after an edit that changed nothing.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

SCHEDULES = Path(__file__).parent


def rules_fingerprint(gpu: bool, schedules: Path = SCHEDULES) -> str:
    """A hash of the source of ``edgecv/schedules/gpu`` (OpenCL, CUDA) or
    ``edgecv/schedules/cpu``, each with ``edgecv/schedules/common`` (what both use;
    ``schedules``: another copy of the folder, for tests)."""
    digest = hashlib.sha256()
    for folder in ("gpu" if gpu else "cpu", "common"):
        for path in sorted((schedules / folder).glob("*.py")):
            digest.update(f"{folder}/{path.name}".encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def target_rules(target) -> str:
    """:func:`rules_fingerprint` of the rules that schedule kernels for ``target``: the
    GPU rules for a target with the ``gpu`` key (OpenCL, CUDA), else the CPU rules."""
    return rules_fingerprint(gpu="gpu" in target.keys)
