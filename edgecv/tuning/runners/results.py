"""Runner futures that are complete when made: edgecv's runners time synchronously
(one device, one candidate at a time) and hand MetaSchedule finished results."""

from __future__ import annotations

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import PyRunnerFuture, RunnerResult

from ...schedules.stage import one_line


@derived_object
class Finished(PyRunnerFuture):
    """A runner future that holds its result already."""

    def __init__(self, seconds: list[float] | None, error: str | None):
        super().__init__()
        self.seconds, self.error = seconds, error

    def done(self) -> bool:
        return True

    def result(self) -> RunnerResult:
        return RunnerResult(self.seconds, self.error)


def done(seconds: list[float]) -> Finished:
    return Finished([float(s) for s in seconds], None)


def failed(err: BaseException | str) -> Finished:
    return Finished(None, err if isinstance(err, str) else one_line(err))
