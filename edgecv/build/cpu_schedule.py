"""Default CPU schedules for the LLVM target (used when no tuned schedule exists).

A fused kernel from LegalizeOps + FuseOps is a chain of loop nests, at most a few
of which reduce. Each kernel gets the first rule that fits it:

=========================================  ==============================================
kernel (main block)                        schedule
=========================================  ==============================================
conv2d NCHW, groups 1                      :func:`~.cpu_conv_schedule.schedule_conv2d`:
                                           register tiles vectorized over output channels
depthwise / grouped conv2d, pooling        :func:`~.cpu_conv_schedule.schedule_window`:
                                           tiles vectorized along output rows
dense ``x @ w`` (``w`` as ``[in, out]``)   :func:`~.cpu_conv_schedule.schedule_dense`
any other single reduction (mean, sum)     outer spatial axes in parallel
several reductions (softmax)               rows in parallel, injective parts vectorized
no reduction (elementwise, transpose,      producers inlined into the output; outer
concat, slicing, padding)                  axes in parallel, innermost axis vectorized
=========================================  ==============================================

The elementwise ops after a reduction (bias, BatchNorm, activation, residual add) are
applied to each register tile as it is written back. A rule that does not fit is
skipped for the next one; when none does the kernel stays unscheduled (logged at
debug level): schedules are an optimization, never a reason for a build to fail.
"""

from __future__ import annotations

import logging
import math

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.schedule import SBlockRV

from .cpu_conv_schedule import (
    Simd,
    extent,
    has_conditional,
    iter_kinds,
    schedule_conv2d,
    schedule_dense,
    schedule_window,
    vector_width,
)

log = logging.getLogger(__name__)

# Below this many elements a loop nest runs faster on one core than the thread pool
# takes to wake up (a few microseconds).
PARALLEL_MIN_ELEMENTS = 1 << 14

_MAIN_RULES = (schedule_conv2d, schedule_window, schedule_dense)


def schedule_cpu(func: tirx.PrimFunc, target: tvm.target.Target) -> tirx.PrimFunc:
    """Schedule one kernel for a CPU (LLVM) target.

    Parameters
    ----------
    func : tvm.tirx.PrimFunc
        An unscheduled kernel, as LegalizeOps and FuseTIR produce them.
    target : tvm.target.Target
        The LLVM target: its features (AVX-512, AVX2, NEON) set the vector width.

    Returns
    -------
    tvm.tirx.PrimFunc
        The scheduled kernel, computing the same function with the same signature;
        ``func`` itself if no rule applies or scheduling fails (logged at debug level).
    """
    symbol = func.attrs.get("global_symbol") if func.attrs else None
    try:
        unnamed = func.without_attr("global_symbol") if symbol else func
        scheduled, rule = _schedule(unnamed, Simd.of(target))
    except Exception as err:  # an unusual kernel: keep it correct, unscheduled
        log.debug("%s: no CPU schedule: %s", symbol or "kernel", err)
        return func
    log.debug("%s: scheduled by %s", symbol or "kernel", rule)
    return scheduled.with_attr("global_symbol", symbol) if symbol else scheduled


def schedule_module_cpu(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """Apply :func:`schedule_cpu` to every PrimFunc of ``mod``.

    Parameters
    ----------
    mod : tvm.IRModule
        Kernels (other functions pass through unchanged). A PrimFunc with the
        attribute ``edgecv.no_schedule`` set is left as it is.
    target : tvm.target.Target
        The LLVM target the kernels will be built for.

    Returns
    -------
    tvm.IRModule
        A new module with the scheduled kernels under the same names.
    """
    functions = {}
    for gv, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc) and not func.attrs.get("edgecv.no_schedule", False):
            func = schedule_cpu(func, target)
        functions[gv] = func
    return tvm.IRModule(functions)


