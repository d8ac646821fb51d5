"""Tuning tasks: a model's fused kernels exactly as deploy schedules them.

The model is imported and lowered by the deploy pipeline's own stages
(:func:`edgecv.lowering.lower`); for GPU profiles edgecv's operators are swapped for
their GPU versions (:meth:`~edgecv.codegen.op_versions.OpVersions.replace`): those are
written scheduled and are not tuned. Kernels that compute the same thing (one
structure, different names) are one task, whose launch count is the sum of theirs. A
task's weight is its share of the latency: the measured time of its default schedule
times its launches.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from ..profiles import Profile
from ..schedules.database import workload
from ..schedules.stage import SCHEDULED, ScheduleOrder, rule_name


@dataclass
class Task:
    """One workload to tune.

    Parameters
    ----------
    name : str
        The first kernel's name (``fused_conv2d3_add2_relu2``).
    mod : tvm.IRModule
        The workload (:func:`edgecv.schedules.database.workload`): what the database keys.
    launches : int
        Launches of this workload per inference, over every kernel that shares it.
    kernels : list of str
        The kernels of the model that are this workload.
    """

    name: str
    mod: tvm.IRModule
    launches: int
    kernels: list[str] = field(default_factory=list)
    default_rule: str | None = None
    default_s: float | None = None  # the default schedule's measured seconds
    best_s: float | None = None  # the best record's, when timed beside the default

    @property
    def weight(self) -> float:
        """Seconds per inference spent in this task with the default schedule."""
        return (self.default_s or 0.0) * self.launches

    @property
    def key(self) -> int:
        return workload_hash(self.mod)


def workload_hash(mod: tvm.IRModule) -> int:
    """The structural hash MetaSchedule keys a workload by."""
    return int(tvm_ffi.structural_hash(mod))


def import_model(
    model: str,
    params: str | None,
    input_shape,
    pretrained: bool,
    seed: int,
    progress: Callable[[str], None],
) -> tuple[tvm.IRModule, str]:
    """The Relax module of ``model`` as deploy imports it, and the model's name."""
    from ..source import resolve_source

    with tempfile.TemporaryDirectory(prefix="edgecv-tune-") as tmp:
        source = resolve_source(model, Path(tmp), params, input_shape, pretrained, seed, progress)
        imported = source.import_model()
    return imported.mod, source.name


def extract_tasks(mod: tvm.IRModule, profile: Profile, winograd: dict | None = None) -> list[Task]:
    """The tasks of the Relax module ``mod`` for ``profile`` (its convolutions in
    ``winograd`` by Winograd's algorithm, as the graph tuner chose), in order of first
    launch."""
    from ..codegen.op_versions import OpVersions
    from ..lowering import lower
    from ..lowering.legalize import fast_exp_for

    lowered = lower(mod, winograd, fast_exp=fast_exp_for(profile.tvm_target()))
    kernels = lowered.kernels
    if profile.runtime != "cpu":
        target = profile.tvm_target()
        kernels = OpVersions().replace(kernels, target, profile.intel_subgroup_size)
    functions = {gv.name_hint: f for gv, f in kernels.functions.items()}
    counts: dict[str, int] = {}
    steps = [step for step in lowered.plan.steps if not step.elided]  # elided: never run
    for step in steps:
        counts[step.kernel] = counts.get(step.kernel, 0) + 1
    tasks: dict[int, Task] = {}
    for step in steps:
        func = functions.get(step.kernel)
        if func is None or not isinstance(func, tirx.PrimFunc) or _written_scheduled(func):
            continue
        mod_ = workload(func)
        key = workload_hash(mod_)
        task = tasks.get(key)
        if task is None:
            tasks[key] = Task(step.kernel, mod_, counts[step.kernel], [step.kernel])
        elif step.kernel not in task.kernels:
            task.kernels.append(step.kernel)
            task.launches += counts[step.kernel]
    return list(tasks.values())


def _written_scheduled(func: tirx.PrimFunc) -> bool:
    attrs = func.attrs or {}
    return bool(attrs.get(SCHEDULED, False)) or bool(attrs.get("edgecv.no_schedule", False))


def default_schedules(task: Task, order: ScheduleOrder):
    """The default candidates of ``task`` in deploy's order (the rules after the
    database, then the safe rule): ``(rule name, s_tir.Schedule)`` pairs whose traces
    replay on the workload (stored as the default's record)."""
    func = task.mod["main"]
    for rule in [*order.rules, order.safe]:
        copy = tvm.ir.load_json(tvm.ir.save_json(func))  # a rule may rewrite its input
        try:
            with order.target:
                sch = rule.apply(copy, order.target, False)
        except Exception:  # a rule that breaks: the next one, as deploy does
            continue
        if sch is None:
            continue
        if isinstance(sch, list):
            sch = sch[0]
        if isinstance(sch, s_tir.Schedule):
            yield rule_name(rule), sch


def rule_variants(task: Task, order: ScheduleOrder) -> list[s_tir.Schedule]:
    """The other schedules the task's default rule offers a tuner: asked with dlight's
    ``tunable``, a rule with knobs (tile sizes: :class:`edgecv.schedules.gpu.PackedConv2D`)
    returns its default schedule first, then one per distinct knob setting. ``[]`` for
    a rule without knobs, or one that breaks when asked."""
    rule = next((r for r in [*order.rules, order.safe] if rule_name(r) == task.default_rule), None)
    if rule is None:
        return []
    copy = tvm.ir.load_json(tvm.ir.save_json(task.mod["main"]))
    try:
        with order.target:
            found = rule.apply(copy, order.target, True)
    except Exception:  # the default applied; variants are a bonus, not a requirement
        return []
    if not isinstance(found, list):
        return []
    return [sch for sch in found[1:] if isinstance(sch, s_tir.Schedule)]
