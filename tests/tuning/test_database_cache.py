"""A tuning database is parsed once per process while its files stay the same."""

from __future__ import annotations

import os

from edgecv.schedules.database import RECORDS, WORKLOADS
from edgecv.schedules.orders import tuning_database


def test_a_database_is_read_once_until_its_files_change(tmp_path):
    for name in (WORKLOADS, RECORDS):
        (tmp_path / name).write_text("")
    first = tuning_database([tmp_path])
    assert tuning_database([tmp_path]) is first
    assert tuning_database([str(tmp_path)]) is first
    records = tmp_path / RECORDS
    stat = records.stat()
    os.utime(records, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # rewritten
    assert tuning_database([tmp_path]) is not first
    assert tuning_database(None) is None
