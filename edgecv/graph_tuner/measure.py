"""Measuring the graph tuner's costs: which kernels, from where (cache, tuning
database, the device), and the CPU meter.

A meter times kernels on one device: ``time(kernels)`` schedules them by the schedule
stage's order, compiles them contained (:mod:`edgecv.codegen.contained`: every core, a
time limit each) and times them one at a time, in ROUNDS: each round times every
kernel once, and a kernel's time is its fastest round. On a shared machine other
processes only ever add time, so the least disturbed round is the truest, and rounds
spread over the whole measurement let a change of load touch every candidate alike
(timed back to back, the NCHW and packed versions of a convolution were compared
across load changes: ResNet-50's plan kept 12 convolutions NCHW on such noise).

Each kernel's arguments stay allocated through the rounds, so the kernels are timed in
groups whose arguments fit a share of the memory available (:func:`memory_groups`):
Mask R-CNN's mask head runs its convolutions on 1000 ROIs of 256x14x14 (200 MB a
tensor), and its candidates held at once took 20 GB and the kernel's OOM killer ended
the deploy.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np
import psutil
import tvm
from tvm import tirx

from ..board.runtime.cpu import pool_threads
from ..codegen.contained import compile_contained
from ..codegen.llvm import compile_object, link_objects
from ..schedules.database import TuningDatabase
from ..schedules.device_class import cpu_class
from ..schedules.stage import ScheduleOrder
from .costs import (
    DIRECT,
    CostCache,
    MeasuredCosts,
    conv_kernels,
    cpu_costs_key,
    kernel_key,
    needed_transforms,
    transform_kernel,
    transform_key,
    winograd_algorithm,
    work_folder,
)
from .extract import Extracted
from .graph import LayoutGraph, plain
from .predict import ConvWork, conv_work, predict_convs, predict_transforms
from .solver import solve

Progress = Callable[[str], None]

# Each kernel: the fastest of ROUNDS timings, each the median of COLD_CALLS calls; a
# kernel whose first call took LONG_CALL_S or more makes one call a round (its noise is
# small beside its time: the ResNet stage a Faster/Mask R-CNN runs on 1000 ROIs takes
# seconds a call, and 35 calls of each of its candidates made the graph tuner's
# measurement of Mask R-CNN most of a 14-minute deploy).
ROUNDS = 7
COLD_CALLS = 5
LONG_CALL_S = 0.05
# The share of the available memory one group of kernels' arguments may take.
MEMORY_SHARE = 0.25

# Before each call every argument but the first (the data, which the kernel before
# wrote) leaves the cache, as the weights have in a model: ResNet-50's 100 MB of weights
# stream from memory layer after layer. Timed warm, a Winograd kernel ran at half its
# time in the model (benchmarks/results/winograd-2026-11-24.md).
FLUSH = "cache_flush_cpu_non_first_arg"


class Meter(Protocol):
    """Times kernels on one device (see the module docstring). ``device_key`` names the
    device class (the folder of its costs); ``costs_key`` what its times are cached
    under (:func:`~.costs.cpu_costs_key`)."""

    device_key: str
    costs_key: str
    target: tvm.target.Target
    database: TuningDatabase | None

    def time(self, kernels: dict[str, tirx.PrimFunc], progress: Progress) -> dict[str, float]: ...


def measure_costs(
    extracted: Extracted,
    packings: list[str],
    meter: Meter,
    cache: CostCache,
    progress: Progress = lambda message: None,
    winograd: tuple[int, ...] = (),
    budget_s: float | None = None,
) -> MeasuredCosts:
    """Every candidate convolution kernel and every transform a plan may need: a
    convolution's candidates from the tuning database when it holds them all
    (:func:`_from_database`), else each from the cache, else measured (then cached).

    ``winograd``: the output tile sides to offer packed stride-1 3x3 convolutions as
    well (targets whose rules schedule Winograd's kernels); a packed convolution's cost
    is its fastest algorithm's (:attr:`MeasuredCosts.algorithms` keeps each one's).

    ``budget_s``: seconds the measuring may take (None: no limit). Kernels are measured
    in batches, the most work first (:func:`_batches`), then what the plan so far is in
    doubt about (:func:`_in_doubt_first`); once the budget is spent the rest are
    predicted from what was measured (:mod:`.predict`) and not cached."""
    wanted: dict[str, tirx.PrimFunc | None] = {}
    convs: list[tuple[str, str, str, str]] = []  # name, layout, algorithm, kernel key
    variants = [(plain(4), None)] + [(p, side) for p in packings for side in (None, *winograd)]
    for layout, side in variants:
        algorithm = DIRECT if side is None else winograd_algorithm(side)
        for name, func in conv_kernels(extracted, layout, side).items():
            key = kernel_key(func)
            convs.append((name, layout, algorithm, key))
            wanted.setdefault(key, func)
    transforms = {}
    for shape, src, dst in sorted(needed_transforms(extracted, packings)):
        transforms[(shape, src, dst)] = key = transform_key(shape, src, dst)
        wanted.setdefault(key, None)  # built only when it has to be measured
    times: dict[str, float] = {}
    origin: dict[str, str] = {}
    for key, seconds in _from_database(wanted, convs, meter).items():
        times[key], origin[key] = seconds, "database"
    for key in wanted:
        cached = cache.get(key) if key not in times else None
        if cached is not None:
            times[key], origin[key] = cached, "cache"
    shapes = {key: t for t, key in transforms.items()}
    missing = [key for key in wanted if key not in times]
    if missing:
        work = conv_work(extracted)
        doubt = _in_doubt_first(extracted.graph, convs, transforms, work, times)
        measured = _measure_within(
            _batches(missing, convs, work, shapes),
            wanted,
            shapes,
            meter,
            progress,
            budget_s,
            doubt,
        )
        for key, seconds in measured.items():
            times[key], origin[key] = seconds, "measured"
            if math.isfinite(seconds):
                cache.put(key, seconds)
        cache.save()
        guessed = {**predict_convs(convs, times, work), **predict_transforms(transforms, times)}
        for key, seconds in guessed.items():
            times[key], origin[key] = seconds, "predicted"
        if guessed:
            progress(
                f"graph tuner: {len(guessed)} costs predicted from the {len(measured)} "
                "measured (a later deploy measures them)"
            )
    costs = _costs(convs, transforms, times)
    for key in wanted:
        costs.sources[origin[key]] = costs.sources.get(origin[key], 0) + 1
    for name, layout, algorithm, key in convs:
        costs.origins[(name, layout, algorithm)] = origin[key]
    return costs


def _costs(
    convs: list[tuple[str, str, str, str]], transforms: dict[tuple, str], times: dict[str, float]
) -> MeasuredCosts:
    """The solver's costs from seconds per kernel key."""
    costs = MeasuredCosts()
    for name, layout, algorithm, key in convs:
        costs.add(name, layout, algorithm, times[key])
    for transform, key in transforms.items():
        costs.transforms[transform] = times[key]
    return costs


