"""Which inputs of a kernel its output may overwrite.

A residual block ends in ``relu(conv(x) + bias + shortcut)``: the shortcut is read
once per output element, at that element's own index, and dies there. Writing the
output over the shortcut's bytes (in place) keeps the fresh output's cache lines out of
the memory traffic (benchmarks/results/in_place_outputs-2026-11-25-zen5.md).

The memory plan (:func:`~edgecv.lowering.memory_plan.plan_memory`) decides whether an
input dies at its launch; this module decides whether the kernel allows it, on the
kernel's unscheduled PrimFunc. Any schedule of it then does too: a schedule reorders,
tiles and inlines the blocks but computes every block instance once, so element ``i``
of the output is written after every read of element ``i`` of the input.
"""

from __future__ import annotations

import math

from tvm import ir, s_tir, tirx
from tvm.sym.analyzer import Analyzer

_DATA_PARALLEL = 0  # IterVar.iter_type of a spatial axis


def root_blocks(func: tirx.PrimFunc) -> list | None:
    """The blocks directly under ``func``'s root, or None for a kernel of plain loops
    (no blocks) or of nested blocks (what both analyses below read; ``lower`` reads them
    once per kernel for both)."""
    try:
        sch = s_tir.Schedule(func)
        children = sch.get_child_blocks(sch.get_sblock("root"))
        if any(sch.get_child_blocks(b) for b in children):
            return None
        return [sch.get(b) for b in children]
    except s_tir.ScheduleError:
        return None


def elementwise_inputs(func: tirx.PrimFunc, blocks: list | None = None) -> list[int]:
    """Positions of ``func``'s inputs that its single output may be written over.

    An input qualifies when every block reading it, and every block reading what those
    write, and so on, is spatial, reads that buffer at exactly the element it writes
    (one buffer, of the same shape), and the chain ends in the output: element ``i`` of
    the input then feeds element ``i`` of the output and nothing else. The last
    parameter is the output (the memory plan asks only for kernels of one output);
    kernels of plain loops (no blocks) or of nested blocks give none. ``blocks``:
    :func:`root_blocks` of ``func``, when the caller has them.
    """
    params = list(func.params)  # tensors, each its own buffer
    if len(params) < 2 or any(not getattr(p, "shape", None) for p in params):
        return []
    blocks = root_blocks(func) if blocks is None else blocks
    if not blocks:
        return []
    *inputs, output = params
    if any(r.source.same_as(output) for b in blocks for r in b.reads):
        return []  # the output is read back: not written once, at the end
    return [
        position
        for position, buffer in enumerate(inputs)
        if _same_shape(buffer, output) and _flows_only_to(buffer, output, blocks)
    ]


def _flows_only_to(start: tirx.Var, output: tirx.Var, blocks: list) -> bool:
    """Whether every read of ``start`` (and of what it is copied into) is element for
    element, ending in ``output``."""
    frontier, seen, reached = [start], [], False
    while frontier:
        buffer = frontier.pop()
        if any(buffer.same_as(b) for b in seen):
            continue
        seen.append(buffer)
        readers = [b for b in blocks if any(r.source.same_as(buffer) for r in b.reads)]
        if not readers and not buffer.same_as(output):
            return False  # a dead end: the input is not consumed on the way to the output
        for block in readers:
            written = _identity_write(block, buffer)
            if written is None:
                return False
            if written.same_as(output):
                reached = True
            else:
                frontier.append(written)
    return reached


def _identity_write(block, buffer: tirx.Var) -> tirx.Var | None:
    """The buffer ``block`` writes if it reads ``buffer`` only at the element it writes
    (a spatial block over exactly ``buffer``'s shape), else None."""
    if block.init is not None or len(block.writes) != 1:
        return None
    iters = list(block.iter_vars)
    if len(iters) != len(buffer.shape) or any(
        it.iter_type != _DATA_PARALLEL
        or not _is_const(it.dom.min, 0)
        or not _equal(it.dom.extent, extent)
        for it, extent in zip(iters, buffer.shape, strict=True)
    ):
        return None
    regions = [r for r in block.reads if r.source.same_as(buffer)]
    write = block.writes[0]
    if not _same_shape(write.source, buffer):
        return None
    for region in [*regions, write]:
        if len(region.region) != len(iters) or any(
            not rng.min.same_as(it.var) or not _is_const(rng.extent, 1)
            for rng, it in zip(region.region, iters, strict=True)
        ):
            return None
    return write.source


