"""The search: each task's default schedule measured, then MetaSchedule over the tasks.

1. Defaults: every task's default schedule (deploy's first rule that applies and
   compiles) is built and timed by the same builder and runner as the search, and
   stored as a record. Its time x the task's launches is the task's weight.
2. Tile variants (:func:`sweep_variants`): the other knob values of a task's default
   rule (a GPU convolution's work-item tile), each timed and stored.
3. MetaSchedule (``tune_tasks``: evolutionary search, xgboost cost model, gradient task
   scheduler weighted by 1.) over the heaviest tasks, with the trials left. Records are
   appended to the JSON database as each batch is measured; a progress bar shows
   trials done, time left and the current task's best against its default.
4. The verdict (:func:`head_to_head`): where a task's best record is not its default's
   own schedule, the two are timed again side by side, and only those times decide.

The CPU search space leaves out MetaSchedule's ``RewriteLayout`` post-processor: it
moves a weight re-layout out of the kernel for Relax to hoist into the graph, but
edgecv passes weights to kernels as they are, so a replayed record would read them in
the wrong layout.
"""

from __future__ import annotations

import inspect
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder import BuilderInput
from tvm.s_tir.meta_schedule.runner import RunnerInput

from ..board import progress as bars
from ..schedules.stage import ScheduleOrder
from .records import FAILED_RUN_S, commit_schedule, records_of
from .tasks import Task, default_schedules, rule_variants


class StopSearch(Exception):
    """Raised from the measure callback, between batches, to end the search (the time
    budget is spent, or Ctrl-C asked for it). TVM hands it back as a RuntimeError with
    the message only: the message carries :data:`STOP`."""


STOP = "[edgecv: search stopped]"


@dataclass
class Budget:
    """``trials`` per task; ``seconds`` for the whole search (None: no limit)."""

    trials: int = 64
    seconds: float | None = None
    per_iteration: int = 32


def measure_defaults(
    tasks: list[Task], order: ScheduleOrder, builder, runner, db, say: Callable[[str], None]
) -> None:
    """Build and time every task's default schedule (the next rule when one fails to
    build or run, as deploy does); store each as a record; set ``default_s``."""
    pending = {t.key: (t, default_schedules(t, order)) for t in tasks}
    while pending:
        batch = []
        for key, (task, candidates) in list(pending.items()):
            found = next(candidates, None)
            if found is None:
                say(f"{task.name}: no default schedule builds; it is tuned without one")
                del pending[key]
            else:
                batch.append((task, *found))
        if not batch:
            break
        times = _build_and_time(
            [(task, sch) for task, _, sch in batch], order.target, builder, runner, rounds=1
        )
        for (task, rule, sch), seconds in zip(batch, times, strict=True):
            if seconds == float("inf"):
                continue  # its next rule in the next round
            commit_schedule(db, task.mod, sch, [seconds], order.target)
            task.default_rule, task.default_s = rule, seconds
            del pending[task.key]


