"""``edgecv tune``: tune a model's kernels for a device class and store the records.

    edgecv tune MODEL --device PROFILE [--on DEVICE] [--trials N | --time-budget MIN]
                [--db DIR] [--tasks K] [--rules-only] [--layout auto|NCHW|packed] [--ops FILE]
                [--resume] [--ship] [--rpc HOST:PORT --key KEY]

The model is imported exactly as deploy imports it and its convolutions put in the
layouts deploy would give them (the graph tuner, ``--layout`` as for deploy, costs from
the same cache); its kernels become tasks (:mod:`.tasks`), each task's default
schedule is measured, the tile variants of its default rule timed, then MetaSchedule
searches (:mod:`.search`) with the runner of the profile's device (:mod:`.runners`) or
a fleet of RPC servers (:mod:`.fleet`). Records go to ``--db`` (default: the user's folder of
the device class, which deploy reads); ``--ship`` also merges the best record per
workload into the shipped folder, ``device_profiles/tuning/<class>/``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from ..board import progress
from ..board.arguments import SHAPE_HELP, input_shapes, parse_shape
from ..board.errors import EdgecvError
from ..profiles import Profile, load_profile
from ..schedules.device_class import DeviceClass, cpu_class, find_device, opencl_class
from ..schedules.fingerprint import target_rules
from ..schedules.orders import cpu_order, gpu_order
from .records import (
    best_seconds,
    check_database_folder,
    merge_verdicts,
    open_database,
    read_verdicts,
    ship,
)
from .search import Budget, head_to_head, measure_defaults, search, sweep_variants
from .tasks import Task, extract_tasks, import_model


def _runner_setup(profile: Profile, on: str | None, rpc: str | None, key: str | None):
    """(device class, schedule order, compiler, runner) for the profile's device."""
    target = profile.tvm_target()
    if profile.runtime == "cpu":
        from .runners.llvm import LLVMCompiler, LocalLLVMRunner

        if rpc:
            from .fleet import FleetRunner

            runner = FleetRunner(rpc, key, "llvm")
        else:
            runner = LocalLLVMRunner()
        return cpu_class(target), cpu_order(target), LLVMCompiler(target), runner
    if profile.runtime == "opencl":
        from .runners.opencl import LocalOpenCLRunner, OpenCLCompiler

        subgroup = profile.intel_subgroup_size
        device = find_device(profile, on)
        runner = LocalOpenCLRunner(device, target)
        if rpc:
            from .fleet import FleetRunner

            runner = FleetRunner(rpc, key, "opencl", on or "", target)
        cls = opencl_class(target, subgroup, device)
        return cls, gpu_order(target, subgroup), OpenCLCompiler(target), runner
    from .runners.cuda import refuse_without_gpu

    refuse_without_gpu(profile)
    raise AssertionError("unreachable")