# The first batch's size (kernels); later batches are sized to what the budget has left
# at the rate the batches before them ran, within these bounds.
FIRST_BATCH, SMALLEST_BATCH, LARGEST_BATCH = 16, 8, 64
# ... taken RATE_MARGIN times slower: kernels compile at rates of their own and a batch
# is not cut short once started (a second batch sized at the first's rate compiled at
# half that rate and overran the budget:
# benchmarks/results/first_deploy-2026-11-27-zen3.md, SqueezeNet for deeplens).
RATE_MARGIN = 2.0


def _batches(
    missing: list[str],
    convs: list[tuple[str, str, str, str]],
    work: dict[str, ConvWork],
    shapes: dict[str, tuple],
) -> tuple[list[list[str]], list[str]]:
    """(convolution groups, transforms) to measure: a group is the missing candidates of
    one convolution (measured in one batch, so the candidates the solver weighs against
    each other share their rounds); the groups take turns by kind of convolution
    (depthwise, 1x1, other), each kind's most work first; transforms by size.

    Taking turns by kind is what lets a few measurements predict the rest: the ratios
    between candidates differ by kind (:mod:`.predict`), and the biggest convolutions
    are mostly of one. Simulated on SSD-512 ResNet-50's 179 fully measured costs on
    Intel's runtime (2026-11-27), the plan from the first 16 measured was 1.46x the
    optimum taken by work alone (its 3x3s first: 1x1 ratios guessed from 3x3 ones) and
    1.004x taking turns; 1.016x or better from there on."""
    missing_set = set(missing)
    by_conv: dict[str, list[str]] = {}
    for name, _, _, key in convs:
        if key in missing_set and key not in by_conv.setdefault(name, []):
            by_conv[name].append(key)
    kinds: dict[str, list[str]] = {}
    for name in sorted(by_conv, key=lambda n: -work[n].macs):
        kinds.setdefault(work[name].kind, []).append(name)
    turns = [n for round_ in itertools.zip_longest(*kinds.values()) for n in round_ if n]
    taken: set[str] = set()
    groups = []
    for name in turns:
        group = [k for k in by_conv[name] if k not in taken]
        taken.update(group)
        if group:
            groups.append(group)
    transforms = sorted((k for k in missing if k in shapes), key=lambda k: -math.prod(shapes[k][0]))
    return groups, transforms


