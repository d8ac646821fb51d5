"""The tuning builder: MetaSchedule candidates compiled in forked children.

TVM's ``LocalBuilder`` starts fresh worker processes that import
``tvm.s_tir.tensor_intrin`` (~35 s here) on every build; forks of the tuning process
cost milliseconds and already hold everything imported. Each candidate is compiled by
the deploy stage's own contained compile (:func:`edgecv.codegen.contained.compile_contained`:
one forked child per candidate, a time limit each, a crash contained), so what a
candidate is built into is what deploy would build from the same schedule.

What a candidate is built *into* belongs to the runner (a shared library for LLVM,
lowered device functions + launches for OpenCL): a :class:`Compiler` says. Every
artifact gets its own folder, because MetaSchedule's default measure callback deletes
the folder holding ``artifact_path`` once the candidate has run.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from pathlib import Path

from tvm import tirx
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderInput, BuilderResult, PyBuilder

from ..codegen.contained import compile_contained
from ..schedules.stage import Candidate


class Compiler:
    """How one runner wants candidates built (see :mod:`.runners`)."""

    def compile_one(self, name: str, func: tirx.PrimFunc, folder: Path) -> dict:
        """Runs in a forked child: build ``func`` into ``folder`` (its own); return
        ``{"artifact": path}`` plus anything :meth:`finish` needs."""
        raise NotImplementedError("need compile_one")

    def finish(self, built: list[tuple[Path, dict]]) -> dict[Path, str]:
        """Runs in the tuning process after a batch: work over the whole batch (one
        OpenCL program for all its candidates); returns errors by folder."""
        return {}


class _AsGiven:
    """A schedule order of one candidate: the candidate MetaSchedule already scheduled."""

    def names(self, func):
        return ["candidate"]

    def candidate(self, func, index):
        return Candidate(index, "candidate", func)


@derived_object
class ForkedBuilder(PyBuilder):
    """Builds each candidate in a forked child, ``workers`` at once.

    Parameters
    ----------
    compiler : Compiler
        What each candidate is built into.
    work_dir : path
        Where artifact folders are made.
    time_limit_s : float
        Longest one candidate may take to compile.
    workers : int, optional
        Children at once (default: the CPU count).
    """

    def __init__(
        self,
        compiler: Compiler,
        work_dir: str | Path,
        time_limit_s: float = 30.0,
        workers: int | None = None,
    ):
        super().__init__()
        self.compiler = compiler
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.time_limit_s = time_limit_s
        self.workers = workers or os.cpu_count() or 1
        self._batches = itertools.count()

    def build(self, build_inputs: list[BuilderInput]) -> list[BuilderResult]:
        batch = next(self._batches)
        folder = Path(tempfile.mkdtemp(prefix=f"b{batch}-", dir=self.work_dir))
        names = [f"c{batch}_{i}" for i in range(len(build_inputs))]
        funcs = {name: bi.mod["main"] for name, bi in zip(names, build_inputs, strict=True)}
        compiler = self.compiler

        def compile_one(name, func, work_dir):
            own = Path(work_dir) / name
            own.mkdir()
            return compiler.compile_one(name, func, own)

        compiled = compile_contained(
            funcs, _AsGiven(), compile_one, folder, self.time_limit_s, self.workers
        )
        built = [(folder / n, compiled[n].facts) for n in names if compiled[n].choice.rule]
        errors = self.compiler.finish(built) if built else {}
        results = []
        for name in names:
            c = compiled[name]
            if c.choice.rule is None:
                why = "; ".join(w for _, w in c.choice.passed_over) or "did not compile"
                results.append(BuilderResult(None, why))
            elif folder / name in errors:
                results.append(BuilderResult(None, errors[folder / name]))
            else:
                results.append(BuilderResult(c.facts["artifact"], None))
        return results
