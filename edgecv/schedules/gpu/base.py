"""What edgecv's GPU schedule rules share: the rule base class, target limits, and
inlining of the injective blocks around a kernel's main block."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.dlight import ScheduleRule
from tvm.target import Target

from ..stage import copy_of

# The function attribute dlight's ApplyDefaultSchedule sets on what it scheduled and
# checks to skip functions already scheduled (TVM 0.27).
SCHEDULED = "tirx.is_scheduled"


class GPURule(ScheduleRule):
    """A rule for OpenCL and CUDA targets; ``apply`` returns None on other targets."""

    def is_target_available(self, target: Target) -> bool:
        return "gpu" in target.keys

    @staticmethod
    def new_schedule(func: tirx.PrimFunc) -> s_tir.Schedule:
        """A schedule of a copy of ``func`` whose result is marked scheduled (schedule
        primitives keep function attributes), so a later dlight pass leaves it alone.

        The copy matters: a schedule rewrites the statements of the function it was
        given in place (seen in TVM 0.27), so a rule that failed halfway, or succeeded,
        would leave the caller's kernel changed for the next rule or the CPU build.
        """
        return s_tir.Schedule(copy_of(func).with_attr(SCHEDULED, True))

    def start(self, func, target: Target):
        """``(schedule, blocks, reduction blocks)`` of a copy of ``func``, or None when
        ``func`` is not a PrimFunc or ``target`` is not a GPU (the common opening of
        every rule's ``apply``)."""
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = self.new_schedule(func)
        found = blocks(sch)
        return sch, found, [b for b in found if "R" in iter_kinds(sch, b)]

    @staticmethod
    def variants(
        func: tirx.PrimFunc,
        target: Target,
        default,
        knobs: Sequence,
        schedule: Callable,
        fit: Callable | None = None,
    ) -> s_tir.Schedule | list[s_tir.Schedule] | None:
        """``schedule(func, target, default)``, the rule's schedule with its default
        knobs (tile sizes); with ``knobs`` (dlight's ``tunable``) a list of it and of
        every distinct schedule the other knob values give: a tuner's candidates.

        Knob values are upper bounds fitted to the kernel's extents, so many give the
        same schedule (kept once); one that does not schedule this kernel is left out.
        ``fit(knob)``, when given, is a knob as fitted to this kernel (all the schedule
        depends on): a knob fitted as one tried before is not scheduled again.
        """
        first = schedule(func, target, default)
        if first is None or not knobs:
            return first
        found, seen = [first], {tvm_ffi.structural_hash(first.mod)}
        fitted = {fit(default)} if fit is not None else set()
        for knob in knobs:
            if fit is not None:
                if fit(knob) in fitted:  # fitted as a knob tried before: its schedule
                    continue
                fitted.add(fit(knob))
            try:
                sch = schedule(func, target, knob)
            except (RuntimeError, ValueError):  # TVM refused: these knobs do not fit this kernel
                continue
            key = None if sch is None else tvm_ffi.structural_hash(sch.mod)
            if key is not None and key not in seen:
                seen.add(key)
                found.append(sch)
        return found


def max_threads(target: Target) -> int:
    """The work-group size limit of ``target`` (its ``max_num_threads``)."""
    for name in ("max_threads_per_block", "max_num_threads"):
        value = target.attrs.get(name)
        if value is not None:
            return int(value)
    return 1024 if target.kind.name == "cuda" else 256


def extent(sch: s_tir.Schedule, loop) -> int:
    """A loop's constant extent (the rules only take static shapes)."""
    value = sch.get(loop).extent
    if not isinstance(value, tirx.IntImm):
        raise ValueError(f"loop extent {value} is not a constant")
    return int(value)


def iter_kinds(sch: s_tir.Schedule, block) -> str:
    """``"SSSSRRR"``: each block iterator spatial (S), reduction (R) or other (O)."""
    kinds = {tirx.IterVar.DataPar: "S", tirx.IterVar.CommReduce: "R"}
    return "".join(kinds.get(int(v.iter_type), "O") for v in sch.get(block).iter_vars)


def blocks(sch: s_tir.Schedule) -> list:
    """The root block's children, in program order."""
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def is_spatial(sch: s_tir.Schedule, block) -> bool:
    return set(iter_kinds(sch, block)) <= {"S"}


# work-items per group of the nests left after a main block (see inline_around)
TAIL_THREADS = 64


def inline_around(sch: s_tir.Schedule, main, found: list, keep_input: bool = False):
    """Inline every block before ``main`` into its consumers (padding, casts) and every
    block after it but the last into the last (bias, BatchNorm affine, activations,
    residual adds). Returns ``(input, output)``: with ``keep_input`` the block that
    writes ``main``'s first input (the padding, kept so it can be staged in
    registers), and the last block (it writes the output); each None when there is
    none (``main`` reads a parameter, writes the output itself). Raises when a block
    will not inline."""
    index = [sch.get(b).same_as(sch.get(main)) for b in found].index(True)
    before, after = found[:index], found[index + 1 :]
    # A consumer that changes the shape (the next layer's explicit `pad`, fused after
    # this conv by FuseOps) is no epilogue: computed from the register tile it would
    # leave its border unwritten. Such trailing blocks stay nests of their own.
    shape = [int(d) for d in sch.get(main).writes[0].source.shape]
    tail = []
    while after and [int(d) for d in sch.get(after[-1]).writes[0].source.shape] != shape:
        tail.insert(0, after.pop())
    for block in tail[:-1]:
        sch.compute_inline(block)
    if tail:
        bind_spatial(sch, tail[-1], TAIL_THREADS)
    data = sch.get(main).reads[0].source
    kept = None
    for block in reversed(before):
        if keep_input and kept is None and sch.get(block).writes[0].source.same_as(data):
            kept = block
        else:
            sch.compute_inline(block)
    for block in after[:-1]:
        sch.compute_inline(block)
    return kept, (after[-1] if after else None)


def divisor_at_most(value: int, limit: int) -> int:
    """The largest divisor of ``value`` not above ``limit``."""
    return max(d for d in range(1, min(value, limit) + 1) if value % d == 0)


def work_items(value: int, limit: int) -> int:
    """Work-items along an axis of ``value`` iterations: its largest divisor up to
    ``limit``.

    A split the thread count does not divide puts a predicate on every statement of
    the kernel, which made convolutions several times slower on Intel's CPU runtime
    (``benchmarks/results/gpu_rules-2026-11-23-intel-cpu-opencl.md``). Extents with no
    divisor of at least 16 (a prime width) are split 32-wide, predicated.
    """
    best = divisor_at_most(value, limit)
    if best < 16 and value > best:
        return min(32, limit)
    return best


def loop_kinds(sch: s_tir.Schedule, block) -> str:
    """The kind of each loop above ``block`` (``"SSSSRR"``), for blocks whose loops
    bind its iterators one to one (what legalization emits); raises otherwise.

    A wrong guess cannot go unnoticed: ``bind`` refuses a loop that a reduction
    iterator depends on.
    """
    loops, kinds = sch.get_loops(block), iter_kinds(sch, block)
    if len(loops) != len(kinds):
        raise ValueError(f"{sch.get(block).name_hint}: {len(loops)} loops, {len(kinds)} iterators")
    return kinds


def bind_spatial(sch: s_tir.Schedule, block, limit: int):
    """Fuse the spatial loops of ``block`` (reductions moved inside) into one loop over
    work-groups of at most ``limit`` work-items; returns ``(group, item, reductions)``."""
    loops, kinds = sch.get_loops(block), loop_kinds(sch, block)
    spatial = [loop for loop, kind in zip(loops, kinds, strict=True) if kind == "S"]
    reduce = [loop for loop, kind in zip(loops, kinds, strict=True) if kind != "S"]
    if not spatial:
        spatial = [sch.add_unit_loop(loops[0] if loops else block)]
    if reduce:
        sch.reorder(*spatial, *reduce)
    fused = sch.fuse(*spatial)
    group, item = sch.split(fused, [None, work_items(extent(sch, fused), limit)])
    sch.bind(group, "blockIdx.x")
    sch.bind(item, "threadIdx.x")
    return group, item, reduce


def _is_identity(region, iters: list, extents: list[int]) -> bool:
    """``region`` reads/writes its buffer at exactly the block's iterators, and the
    buffer has the block's shape (an elementwise access)."""
    shape = region.source.shape
    if len(shape) != len(iters) or any(int(d) != e for d, e in zip(shape, extents, strict=True)):
        return False
    return all(
        r.min.same_as(v) and isinstance(r.extent, tirx.IntImm) and int(r.extent) == 1
        for r, v in zip(region.region, iters, strict=True)
    )


def is_elementwise(sch: s_tir.Schedule, block) -> bool:
    """Every buffer ``block`` reads, it reads at exactly its own (spatial) iterators."""
    stmt = sch.get(block)
    iters = [v.var for v in stmt.iter_vars]
    if not all(isinstance(v.dom.extent, tirx.IntImm) for v in stmt.iter_vars):
        return False
    extents = [int(v.dom.extent) for v in stmt.iter_vars]
    return all(_is_identity(r, iters, extents) for r in stmt.reads)


def gathers(stmt) -> bool:
    """``stmt`` loads at an index that is itself loaded (Mask R-CNN's paste reads each
    box's corners to address its mask)."""
    found = []

    def visit(load) -> None:
        for index in load.indices:
            tvm_ffi.structural_walk(index, [(tvm.ir.expr.TensorLoad, found.append)])

    tvm_ffi.structural_walk(stmt, [(tvm.ir.expr.TensorLoad, visit)])
    return bool(found)


def flatten_block(sch: s_tir.Schedule, block) -> list | None:
    """Make a block's spatial iteration one loop over its output's elements in memory
    order (reductions, if any, stay inside it), with its output and every input it
    reads elementwise turned into 1-D buffers, so a split of that loop indexes them by
    ``group * size + item`` exactly.

    Fusing the loops of a 4-D block and splitting the fused loop instead leaves div/mod
    chains in every address that TVM's simplifier only partly folds back (a leaky ReLU
    at 64x208x208 indexed ``(g / 169) * 43264 + ...``): Intel's CPU runtime then gathers
    every load, far slower than the 1-D version. Returns the (new) buffers read
    elementwise, or None when the block's iterators are not spatial then reduction
    (``SSSSRR``), its output is not written at its spatial iterators or it gathers
    (loads at indices read from a buffer: TVM's layout transform cannot map those; the
    block is left unchanged then)."""
    stmt = sch.get(block)
    if gathers(stmt.body):
        return None
    kinds = iter_kinds(sch, block)
    spatial = len(kinds) - len(kinds.lstrip("S"))
    if spatial == 0 or set(kinds[spatial:]) - {"R"}:
        return None
    iters = [v.var for v in stmt.iter_vars[:spatial]]
    extents = []
    for v in stmt.iter_vars:
        if not isinstance(v.dom.extent, tirx.IntImm) or not is_zero(v.dom.min):
            return None
        extents.append(int(v.dom.extent))
    extents = extents[:spatial]
    if len(stmt.writes) != 1 or not _is_identity(stmt.writes[0], iters, extents):
        return None
    if len(sch.get_loops(block)) != len(kinds):
        return None

    def linear(*index):
        flat = index[0]
        for i, e in zip(index[1:spatial], extents[1:], strict=True):
            flat = flat * e + i
        return [flat, *index[spatial:]]

    elementwise = [r.source for r in stmt.reads if _is_identity(r, iters, extents)]
    if spatial > 1:
        buffers = tirx.IndexMap.from_func(linear, ndim=spatial)
        for buffer in [stmt.writes[0].source, *elementwise]:
            sch.transform_layout(block, buffer, buffers)
        sch.transform_block_layout(block, tirx.IndexMap.from_func(linear, ndim=len(kinds)))
    names = {b.name for b in elementwise}
    return [r.source for r in sch.get(block).reads if r.source.name in names]


def is_zero(expr) -> bool:
    return isinstance(expr, tirx.IntImm) and int(expr) == 0


def accumulate_in_registers(sch: s_tir.Schedule, conv, out, at):
    """``conv``'s accumulators in registers (its output, or a local cache of it when
    ``out`` is None: no fused consumer), written out under loop ``at``; returns the
    block that writes them out."""
    if out is None:
        out = sch.cache_write(conv, 0, "local")
    else:
        sch.set_scope(conv, 0, "local")
    sch.reverse_compute_at(out, at, preserve_unit_loops=True)
    return out