# A convolution is in doubt while a candidate of it not yet measured is predicted within
# DOUBT_MARGIN of the candidate the plan so far chose (or is that candidate).
DOUBT_MARGIN = 1.5

Reorder = Callable[[dict[str, float], list[list[str]], list[str]], None]


def _in_doubt_first(
    graph: LayoutGraph,
    convs: list[tuple[str, str, str, str]],
    transforms: dict[tuple, str],
    work: dict[str, ConvWork],
    known: dict[str, float],
) -> Reorder:
    """After each batch of a budget, the queues put first what the plan depends on: the
    plan is solved from the costs known and predicted so far, and the convolutions in
    doubt (:data:`DOUBT_MARGIN`) go first, the most time at stake (their chosen
    candidate's) first, then the transforms the plan inserts, the longest first; the
    rest keep their order behind them.

    Replayed on fully measured costs, the plan from the first kernels measured plus
    predictions comes closer to the fully measured plan, sooner, than with a fixed
    order (benchmarks/results/first_deploy-2026-11-27-zen3.md, the replays)."""
    names_of: dict[str, list[str]] = {}  # a kernel key -> the convolutions it runs
    for name, _, _, key in convs:
        names_of.setdefault(key, []).append(name)
    where = {node.name: index for index, node in enumerate(graph.nodes) if node.kind == "conv"}
    transform_of = {key: t for t, key in transforms.items()}

    def reorder(measured: dict[str, float], groups: list[list[str]], queue: list[str]) -> None:
        times = {**known, **measured}
        guessed = {**predict_convs(convs, times, work), **predict_transforms(transforms, times)}
        estimate = {**times, **guessed}
        costs = _costs(convs, transforms, estimate)
        plan = solve(graph, costs)
        chosen = {
            name: costs.kernels.get((name, plan.layouts[index]), math.inf)
            for name, index in where.items()
            if index in plan.layouts
        }

        def at_stake(group: list[str]) -> float:
            return max(
                (
                    chosen[name]
                    for key in group
                    for name in names_of.get(key, [])
                    if name in chosen and estimate[key] <= chosen[name] * DOUBT_MARGIN
                ),
                default=0.0,
            )

        inserted = {(tuple(t.shape), t.src, t.dst) for t in plan.transforms}
        groups.sort(key=at_stake, reverse=True)  # stable: the rest keep their turns
        queue.sort(key=lambda k: -estimate[k] if transform_of[k] in inserted else 0.0)

    return reorder


