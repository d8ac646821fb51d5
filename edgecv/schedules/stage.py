"""The schedule stage: for every kernel, in order, a tuned record from the device's
database, edgecv's default rule for the kernel's class, and a safe rule that always
compiles.

:class:`ScheduleOrder` holds the order for one target; :meth:`ScheduleOrder.attempts`
yields the candidates of one kernel lazily, each a scheduled PrimFunc or the reason the
rule failed on it (an exception inside a rule is contained and reported, never raised).
A rule that is not for the kernel (returns None) is skipped without a word. The code
stage (:mod:`edgecv.codegen.contained`) compiles the candidates in that order under a
time limit and keeps the first that compiles; what was chosen and why the ones before
it were passed over is recorded in the package manifest.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight
from tvm_ffi.serialization import from_json_graph_str

from .database import TuningDatabase

# The attribute TVM's default-schedule machinery sets on a scheduled PrimFunc; kernels
# that arrive with it (edgecv's own GPU operators, written scheduled) are used as is.
SCHEDULED = "tirx.is_scheduled"

TUNED = "tuned"  # the name of the database candidate
AS_WRITTEN = "as-written"  # a kernel that arrived scheduled


@dataclass
class Candidate:
    """One attempt at scheduling a kernel: ``func`` is None when the rule failed."""

    index: int
    rule: str
    func: tirx.PrimFunc | None = None
    error: str = ""


@dataclass
class KernelChoice:
    """What scheduled a kernel (``rule`` None: nothing compiled) and why the rules
    before it were passed over: ``(rule, reason)`` pairs."""

    kernel: str
    rule: str | None
    passed_over: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {
            "rule": self.rule,
            "passed_over": [list(p) for p in self.passed_over],
            "seconds": round(self.seconds, 3),
        }


def rule_name(rule: dlight.ScheduleRule) -> str:
    """``cpu.Conv2D``, ``gpu.DepthwiseConv``, ``dlight.Reduction``: where a rule comes
    from and its class, as the manifest and ``--explain`` show it."""
    module = type(rule).__module__
    if module.startswith("edgecv.schedules."):
        family = module.split(".")[2]
    elif ".dlight." in module:
        family = "dlight"
    else:
        family = module.rsplit(".", 1)[-1]
    return f"{family}.{type(rule).__name__}"


@dataclass
class ScheduleOrder:
    """The order of candidates for one target.

    Parameters
    ----------
    target : tvm.target.Target
        The target the kernels are scheduled for (rules read its attributes).
    rules : sequence of dlight.ScheduleRule
        The default rules, tried in order.
    safe : dlight.ScheduleRule
        The rule that always applies, tried last.
    database : TuningDatabase, optional
        Tuned records, tried first (``None``: defaults only, as ``--no-tuning``).
    """

    target: tvm.target.Target
    rules: Sequence[dlight.ScheduleRule]
    safe: dlight.ScheduleRule
    database: TuningDatabase | None = None

    def names(self, func: tirx.PrimFunc) -> list[str]:
        """The candidates' names for ``func``, in order (indices of :meth:`attempts`)."""
        if _is_scheduled(func):
            return [AS_WRITTEN]
        return [TUNED, *(rule_name(r) for r in self.rules), rule_name(self.safe)]

    def attempts(self, func: tirx.PrimFunc, start: int = 0) -> Iterator[Candidate]:
        """Yield the candidates for ``func`` from index ``start`` on (see the module
        docstring); rules that are not for this kernel are skipped."""
        for index in range(start, len(self.names(func))):
            candidate = self.candidate(func, index)
            if candidate is not None:
                yield candidate

    def candidate(self, func: tirx.PrimFunc, index: int) -> Candidate | None:
        """Candidate ``index`` of ``func`` (see :meth:`names`): the scheduled kernel, the
        reason its rule failed, or None when the rule is not for this kernel."""
        name = self.names(func)[index]
        if name == AS_WRITTEN:
            return Candidate(index, name, func)
        if 0 < index <= len(self.rules) and not _has_blocks(func):
            return None  # plain loops (a TE extern: ROIAlign's CPU version): the safe rule's
        try:
            if index == 0:
                scheduled = self.database.query(func, self.target) if self.database else None
            else:
                rule = self.rules[index - 1] if index <= len(self.rules) else self.safe
                scheduled = _apply(rule, func, self.target)
        except Exception as err:  # a rule that breaks on this kernel: the next one
            return Candidate(index, name, None, one_line(err))
        return None if scheduled is None else Candidate(index, name, scheduled)


def copy_of(node):
    """A copy of a TVM object (a kernel, a module) sharing no statement with it. Through
    TVM's JSON, read back without ``tvm.ir.load_json``'s upgrade of older TVMs' JSON: this
    TVM wrote it, and that upgrade (a pure-Python re-encoding of the whole graph, indented)
    took several times as long as the copy itself."""
    return from_json_graph_str(tvm.ir.save_json(node))


def _apply(rule: dlight.ScheduleRule, func: tirx.PrimFunc, target) -> tirx.PrimFunc | None:
    symbol = func.attrs.get("global_symbol") if func.attrs else None
    bare = func.without_attr("global_symbol") if symbol else func
    # A schedule may rewrite the function it was given in place (seen in TVM 0.27): each
    # rule gets its own copy, so a rule that fails halfway leaves nothing behind.
    bare = copy_of(bare)
    with target:
        sch = rule.apply(bare, target, False)
    if sch is None:
        return None
    if isinstance(sch, list):  # a tunable rule's several candidates: the first one
        sch = sch[0]
    scheduled = sch.mod["main"].with_attr(SCHEDULED, True)
    return scheduled.with_attr("global_symbol", symbol) if symbol else scheduled


def _has_blocks(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` is written in blocks (what the default rules schedule), not as
    plain loops; every default rule would fail on the missing root block."""
    try:
        s_tir.Schedule(func).get_sblock("root")
    except s_tir.ScheduleError:
        return False
    return True


def _is_scheduled(func: tirx.PrimFunc) -> bool:
    return bool(func.attrs) and bool(func.attrs.get(SCHEDULED, False))


def one_line(err: BaseException) -> str:
    """The informative line of a TVM error (its last non-empty line), shortened."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    text = lines[-1] if lines else type(err).__name__
    return f"{type(err).__name__}: {text}"[:240]
