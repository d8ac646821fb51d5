"""The CPU thread pool edgecv configures when it is imported: every core the process may
use, workers unpinned; what the user set is kept."""

from __future__ import annotations

import os
import subprocess
import sys

SHOW = "import edgecv, os; print(os.environ['TVM_NUM_THREADS'], os.environ['TVM_BIND_THREADS'])"


def _imported_with(**env: str) -> list[str]:
    clean = {
        k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "TVM_BIND_THREADS")
    }
    result = subprocess.run(
        [sys.executable, "-c", SHOW], env={**clean, **env}, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    return result.stdout.split()


def test_importing_edgecv_uses_every_core_with_unpinned_workers():
    # pinned workers and an unpinned caller shared a core whenever the OS put the caller
    # on a worker's: mobilenet1.0 on 2 cores took 5.8-6.3 ms instead of 3.0
    assert _imported_with() == [str(len(os.sched_getaffinity(0))), "0"]


def test_the_users_thread_settings_are_kept():
    assert _imported_with(TVM_NUM_THREADS="3", TVM_BIND_THREADS="1") == ["3", "1"]