def _same_shape(a: tirx.Var, b: tirx.Var) -> bool:
    return (
        a.dtype == b.dtype
        and len(a.shape) == len(b.shape)
        and all(_equal(x, y) for x, y in zip(a.shape, b.shape, strict=True))
    )


def _equal(a, b) -> bool:
    return isinstance(a, tirx.IntImm) and isinstance(b, tirx.IntImm) and a.value == b.value


def _is_const(expr, value: int) -> bool:
    return isinstance(expr, tirx.IntImm) and expr.value == value


def concat_pieces(func: tirx.PrimFunc, blocks: list | None = None) -> list[int]:
    """Byte offsets of each input of ``func`` in its output, where ``func`` is a
    concatenation of its inputs (in parameter order) along one axis and each input is
    one contiguous range of the output's bytes (every axis before the concatenated one
    of extent 1: batch 1, NCHW or NCHW[x]c along channels); else ``[]``.

    Such a kernel need not run: its producers can write their outputs straight into
    their ranges of its output (:func:`~edgecv.lowering.memory_plan.plan_memory`). It is
    recognized by what it computes, not by its name: one spatial block writing the
    output at its iterators, whose value, with the concatenated iterator confined to an
    input's range, simplifies to that input read at the shifted iterator. ``blocks``:
    :func:`root_blocks` of ``func``, when the caller has them.
    """
    params = list(func.params)
    if len(params) < 3 or any(not getattr(p, "shape", None) for p in params):
        return []
    *inputs, output = params
    blocks = root_blocks(func) if blocks is None else blocks
    if not blocks or len(blocks) != 1:
        return []
    (block,) = blocks
    shapes = [[int(d) if isinstance(d, tirx.IntImm) else None for d in p.shape] for p in params]
    out_shape = shapes[-1]
    if None in out_shape or any(len(s) != len(out_shape) for s in shapes):
        return []
    if any(p.dtype != output.dtype for p in inputs):
        return []
    differing = {
        i for s in shapes[:-1] for i, (d, o) in enumerate(zip(s, out_shape, strict=True)) if d != o
    }
    axis = min(differing) if differing else 0
    if len(differing) > 1 or any(d != 1 for d in out_shape[:axis]):
        return []
    if sum(s[axis] for s in shapes[:-1]) != out_shape[axis]:
        return []
    if _identity_write(block, output) is None or len(block.reads) != len(inputs):
        return []
    iters = [it.var for it in block.iter_vars]
    row_bytes = output.dtype.bits // 8 * math.prod(out_shape[axis + 1 :])
    offsets, start = [], 0
    for buffer, shape in zip(inputs, shapes[:-1], strict=True):
        analyzer = Analyzer()
        for i, (var, extent) in enumerate(zip(iters, out_shape, strict=True)):
            low, size = (start, shape[axis]) if i == axis else (0, extent)
            analyzer.bind(
                var,
                ir.Range.from_min_extent(
                    tirx.IntImm(str(var.ty), low), tirx.IntImm(str(var.ty), size)
                ),
            )
        value = analyzer.simplify(block.body.value)
        want = [v - start if i == axis else v for i, v in enumerate(iters)]
        if not (
            isinstance(value, ir.expr.TensorLoad)
            and value.source.same_as(buffer)
            and all(
                analyzer.can_prove_equal(got, expected)
                for got, expected in zip(value.indices, want, strict=True)
            )
        ):
            return []
        offsets.append(start * row_bytes)
        start += shape[axis]
    return offsets