def _schedule(func: tirx.PrimFunc, simd: Simd) -> tuple[tirx.PrimFunc, str]:
    """The scheduled kernel and the name of the rule that scheduled it."""
    sch = s_tir.Schedule(func)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    reductions = [b for b in blocks if "R" in iter_kinds(sch, b)]
    if not reductions:
        _schedule_injective(sch, simd)
        return sch.mod["main"], "injective"
    if len(reductions) == 1:
        for rule in _MAIN_RULES:
            try:
                return _apply_main_rule(func, rule, simd).mod["main"], rule.__name__
            except Exception as err:  # does not fit: the next rule
                log.debug("%s does not apply: %s", rule.__name__, err)
    # Several reductions (softmax, normalizations) or none of the rules fit: every nest
    # runs its leading spatial axes (the rows) in parallel, injective ones vectorized.
    for block in blocks:
        if "R" in iter_kinds(sch, block):
            _parallelize_outer(sch, block)
        else:
            _schedule_spatial(sch, block, simd)
    return sch.mod["main"], "rows"


def _apply_main_rule(func: tirx.PrimFunc, rule, simd: Simd) -> s_tir.Schedule:
    """Schedule the one reduction of ``func`` by ``rule``, its epilogue with it."""
    sch = s_tir.Schedule(func)
    blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
    index = next(i for i, b in enumerate(blocks) if "R" in iter_kinds(sch, b))
    main, producers, consumers = blocks[index], blocks[:index], blocks[index + 1 :]
    # One epilogue nest: every elementwise consumer inlined into the last one.
    for block in consumers[:-1]:
        sch.compute_inline(block)
    names = [sch.get(block).name_hint for block in producers]
    placed = rule(sch, main, consumers[-1] if consumers else None, simd)
    for name in names:
        if name not in placed:
            _schedule_spatial(sch, sch.get_sblock(name), simd)
    return sch


def _schedule_injective(sch: s_tir.Schedule, simd: Simd) -> None:
    """Inline every intermediate nest into the outputs, then schedule what is left."""
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    outputs = {sch.get(b).name_hint for b in sch.get_output_blocks(sch.get_sblock("root"))}
    for block in blocks:
        if sch.get(block).name_hint not in outputs:
            try:
                sch.compute_inline(block)
            except Exception:  # e.g. read by several consumers at different indices: keep
                pass
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        _schedule_spatial(sch, block, simd)


def _parallelize_outer(sch: s_tir.Schedule, block: SBlockRV) -> None:
    """Fuse the leading spatial loops of a reduction and run them in parallel."""
    kinds = iter_kinds(sch, block)
    loops = sch.get_loops(block)
    leading = len(kinds) - len(kinds.lstrip("S"))
    if len(loops) != len(kinds) or leading == 0:
        return
    work = math.prod(extent(sch, loop) for loop in loops)
    outer = sch.fuse(*loops[:leading]) if leading > 1 else loops[0]
    if work >= PARALLEL_MIN_ELEMENTS and extent(sch, outer) > 1:
        sch.parallel(outer)


def _schedule_spatial(sch: s_tir.Schedule, block: SBlockRV, simd: Simd) -> None:
    """An injective loop nest: the innermost axis in vectors, the others in parallel."""
    loops = sch.get_loops(block)
    kinds = iter_kinds(sch, block)
    if not loops or len(loops) != len(kinds) or kinds != "S" * len(kinds):
        return  # already placed inside another nest, or not a plain nest
    work = math.prod(extent(sch, loop) for loop in loops)
    lanes = vector_width(extent(sch, loops[-1]), simd)
    # A vector lane per if_then_else branch could read out of bounds (padding reads
    # x[i - 1]); such nests stay scalar for LLVM to vectorize safely if it can.
    if lanes >= 4 and not has_conditional(sch.get(block)):
        loops = [*loops[:-1], *sch.split(loops[-1], [None, lanes])]
        sch.vectorize(loops[-1])
        loops = loops[:-1]
    if len(loops) > 1 and extent(sch, loops[-1]) > 1:
        loops = [sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0], loops[-1]]
    else:
        loops = [sch.fuse(*loops)] if len(loops) > 1 else loops
    if loops and work >= PARALLEL_MIN_ELEMENTS and extent(sch, loops[0]) > 1:
        sch.parallel(loops[0])
