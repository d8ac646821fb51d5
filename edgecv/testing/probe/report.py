"""What the divergence probe finds: one line per stage, and the first that departs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StageDifference:
    """One internal output of the MXNet graph, edgecv's value against MXNet's.

    ``max_abs_diff`` and ``mxnet_drift`` are largest absolute differences (rows output:
    of the values sorted); ``ratio`` is the first over the larger of the second and one
    float32 step of the stage's scale. For index and row outputs ``sets_differ`` says
    whether edgecv's rows (index sets, kept boxes) differ from MXNet's and
    ``drift_sets_differ`` whether MXNet's own one-step runs changed them; None elsewhere.
    """

    name: str
    op: str
    max_abs_diff: float
    mxnet_drift: float
    ratio: float
    departs: bool
    sets_differ: bool | None = None
    drift_sets_differ: bool | None = None
    detail: str = ""
    scale: float = 0.0  # the largest magnitude in MXNet's output of the stage
    tie: bool = False  # edgecv's op alone on MXNet's inputs gives MXNet's answer
    follows_tie: str | None = None  # the tie stage this one reads, directly or not


@dataclass
class DivergenceReport:
    """The stages in the graph's (topological) order and the first one that departs."""

    stages: list[StageDifference]
    factor: float

    @property
    def first(self) -> StageDifference | None:
        return next((s for s in self.stages if s.departs), None)

    def table(self, limit: int | None = None) -> str:
        """One line per stage (the first ``limit``, and the first departing one)."""
        lines = [f"{'stage':60} {'op':28} {'max|diff|':>10} {'drift':>10} {'ratio':>9}  sets"]
        first = self.first
        for i, s in enumerate(self.stages):
            if limit is not None and i >= limit and s is not first:
                continue
            sets = "" if s.sets_differ is None else ("DIFFER" if s.sets_differ else "same")
            if s.drift_sets_differ:
                sets += " (mxnet drift too)"
            if s.tie:
                sets += " TIE (the op alone on MXNet's inputs gives MXNet's answer)"
            if s.follows_tie:
                sets += f" (follows the tie at {s.follows_tie})"
            mark = "  <-- first departure" if s is first else ""
            lines.append(
                f"{s.name[:60]:60} {s.op[:28]:28} {s.max_abs_diff:10.3g} {s.mxnet_drift:10.3g} "
                f"{s.ratio:9.3g}  {sets}{mark}" + (f"  [{s.detail}]" if s.detail else "")
            )
        verdict = (
            f"first departure: {first.name} (ratio {first.ratio:.3g} > {self.factor:g})"
            if first
            else f"no stage departs beyond {self.factor:g}x MXNet's own drift"
        )
        return "\n".join([*lines, verdict])