def tune(args: argparse.Namespace) -> int:
    """Run ``edgecv tune`` (see the module docstring); returns the exit status."""
    say = progress.say
    profile = load_profile(args.device)
    if args.rpc and not args.key:
        raise EdgecvError("--rpc needs --key KEY: the device key the servers registered with")
    for ops_file in args.ops or []:  # before the graph is read: it names these ops
        from ..op_registry import load_ops

        say(f"registered {', '.join(load_ops(ops_file))} from {ops_file}")
    cls, order, compiler, runner = _runner_setup(profile, args.on, args.rpc, args.key)
    db_dir = Path(args.db) if args.db else cls.user_folder()
    check_database_folder(db_dir)
    say(f"device class {cls.name}; records go to {db_dir}")
    mod, name = import_model(
        args.model,
        args.params,
        input_shapes(args.input_shape),
        not args.random_weights,
        args.seed,
        say,
    )
    mod, winograd = in_deploy_layouts(
        mod, profile, args.layout, [db_dir, cls.shipped_folder()], say, args.on
    )
    tasks = extract_tasks(mod, profile, winograd)
    say(f"{name}: {len(tasks)} workloads to tune for {profile.name}")
    db = open_database(db_dir)
    summary = read_verdicts(db_dir) if args.resume else {}  # defaults measured before
    from .builder import ForkedBuilder

    with tempfile.TemporaryDirectory(prefix="edgecv-tune-") as work:
        builder = ForkedBuilder(compiler, Path(work) / "artifacts")
        started = time.perf_counter()
        rules = target_rules(order.target)
        fresh = [t for t in tasks if not _restore_default(t, summary, rules)]
        say(f"measuring the default schedule of {len(fresh)} workloads")
        measure_defaults(fresh, order, builder, runner, db, say)
        chosen = sorted(tasks, key=lambda t: -t.weight)[: args.tasks or len(tasks)]
        total = sum(t.weight for t in tasks) or 1.0
        say(
            f"tuning {len(chosen)} of {len(tasks)} workloads ("
            f"{100 * sum(t.weight for t in chosen) / total:.0f}% of the default latency, "
            f"{total * 1e3:.2f} ms), "
            + (f"{args.time_budget:g} min" if args.time_budget else f"{args.trials} trials each")
        )
        # a time budget alone: as many trials as fit in it
        trials = args.trials if not args.time_budget else 100_000
        budget = Budget(trials, args.time_budget * 60 if args.time_budget else None)
        try:
            swept = time.perf_counter()
            ended = sweep_variants(chosen, order, builder, runner, db, budget, say)
            left = budget.seconds and budget.seconds - (time.perf_counter() - swept)
            if ended == "trials" and not args.rules_only and (left is None or left > 0):
                ended = search(
                    chosen,
                    order.target,
                    builder,
                    runner,
                    db,
                    work,
                    replace(budget, seconds=left),
                    os.cpu_count() or 1,
                )
            if ended != "interrupted":
                head_to_head(tasks, order, builder, runner, db, say)
        except KeyboardInterrupt:  # Ctrl-C in the race after the search: records still count
            ended = "interrupted"
        finally:  # merged: the other models' verdicts in the folder stay
            summary = merge_verdicts(db_dir, cls.key, _summary(tasks, db, name, rules))
        interrupted = ended == "interrupted"
        if interrupted:
            say("interrupted: the records measured so far are kept (--resume continues)")
        spent = time.perf_counter() - started
    _report(tasks, db, spent)
    if args.ship:
        count = ship(db_dir, cls.shipped_folder(), cls, summary)
        say(f"shipped {count} workloads to {cls.shipped_folder()}")
    _warn_if_profile_elsewhere(profile, cls, db_dir)
    return 130 if interrupted else 0


def in_deploy_layouts(
    mod, profile: Profile, layout: str, folders: list[Path], say, on: str | None = None
):
    """``mod`` with its convolutions in the layouts a deploy with ``--layout layout`` and
    these tuning folders would choose, and the convolutions it would run by Winograd's
    algorithm (``lower``'s ``winograd``): the kernels tuned are the kernels deployed.
    ``on``: the OpenCL device (``--on``) the layouts' costs are measured on."""
    from ..graph_tuner import choose_layouts
    from ..graph_tuner.stage import winograd_plan
    from ..pipelines import BuildOptions

    options = BuildOptions(
        layout=layout,
        tuning=[str(f) for f in folders],
        check_on=on or "auto",
        layout_budget_s=None,  # tuning is the long path: every layout cost measured
    )
    mod, facts = choose_layouts(mod, profile, options, say)
    if facts.get("reason"):
        say(f"layouts: NCHW ({facts['reason']})")
    return mod, winograd_plan(facts)


def _restore_default(task: Task, summary: dict, rules: str) -> bool:
    """The default's time from an earlier run (``--resume``), if measured under today's
    rules; else it is measured again."""
    entry = summary.get(str(task.key))
    if not entry or entry.get("default_s") is None or entry.get("rules") != rules:
        return False
    task.default_rule, task.default_s = entry.get("default_rule"), entry["default_s"]
    return True


def _summary(tasks: list[Task], db, model: str, rules: str) -> dict:
    """Per workload: what the search found against the default rule, and under which
    default rules (a verdict of other rules is void: :mod:`edgecv.schedules.database`)."""
    return {
        str(t.key): {
            "kernels": t.kernels,
            "model": model,
            "launches": t.launches,
            "default_rule": t.default_rule,
            "default_s": t.default_s,
            "best_s": _best_s(t, db),
            "rules": rules,
        }
        for t in tasks
    }


