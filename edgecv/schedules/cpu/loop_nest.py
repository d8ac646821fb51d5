"""What the CPU rules share: the target's SIMD shape and loop-nest queries.

The register tiles of the rules are sized from :class:`Simd`: the accumulators of a
tile stay in vector registers for the whole reduction, and each value loaded from
memory feeds several of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.schedule import LoopRV, SBlockRV
from tvm.target.codegen import target_has_features

# Below this many elements a loop nest runs faster on one core than the thread pool
# takes to wake up (a few microseconds).
PARALLEL_MIN_ELEMENTS = 1 << 14

# Below this many independent chunks a parallel loop balances badly over the cores
# (an odd chunk idles all but one core at the end), so split finer.
PARALLEL_CHUNKS = 8


def _vectorizable_nearbyint() -> None:
    """Let TVM's vectorizer keep ``nearbyint`` (the rounding of every INT8
    quantization) in vectors. TVM 0.27 marks ``round``, ``floor`` and ``trunc``
    vectorizable but not ``nearbyint``, so a vectorized loop holding one became scalar
    code: LLVM re-vectorized some of it and not the rest, a residual block's last kernel
    running mostly scalar (benchmarks/results/int8_cpu-2026-11-27-zen3.md).
    ``llvm.nearbyint`` takes vectors (``vroundps``); OpenCL's ``rint`` too; TVM's CUDA
    code calls ``nearbyintf`` per lane."""
    op = tvm.ir.Op.get("tirx.nearbyint")
    if not op.get_attr("TVectorizable"):
        tvm.ir.register_op_attr("tirx.nearbyint", "TVectorizable", True)


_vectorizable_nearbyint()


class NotApplicable(Exception):
    """The schedule does not fit this kernel; the caller tries another one."""


@dataclass(frozen=True)
class Simd:
    """Vector registers of a CPU target: float32 lanes per register and their count."""

    lanes: int
    registers: int

    @classmethod
    def of(cls, target: tvm.target.Target) -> Simd:
        """The SIMD shape LLVM will generate code for (baseline x86-64 has SSE2 only)."""
        if target_has_features("avx512f", target):
            return cls(16, 32)
        if target_has_features("avx", target):
            return cls(8, 16)
        arm = target_has_features("neon", target) or target_has_features("asimd", target)
        return cls(4, 32 if arm else 16)


def extent(sch: s_tir.Schedule, loop: LoopRV) -> int:
    return int(sch.get(loop).extent)


def iter_kinds(sch: s_tir.Schedule, block: SBlockRV) -> str:
    """One letter per block iterator: S (spatial), R (reduction), O (other)."""
    kinds = {tirx.IterVar.DataPar: "S", tirx.IterVar.CommReduce: "R"}
    return "".join(kinds.get(iv.iter_type, "O") for iv in sch.get(block).iter_vars)


def largest_divisor(n: int, limit: int) -> int:
    """The largest divisor of ``n`` that is at most ``limit``."""
    return next(d for d in range(min(n, limit), 0, -1) if n % d == 0)


def vector_width(n: int, simd: Simd) -> int:
    """Lanes for a vectorized axis of extent ``n``: a full register if it divides ``n``,
    else a half one, else the largest divisor that fits one register."""
    for lanes in (simd.lanes, simd.lanes // 2):
        if lanes > 1 and n % lanes == 0:
            return lanes
    return largest_divisor(n, simd.lanes)


def nest(sch: s_tir.Schedule, block: SBlockRV, kinds: str) -> list[LoopRV]:
    """The block's loops, one per iterator in order, or NotApplicable."""
    loops = sch.get_loops(block)
    if iter_kinds(sch, block) != kinds or len(loops) != len(kinds):
        raise NotApplicable(f"expected a {kinds} loop nest")
    return loops


def read_index(sch: s_tir.Schedule, block: SBlockRV, pattern: Sequence[int]) -> int:
    """Which read of ``block`` is indexed exactly by its iterators ``pattern``."""
    stmt = sch.get(block)
    want = [stmt.iter_vars[i].var for i in pattern]
    for index, region in enumerate(stmt.reads):
        mins = [r.min for r in region.region]
        if len(mins) == len(want) and all(m.same_as(v) for m, v in zip(mins, want, strict=True)):
            return index
    raise NotApplicable("no operand indexed by the expected iterators")


def has_conditional(stmt: tirx.Stmt) -> bool:
    """Whether ``stmt`` contains an ``if_then_else`` (a guarded load, as in padding)."""
    found = []
    if_then_else = tvm.ir.Op.get("prim.if_then_else")

    def visit(call: tvm.ir.expr.Call) -> None:
        if call.op.same_as(if_then_else):
            found.append(call)

    tvm_ffi.structural_walk(stmt, (tvm.ir.expr.Call, visit), order="post")
    return bool(found)


def refuse_grouped(sch: s_tir.Schedule, conv: SBlockRV, data: tirx.BufferRegion) -> None:
    """NotApplicable where the input channels ``conv`` reads from ``data`` depend on its
    output channel (its second iterator): a grouped convolution."""
    if uses([r.min for r in data.region], sch.get(conv).iter_vars[1].var):
        raise NotApplicable("grouped convolution: input channels depend on the output channel")


def inline_plain_producers(sch: s_tir.Schedule, block: SBlockRV) -> set[str]:
    """Inline the producers of ``block`` that read their input unguarded (copies,
    reshapes, casts); return their names. A producer with a guarded load is padding,
    left to be materialized once, as conditional loads in the inner loop would cost
    more than the copy."""
    inlined = set()
    for producer in sch.get_producers(block):
        if not has_conditional(sch.get(producer)):
            inlined.add(sch.get(producer).name_hint)
            sch.compute_inline(producer)
    return inlined


def uses(expr_list: Sequence[tirx.Expr], var: tirx.Var) -> bool:
    return any(var.same_as(v) for e in expr_list for v in tirx.analysis.undefined_vars(e))


def accumulate_locally(sch: s_tir.Schedule, block: SBlockRV, epilogue: SBlockRV | None):
    """Accumulate in a local buffer (registers once unrolled); the elementwise epilogue
    (bias, BatchNorm, activation, residual add) runs on each tile as it is written back."""
    write_back = sch.cache_write(block, 0, "local")
    if epilogue is not None:
        sch.reverse_compute_inline(epilogue)
    return write_back


# Loops longer than this stay rolled: unrolling them only grows the code (an unrolled
# loop of 71,286 iterations kept LLVM busy for minutes).
MAX_UNROLL = 64


def unroll(sch: s_tir.Schedule, loop: LoopRV) -> None:
    """Unroll ``loop`` when it is short enough to pay; leave it otherwise."""
    if 1 < extent(sch, loop) <= MAX_UNROLL:
        sch.unroll(loop)


def parallelize_outer(sch: s_tir.Schedule, block: SBlockRV) -> None:
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


def schedule_spatial(sch: s_tir.Schedule, block: SBlockRV, simd: Simd) -> None:
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
