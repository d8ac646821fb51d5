"""The soak benchmark in short (``heavy``: about 4 minutes on 2 cores): a detector
package served from 2 threads and loaded and dropped again and again, on the CPU and on
Intel's OpenCL runtime; nothing the process holds may grow and no result may differ.
The full run is ``python benchmarks/soak.py`` (100,000 inferences, 1,000 loads)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.heavy
def test_short_soak_holds_nothing_more_at_the_end(tmp_path):
    from test_opencl import device_or_skip

    device_or_skip("intel(r) opencl")
    out = tmp_path / "soak.json"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "soak.py"),
            "--inferences",
            "2000",
            "--loads",
            "30",
            "--devices",
            "cpu,deeplens:intel",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    results = json.loads(out.read_text())
    assert set(results) == {"cpu", "deeplens:intel"}
    for device, runs in results.items():
        assert runs["serve"]["wrong"] == 0, device
        assert runs["serve"]["inferences"] == 2000 and runs["reload"]["loads"] == 30
        for what, run in runs.items():
            assert run["grew"] == [], (device, what, run)
            assert run["end"]["threads"] <= run["start"]["threads"], (device, what)