def _best_s(task: Task, db) -> float | None:
    """The task's best time: as timed beside its default (:func:`.search.head_to_head`),
    else the database's best record."""
    return task.best_s if task.best_s is not None else best_seconds(db, task.mod)


def _report(tasks: list[Task], db, spent: float) -> None:
    default = sum(t.weight for t in tasks)
    tuned = sum(
        (min(_best_s(t, db) or t.default_s or 0, t.default_s or 1e9) * t.launches) for t in tasks
    )
    progress.say(
        f"tuned in {spent / 60:.1f} min: kernels sum {default * 1e3:.2f} ms default "
        f"-> {tuned * 1e3:.2f} ms best ({default / max(tuned, 1e-12):.2f}x)"
    )
    for t in sorted(tasks, key=lambda t: -t.weight)[:10]:
        best = _best_s(t, db)
        if t.default_s and best:
            progress.say(
                f"  {t.name[:44]:<44} x{t.launches}: {t.default_s * 1e3:8.3f} ms "
                f"-> {best * 1e3:8.3f} ms ({t.default_rule})"
            )


def _warn_if_profile_elsewhere(profile: Profile, cls: DeviceClass, db_dir: Path) -> None:
    named = profile.tuning_class
    if named is not None and named != cls.name:
        progress.say(
            f"note: profile {profile.name} reads the class {named}, not {cls.name} "
            f"tuned here: deploy with --db {db_dir} to use these records"
        )


def add_parser(sub, common) -> None:
    """The ``tune`` and ``rpc-server`` subcommands."""
    t = sub.add_parser("tune", parents=[common], help="auto-tune a model's kernels for a device")
    t.add_argument("model", help="zoo name/alias, *-symbol.json or *.onnx, as for deploy")
    t.add_argument("--params", help="weights file (.params)")
    t.add_argument("--device", default="cpu", help="device profile (see `edgecv profiles`)")
    t.add_argument("--input-shape", type=parse_shape, action="append", help=SHAPE_HELP)
    t.add_argument("--random-weights", action="store_true", help="seeded random weights")
    t.add_argument("--seed", type=int, default=0, help="seed of random weights")
    t.add_argument("--on", help="OpenCL device to time on: part of its name (intel, pocl)")
    t.add_argument(
        "--ops",
        metavar="FILE",
        action="append",
        help="a Python file registering operators with edgecv.register_op, as "
        "for deploy (repeatable)",
    )
    amount = t.add_mutually_exclusive_group()
    amount.add_argument("--trials", type=int, default=64, help="trials per workload (64)")
    amount.add_argument(
        "--time-budget",
        type=float,
        metavar="MINUTES",
        help="stop the search after this many minutes",
    )
    t.add_argument(
        "--db",
        metavar="DIR",
        help="database folder (default: your cache folder "
        "of this device class, which deploy reads)",
    )
    t.add_argument("--tasks", type=int, metavar="K", help="tune only the K heaviest workloads")
    t.add_argument(
        "--rules-only",
        action="store_true",
        help="time the tile variants of edgecv's rules only, no MetaSchedule "
        "search (minutes, not hours, on OpenCL)",
    )
    t.add_argument(
        "--layout",
        choices=("auto", "NCHW", "packed"),
        default="auto",
        help="convolution layouts, as for deploy (default auto): tune the "
        "kernels a deploy with the same --layout builds",
    )
    t.add_argument(
        "--resume", action="store_true", help="continue: trials and defaults already in --db count"
    )
    t.add_argument(
        "--ship",
        action="store_true",
        help="merge the best records into the shipped database (device_profiles/tuning/<class>/)",
    )
    t.add_argument("--rpc", metavar="HOST:PORT", help="time on the RPC tracker's servers")
    t.add_argument("--key", help="device key of the RPC servers (with --rpc)")
    t.set_defaults(func=tune)

    from .fleet import add_server_parser

    add_server_parser(sub, common)
