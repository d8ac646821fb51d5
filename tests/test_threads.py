"""The CPU thread pool edgecv configures when it is imported: every core the process may
use, workers unpinned; what the user set is kept."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SHOW = "import edgecv, os; print(os.environ['TVM_NUM_THREADS'], os.environ['TVM_BIND_THREADS'])"


def _imported_with(**env: str) -> list[str]:
    clean = {
        k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "TVM_BIND_THREADS")
    }
    result = subprocess.run(
        [sys.executable, "-c", SHOW],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.split()


def test_importing_edgecv_uses_every_core_with_unpinned_workers():
    # pinned workers and an unpinned caller shared a core whenever the OS put the caller
    # on a worker's: mobilenet1.0 on 2 cores took 5.8-6.3 ms instead of 3.0
    assert _imported_with() == [str(len(os.sched_getaffinity(0))), "0"]


def test_the_users_thread_settings_are_kept():
    assert _imported_with(TVM_NUM_THREADS="3", TVM_BIND_THREADS="1") == ["3", "1"]


WORK = """
import os, sys
import numpy as np
import edgecv

model = edgecv.load(sys.argv[1])
x = np.random.RandomState(0).rand(1, 3, 96, 96).astype(np.float32)
for _ in range(5):
    model.run(x)
def cpu_ticks():
    ticks = {}
    for task in os.listdir("/proc/self/task"):
        fields = open(f"/proc/self/task/{task}/stat").read().rsplit(")", 1)[1].split()
        ticks[task] = int(fields[11]) + int(fields[12])  # utime + stime
    return ticks
before = cpu_ticks()
for _ in range(150):
    model.run(x)
after = cpu_ticks()
used = sorted((after[t] - before.get(t, 0) for t in after), reverse=True)
print(sum(1 for u in used if u >= 0.3 * used[0]))  # threads that did a share of the work
"""


def test_the_kernels_run_on_as_many_threads_as_cores(tmp_path):
    """What the settings are for: an inference's kernels keep every core busy (the
    calling thread and TVM's workers each do a share of the work), and a process that
    asked for one thread runs them on one."""
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("one core: nothing to split")
    from graph_tuner.small_model import export_small_model

    from edgecv.deploy import deploy
    from edgecv.pipelines import BuildOptions

    symbol, params = export_small_model(tmp_path / "small")
    package = deploy(
        str(symbol),
        tmp_path / "pkg",
        "cpu",
        params=str(params),
        input_shape=(1, 3, 96, 96),
        options=BuildOptions(check_on=None, layout="NCHW", tuning=None),
    )
    clean = {k: v for k, v in os.environ.items() if k != "TVM_NUM_THREADS"}

    def busy_threads(**env: str) -> int:
        done = subprocess.run(
            [sys.executable, "-c", WORK, str(package)],
            env={**clean, **env},
            capture_output=True,
            text=True,
            check=True,
        )
        return int(done.stdout.split()[-1])

    assert busy_threads() == cores
    assert busy_threads(TVM_NUM_THREADS="1") == 1