def sweep_variants(
    tasks: list[Task],
    order: ScheduleOrder,
    builder,
    runner,
    db,
    budget: Budget,
    say: Callable[[str], None],
) -> str:
    """Time every schedule the tasks' default rules offer besides their defaults (their
    tile sizes: :func:`.tasks.rule_variants`), up to ``budget.trials`` per task, in
    batches of ``budget.per_iteration``; store each as a record. Returns ``trials``
    (all timed) or ``time`` (the time budget ran out between batches).

    This is the search around edgecv's own schedules (AutoTVM's templates and knobs):
    MetaSchedule's generic spaces start from scratch, and their best candidates ran far
    slower than the default schedules
    (benchmarks/results/metaschedule_spaces-2026-11-25-intel-cpu-opencl.md)."""
    started = time.perf_counter()
    work = []
    for task in tasks:
        variants = rule_variants(task, order)
        done = trials_done(task, db)  # --resume: a task's variants are timed first
        work += [(task, sch) for sch in variants[done : max(done, budget.trials)]]
    if not work:
        return "trials"
    say(f"timing {len(work)} tile variants of edgecv's rules for {len(tasks)} workloads")
    best: dict[int, float] = {}
    with bars.bar(len(work), "rule variants", "variant") as bar:
        for first in range(0, len(work), budget.per_iteration):
            if budget.seconds is not None and time.perf_counter() - started > budget.seconds:
                return "time"
            batch = work[first : first + budget.per_iteration]
            times = _build_and_time(batch, order.target, builder, runner, rounds=1)
            for (task, sch), seconds in zip(batch, times, strict=True):
                commit_schedule(db, task.mod, sch, [min(seconds, FAILED_RUN_S)], order.target)
                best[task.key] = min(best.get(task.key, seconds), seconds)
            bar.update(len(batch))
    faster = [t for t in tasks if t.default_s and best.get(t.key, float("inf")) < t.default_s]
    say(
        f"tile variants: {len(faster)} of {len(tasks)} workloads have one faster than their "
        "default in this run (timed again beside it after the search)"
    )
    return "trials"


def _same_code(a, b) -> bool:
    """Whether two schedules of a workload give the same function (a GPU rule marks
    its function scheduled; a replayed trace does not)."""
    strip = [sch.mod["main"].without_attr("tirx.is_scheduled") for sch in (a, b)]
    return tvm_ffi.structural_equal(*strip)


def _build_and_time(
    items: list, target, builder, runner, rounds: int, alternate: bool = False
) -> list[float]:
    """Build ``(task, schedule)`` pairs as one batch and time the batch ``rounds`` times:
    the fastest mean seconds of each (infinite where it failed). ``alternate``: every
    other round in reverse order, so that no item is always timed before its rival."""
    built = builder.build(
        [BuilderInput(tvm.IRModule({"main": sch.mod["main"]}), target) for _, sch in items]
    )
    kind = str(target.kind.name)
    runnable = [i for i, b in enumerate(built) if b.error_msg is None]
    inputs = {
        i: RunnerInput(
            built[i].artifact_path,
            kind,
            ms.arg_info.ArgInfo.from_prim_func(items[i][0].mod["main"]),
        )
        for i in runnable
    }
    fastest = [float("inf")] * len(items)
    for round_ in range(rounds):
        ordered = runnable[::-1] if alternate and round_ % 2 else runnable
        futures = runner.run([inputs[i] for i in ordered])
        for i, future in zip(ordered, futures, strict=True):
            result = future.result()
            if result.error_msg is None and result.run_secs:
                mean = sum(float(s) for s in result.run_secs) / len(result.run_secs)
                fastest[i] = min(fastest[i], mean)
    return fastest


HEAD_TO_HEAD_ROUNDS = 4  # even: each of a pair timed first as often
# How much faster a record must come out, side by side, to win: above what timing a
# schedule beside a copy of itself gives for most workloads, on the CPU and Intel's
# OpenCL runtime (benchmarks/results/head_to_head_margin-2026-11-25-zen5-2core.md).
# Copies of the default are not timed at all (same code): the margin is for true rivals.
HEAD_TO_HEAD_MARGIN = 0.03