def _next_batch(groups: list[list[str]], transforms: list[str], size: int, share: float):
    """The next ``size`` kernels (taken from the fronts of ``groups`` and ``transforms``):
    transforms in proportion ``share``, but at most half the batch while convolutions
    are left (they weigh most); a convolution's group is never split."""
    batch: list[str] = []
    want_transforms = max(1, round(size * share)) if transforms else 0
    if groups:
        want_transforms = min(want_transforms, max(1, size // 2))
    while groups and len(batch) < size - want_transforms:
        batch.extend(groups.pop(0))
    while transforms and (len(batch) < size or not groups) and want_transforms > 0:
        batch.append(transforms.pop(0))
        want_transforms -= 1
    if not batch:
        batch = groups.pop(0) if groups else [transforms.pop(0)]
    return batch


def _measure_within(
    queues: tuple[list[list[str]], list[str]],
    wanted: dict[str, tirx.PrimFunc | None],
    shapes: dict[str, tuple],
    meter: Meter,
    progress: Progress,
    budget_s: float | None,
    reorder: Reorder | None = None,
) -> dict[str, float]:
    """Time the kernels of ``queues`` batch by batch until they are done or ``budget_s``
    is spent (the first batch always runs); convolution groups and transforms are taken
    in proportion (at most half a batch transforms while convolutions are left), so
    both are measured from their largest down; ``reorder`` (:func:`_in_doubt_first`)
    orders the queues again after each batch."""
    groups, transforms = list(queues[0]), list(queues[1])
    total = sum(map(len, groups)) + len(transforms)
    share = len(transforms) / total
    measured: dict[str, float] = {}
    started = time.perf_counter()
    size = FIRST_BATCH
    while groups or transforms:
        if budget_s is None:  # everything in one batch: one compile, one program
            batch = [key for group in groups for key in group] + transforms
            groups, transforms = [], []
        else:
            if reorder is not None and measured:
                reorder(measured, groups, transforms)
            batch = _next_batch(groups, transforms, size, share)
        spent = time.perf_counter() - started
        limit = "" if budget_s is None else f", {spent:.0f} of {budget_s:.0f} s"
        progress(
            f"graph tuner: measuring {len(batch)} kernels ({len(measured)} of {total} "
            f"done{limit}) on {meter.costs_key}"
        )
        funcs = {
            k: wanted[k] if wanted[k] is not None else transform_kernel(*shapes[k]) for k in batch
        }
        measured.update(meter.time(funcs, progress))
        if budget_s is None:
            continue
        size = _next_size(time.perf_counter() - started, len(measured), budget_s)
        if not size:
            break
    return measured


def _next_size(spent: float, measured: int, budget_s: float) -> int:
    """Kernels in the next batch (0: stop): what the budget has left at the rate so far,
    taken RATE_MARGIN times slower; none when even the smallest batch at that rate
    would end past the budget by more than half its time."""
    left = budget_s - spent
    per_kernel = RATE_MARGIN * spent / max(measured, 1)
    if left <= 0 or left < per_kernel * SMALLEST_BATCH / 2:
        return 0
    return int(min(LARGEST_BATCH, max(SMALLEST_BATCH, left / per_kernel)))


def _from_database(
    wanted: dict, convs: list[tuple[str, str, str, str]], meter: Meter
) -> dict[str, float]:
    """The kernel keys whose time comes from the tuning database, with that time: those of each
    convolution whose every candidate layout has a record there. A convolution's
    candidates are compared like with like: the tuning runner times single calls, the
    meter averages many, and a packed time from the database beside a measured NCHW
    one chose NCHW for 8 of mobilenet1.0's convolutions, 11% slower than all-packed."""
    keys_of: dict[str, list[str]] = {}
    users: dict[str, list[str]] = {}
    for name, _, _, key in convs:
        keys_of.setdefault(name, []).append(key)
        users.setdefault(key, []).append(name)
    recorded = {key: _database_seconds(meter, wanted[key]) for key in users}
    chosen = {key for key, seconds in recorded.items() if seconds is not None}
    changed = True
    while changed:  # a kernel two convolutions share leaves the database for both
        changed = False
        for keys in keys_of.values():
            if not all(k in chosen for k in keys) and any(k in chosen for k in keys):
                chosen.difference_update(keys)
                changed = True
    return {key: recorded[key] for key in chosen}


def _database_seconds(meter: Meter, func: tirx.PrimFunc) -> float | None:
    database = meter.database
    return database.best_seconds(func, meter.target) if database else None


class CpuMeter:
    """Times kernels on this machine's CPU with TVM's ``time_evaluator``."""

    def __init__(
        self,
        target: tvm.target.Target,
        order: ScheduleOrder,
        time_limit_s: float,
        workers: int | None = None,
    ):
        self.target = target
        self.order = order
        self.database = order.database
        self.time_limit_s = time_limit_s
        self.workers = workers
        # the tuning database's device class: costs sit beside its records; times are
        # those of the threads edgecv's TVM pool runs (edgecv/__init__ sets the default)
        self.device_key = cpu_class(target).name
        self.costs_key = cpu_costs_key(self.device_key, pool_threads())

    def time(self, kernels: dict[str, tirx.PrimFunc], progress: Progress) -> dict[str, float]:
        names = {key: f"k{i}" for i, key in enumerate(kernels)}
        with work_folder("edgecv-layout-costs-") as work:
            compiled = compile_contained(
                {names[key]: f for key, f in kernels.items()},
                self.order,
                compile_object(self.target),
                Path(work),
                time_limit_s=self.time_limit_s,
                workers=self.workers,
            )
            built = {key: compiled[names[key]].facts for key in kernels}
            built = {key: facts["object"] for key, facts in built.items() if facts}
            times = dict.fromkeys(kernels, math.inf)
            if not built:
                return times
            # one library for all (one link, not one per kernel: 0.15-0.25 s each)
            library_path = Path(work) / "kernels.so"
            link_objects(sorted(set(built.values())), library_path)
            library = tvm.runtime.load_module(str(library_path))
            for group in memory_groups({key: kernels[key] for key in built}):
                timers = {key: _timer(library, names[key], kernels[key]) for key in group}
                for _ in range(ROUNDS):
                    for key, timer in timers.items():
                        times[key] = min(times[key], timer())
                del timers  # this group's arguments, before the next group's are made
        return times


def argument_bytes(func: tirx.PrimFunc) -> int:
    """The bytes of ``func``'s arguments (static shapes)."""
    return sum(
        math.prod(int(d) for d in p.shape) * np.dtype(str(p.dtype)).itemsize for p in func.params
    )


def memory_groups(kernels: dict[str, tirx.PrimFunc], budget: int | None = None) -> list[list[str]]:
    """The keys of ``kernels``, in order, in groups whose arguments together take at
    most ``budget`` bytes (default: :data:`MEMORY_SHARE` of the memory available now);
    a kernel larger than the budget is a group of its own."""
    if budget is None:
        budget = int(psutil.virtual_memory().available * MEMORY_SHARE)
    groups: list[list[str]] = []
    used = budget + 1
    for key, func in kernels.items():
        size = argument_bytes(func)
        if used + size > budget:
            groups.append([])
            used = 0
        groups[-1].append(key)
        used += size
    return groups


def _timer(library, name: str, func: tirx.PrimFunc) -> Callable[[], float]:
    """A function timing one round of kernel ``name`` of ``library`` on random inputs."""
    device = tvm.cpu()
    rng = np.random.default_rng(0)
    args = []
    for param in func.params:
        shape = [int(d) for d in param.shape]
        args.append(tvm.runtime.tensor(rng.uniform(-1, 1, shape).astype(str(param.dtype)), device))
    started = time.perf_counter()
    library[name](*args)  # warm up: first-touch pages, thread pool
    calls = 1 if time.perf_counter() - started >= LONG_CALL_S else COLD_CALLS
    timer = library.time_evaluator(name, device, number=1, repeat=calls, f_preproc=FLUSH)
    return lambda: float(np.median(timer(*args).results))
