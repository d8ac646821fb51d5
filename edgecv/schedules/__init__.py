"""The schedule stage: database record -> default rule -> safe rule, per kernel.

- :mod:`.stage`: the order and its contained attempts;
- :mod:`.orders`: the order of each target kind, and the layered database it reads;
- :mod:`.database`: tuned records (MetaSchedule's JSON database);
- :mod:`.device_class`: which database belongs to which device;
- :mod:`.cpu`, :mod:`.gpu`: edgecv's default rules, one kernel class per file.
"""

from .database import TuningDatabase
from .stage import KernelChoice, ScheduleOrder, rule_name

__all__ = ["KernelChoice", "ScheduleOrder", "TuningDatabase", "rule_name"]