def head_to_head(
    tasks: list[Task], order: ScheduleOrder, builder, runner, db, say: Callable[[str], None]
) -> None:
    """Where the database's best record of a task is not its default's schedule (it
    was timed faster once, maybe in a faster moment), time the two again side by side
    (one batch, :data:`HEAD_TO_HEAD_ROUNDS` rounds in alternating order, fastest of
    each) and set ``default_s`` and ``best_s`` from these times alone: the record wins
    only by :data:`HEAD_TO_HEAD_MARGIN` or more.

    Times taken minutes or sessions apart differ by more than many a search gains (the
    host's speed changes for minutes at a time), so a record measured in a fast moment
    would otherwise pass for a win over a default measured in a slow one."""
    contested = []
    for task in tasks:
        if task.default_s is None:
            continue
        default = next(
            (sch for rule, sch in default_schedules(task, order) if rule == task.default_rule), None
        )
        with order.target:
            record = db.query_schedule(task.mod, order.target, workload_name="main")
        if default is None or record is None:
            continue
        if _same_code(default, record):
            task.best_s = task.default_s  # the best record is the default's schedule
        else:
            contested.append((task, default, record))
    if not contested:
        return
    say(f"timing {len(contested)} best records against their defaults again, side by side")
    items = [
        pair for task, default, record in contested for pair in ((task, default), (task, record))
    ]
    fastest = _build_and_time(
        items, order.target, builder, runner, HEAD_TO_HEAD_ROUNDS, alternate=True
    )
    for n, (task, _, _) in enumerate(contested):
        default_s, record_s = fastest[2 * n], fastest[2 * n + 1]
        if default_s < float("inf"):
            task.default_s = default_s
            won = record_s < default_s * (1 - HEAD_TO_HEAD_MARGIN)
            task.best_s = record_s if won else default_s


def postprocs(target: tvm.target.Target) -> list:
    """MetaSchedule's post-processors for ``target``, less ``RewriteLayout`` (above)."""
    kind = "llvm" if str(target.kind.name) == "llvm" else "cuda"
    return [p for p in ms.postproc.Postproc.create(kind) if type(p).__name__ != "RewriteLayout"]


def import_tensor_intrinsics() -> None:
    """Import ``tvm.s_tir.tensor_intrin`` (TuneContext does, on first use) in seconds
    rather than 40-140.

    Each of its ~500 TVMScript functions calls ``inspect.stack()``, which looks up the
    module of every frame; for the frames of ``<frozen importlib._bootstrap>`` the
    lookup finds nothing after scanning every module loaded (1,700 with MXNet, more in
    a test run). Misses by file name are remembered for the duration of the import:
    the answer for such a file cannot change. 8 s instead of 40 s here with MXNet
    loaded.
    """
    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return
    original = inspect.getmodule
    misses: set[str] = set()

    def getmodule(obj, _filename=None):
        if _filename is not None and _filename in misses:
            return None
        found = original(obj, _filename)
        if found is None and _filename is not None:
            misses.add(_filename)
        return found

    inspect.getmodule = getmodule
    try:
        import tvm.s_tir.tensor_intrin  # noqa: F401
    finally:
        inspect.getmodule = original


def contexts(tasks: list[Task], target: tvm.target.Target, cores: int, per_iteration: int) -> list:
    import_tensor_intrinsics()
    kind = "llvm" if str(target.kind.name) == "llvm" else "cuda"
    if kind == "llvm":  # MetaSchedule's parallel rules size the work by the core count
        spec = dict(target.export())
        host = spec.pop("host", None)
        target = tvm.target.Target({**spec, "num-cores": cores}, host=host)
    return [
        ms.TuneContext(
            mod=t.mod,
            target=target,
            space_generator=ms.space_generator.PostOrderApply(
                sch_rules=ms.schedule_rule.ScheduleRule.create(kind),
                postprocs=postprocs(target),
                mutator_probs=ms.mutator.Mutator.create(kind),
            ),
            search_strategy=evolutionary(per_iteration, gpu=kind != "llvm"),
            task_name=t.name,
            num_threads=cores,
        )
        for t in tasks
    ]


def evolutionary(per_iteration: int, gpu: bool = False):
    """MetaSchedule's evolutionary search, smaller than its defaults (population 512,
    4 generations): on 2 cores the default spent longer per batch in mutation alone
    than building and timing the batch (benchmarks/results/tuning_search-2026-11-23-2core.md).
    Four candidates bred per one measured (at most
    128) keeps the search's share small.

    On GPUs two per one measured (at most 64), two tries to fill the first population,
    and none of it from the database: most random samples of a Winograd kernel fail
    MetaSchedule's GPU checks (112 of 128 on SqueezeNet's), and with the defaults' five
    tries of 128 one batch of 32 took 2-4 minutes to sample (Intel's OpenCL runtime, 2
    cores); with the 30 tile variants of SqueezeNet's stem in the database (unrolled
    code), its first batch was not sampled in 9 minutes (the process in TVM's region
    analysis), and taking none from the database, about a minute. The rules' traces
    hold no sampling decisions for MetaSchedule to mutate anyway."""
    if gpu:
        population = max(16, min(64, 2 * per_iteration))
        fails, from_database = 2, 0.0
    else:
        population = max(16, min(128, 4 * per_iteration))
        fails, from_database = 5, 0.2
    return ms.search_strategy.EvolutionarySearch(
        population_size=population,
        init_measured_ratio=from_database,
        init_min_unmeasured=population // 4,
        max_fail_count=fails,
        genetic_num_iters=3,
    )


def trials_done(task: Task, db) -> int:
    """Records of the task's workload beyond its default one."""
    return max(0, len(records_of(db, task.mod)) - 1)


# Workloads MetaSchedule's GPU search leaves out (their rule's tile variants are timed):
# sampling the first batch of a Winograd kernel of SqueezeNet took over 7 minutes and did
# not end (Intel's runtime, population 64, 2 cores; last session 20 minutes at 128), the
# replays simplifying the transforms' Selects over and over.
GPU_SEARCH_SKIPS = ("gpu.Winograd",)


def search(
    tasks: list[Task],
    target: tvm.target.Target,
    builder,
    runner,
    db,
    work_dir: str,
    budget: Budget,
    cores: int = 2,
) -> str:
    """Tune ``tasks`` (see the module docstring). Returns why it ended: ``trials`` (all
    done), ``time`` (the time budget) or ``interrupted`` (Ctrl-C).

    Ctrl-C asks the search to stop after the batch being measured; a second Ctrl-C ends
    the process at once (exit status 130), records measured so far kept (:class:`_CtrlC`)."""
    if str(target.kind.name) != "llvm":
        kept = [t for t in tasks if t.default_rule not in GPU_SEARCH_SKIPS]
        if len(kept) < len(tasks):
            bars.say(
                f"MetaSchedule leaves out {len(tasks) - len(kept)} Winograd workloads "
                "on GPUs (their tile variants are timed)"
            )
        tasks = kept
    remaining = {t.key: max(0, budget.trials - trials_done(t, db)) for t in tasks}
    todo = [t for t in tasks if remaining[t.key] > 0]
    if not todo:
        return "trials"
    per_task = max(remaining[t.key] for t in todo)
    per_iteration = min(budget.per_iteration, per_task)
    progress = _Progress(todo, sum(remaining[t.key] for t in todo), budget.seconds)
    watcher = _CtrlC(progress)
    try:
        with progress.bar:
            ms.tune_tasks(
                tasks=contexts(todo, target, cores, per_iteration),
                task_weights=[max(t.weight, 1e-9) for t in todo],
                work_dir=work_dir,
                max_trials_global=sum(remaining[t.key] for t in todo),
                max_trials_per_task=per_task,
                num_trials_per_iter=per_iteration,
                builder=builder,
                runner=runner,
                database=db,
                cost_model=ms.cost_model.CostModel.create("xgb", num_tuning_cores=cores),
                measure_callbacks=[
                    *ms.measure_callback.MeasureCallback.create("default"),
                    progress,
                ],
                task_scheduler="gradient",
            )
    except StopSearch:
        return "interrupted" if progress.stop_asked else "time"
    except Exception as err:  # TVM re-raises a callback's exception wrapped or as is
        if STOP in str(err):
            return "interrupted" if progress.stop_asked else "time"
        raise
    finally:
        watcher.stop()
    return "trials"


class _CtrlC:
    """Ctrl-C during the search, answered at once even while MetaSchedule's C++ code
    runs: Python runs a signal handler only when the main thread is back in the
    interpreter, and sampling one batch of GPU candidates can take minutes there.
    Python's C-level handler writes each signal to a pipe (``signal.set_wakeup_fd``,
    from whichever thread the signal lands on: TVM's pool threads too), and a thread
    of ours reads it (TVM's calls release the GIL). The first Ctrl-C asks the search to
    stop after its batch; a second ends the process (exit 130): an exception raised
    into MetaSchedule's C++ frames ended it with a segfault. The records measured so far
    are on disk (one line each, written as they are measured); this run's summary is
    not, so ``--resume`` re-times defaults."""

    STOP = b"\0"  # written by stop(): signal numbers are never 0

    def __init__(self, progress: _Progress):
        self.progress = progress
        self.read, self.write = os.pipe()
        os.set_blocking(self.write, False)
        self.previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
        self.previous_fd = signal.set_wakeup_fd(self.write)
        self.thread = threading.Thread(target=self._watch, name="edgecv-ctrl-c", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while (byte := os.read(self.read, 1)) not in (b"", self.STOP):
            if byte[0] != signal.SIGINT:
                continue
            if self.progress.stop_asked:
                bars.say("stopped: the records measured so far are kept (--resume continues)")
                os._exit(130)
            self.progress.stop_asked = True
            bars.say("stopping after this batch (Ctrl-C again to stop now)")

    def stop(self) -> None:
        """Back to the Ctrl-C handling there was before."""
        signal.set_wakeup_fd(self.previous_fd)
        signal.signal(signal.SIGINT, self.previous)
        os.write(self.write, self.STOP)
        self.thread.join()
        os.close(self.read)
        os.close(self.write)


@derived_object
class _Progress(ms.measure_callback.PyMeasureCallback):
    """The bar: trials done and time left; the current task's best vs its default.
    Ends the search (raises :class:`StopSearch`) when the time budget is spent or
    Ctrl-C asked for it."""

    def __init__(self, tasks: list[Task], total: int, seconds: float | None):
        super().__init__()
        self.tasks = tasks
        self.best: dict[int, float] = {}
        self.trials: dict[int, int] = {}
        self.started = time.perf_counter()
        self.seconds = seconds
        self.stop_asked = False
        # with a time budget the trials have no end: the bar counts them, the postfix
        # says the time left; with trials alone tqdm's ETA is the time left
        self.bar = bars.bar(None if seconds else total, "tuning", "trial")

    def apply(
        self, task_scheduler, task_id, measure_candidates, builder_results, runner_results
    ) -> None:
        task = self.tasks[task_id]
        for result in runner_results:
            if result.run_secs and not result.error_msg:
                mean = sum(float(s) for s in result.run_secs) / len(result.run_secs)
                self.best[task_id] = min(self.best.get(task_id, mean), mean)
        self.trials[task_id] = self.trials.get(task_id, 0) + len(runner_results)
        self.bar.update(len(runner_results))
        best = self.best.get(task_id)
        default = f" default {task.default_s * 1e3:.3f} ms" if task.default_s else ""
        shown = f"{best * 1e3:.3f} ms" if best else "-"
        left = ""
        if self.seconds is not None:
            spent = time.perf_counter() - self.started
            left = f", {max(0.0, self.seconds - spent) / 60:.0f} min left"
        self.bar.set_postfix_str(
            f"{task.name[:28]}: best {shown}{default}, {self.trials[task_id]} trials{left}"
        )
        if not bars.bars_enabled():
            bars.say(f"{task.name}: {self.trials[task_id]} trials, best {shown}{default}")
        if self.stop_asked:
            raise StopSearch(f"{STOP} by Ctrl-C")
        if self.seconds is not None and time.perf_counter() - self.started > self.seconds:
            raise StopSearch(f"{STOP} time budget of {self.seconds / 60:.1f} min spent")
