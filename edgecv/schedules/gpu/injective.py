"""Injective kernels: elementwise chains, transpose, concat, slices, pad, upsampling.

Everything inlines into the blocks that write outputs; each of those gets one
work-item per output element, consecutive work-items on consecutive elements. A block
that writes its output elementwise is first made 1-D (:func:`.base.flatten_block`), so
its output and the inputs it reads elementwise are addressed ``group * size + item``:
contiguous across work-items, which Intel's CPU runtime turns into vector loads and
stores (its gathers made a leaky ReLU far slower) and a GPU coalesces. An input read
there more than once (the ``x > 0 ? x : a * x`` of a leaky ReLU) is loaded once into a
register, so the select has no loads in its arms and stays a select, not a branch.

A block that computes math per field of a short last axis (a detector's box
decoding: the 4 box coordinates or 6 detection fields from sigmoids and exps,
assembled by slices, concats and reshapes) gets one work-item per row of that axis
instead, the row unrolled: each field's ``if_then_else`` on the position in the row is
decided at compile time and the row's index arithmetic is shared; with one work-item
per element the masked branches all ran every field's math and the addresses needed a
64-bit division per field. Without per-field math the 1-D schedule stays (by rows, the
loads and stores of a concat are strided). The times on Intel's CPU runtime:
benchmarks/results/gpu_rules-2026-11-23-intel-cpu-opencl.md.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.target import Target

from .base import (
    GPURule,
    bind_spatial,
    blocks,
    extent,
    flatten_block,
    is_elementwise,
    is_spatial,
    max_threads,
    work_items,
)
from .safe import inline_all

# 256 work-items (or the device's limit): enough to fill a 16-lane vector 16 times on
# Intel's runtime and a few warps on a GPU.
THREADS = 256
# a last axis up to this long (box coordinates, detection fields) is unrolled in one
# work-item when its fields are computed; longer ones (map widths) stay 1-D
SHORT_ROW = 8


def loads_of(stmt, buffer) -> int:
    """How many times ``stmt`` loads ``buffer``."""
    count = [0]

    def visit(node) -> None:
        if node.source.same_as(buffer):
            count[0] += 1

    tvm_ffi.structural_walk(stmt, [(tvm.ir.expr.TensorLoad, visit)])
    return count[0]


def schedule_flat(sch: s_tir.Schedule, block, limit: int) -> bool:
    """One work-item per element of a block written elementwise (see the module
    docstring); False, with nothing changed, for any other block."""
    elementwise = flatten_block(sch, block)
    if elementwise is None:
        return False
    (loop,) = sch.get_loops(block)
    group, item = sch.split(loop, [None, work_items(extent(sch, loop), limit)])
    sch.bind(group, "blockIdx.x")
    sch.bind(item, "threadIdx.x")
    for buffer in elementwise:
        if loads_of(sch.get(block).body, buffer) > 1:
            index = [r.source.same_as(buffer) for r in sch.get(block).reads].index(True)
            sch.compute_at(sch.cache_read(block, index, "local"), item)
    return True


def computes_math(stmt) -> bool:
    """``stmt`` calls a math function (sigmoid, exp, ...), not just selects/loads."""
    found = []

    def visit(call) -> None:
        name = str(getattr(call.op, "name", ""))
        if name.startswith("tirx.") and name not in ("tirx.likely", "tirx.if_then_else"):
            found.append(name)

    tvm_ffi.structural_walk(stmt, (tvm.ir.expr.Call, visit))
    return bool(found)


def schedule_rows(sch: s_tir.Schedule, block, limit: int) -> bool:
    """One work-item per row of a short last axis, unrolled (see the module docstring);
    False, with nothing changed, for other blocks."""
    loops = sch.get_loops(block)
    if len(loops) < 2 or extent(sch, loops[-1]) > SHORT_ROW or is_elementwise(sch, block):
        return False
    if not computes_math(sch.get(block).body):
        return False
    rows = sch.fuse(*loops[:-1])
    group, item = sch.split(rows, [None, work_items(extent(sch, rows), limit)])
    sch.bind(group, "blockIdx.x")
    sch.bind(item, "threadIdx.x")
    sch.unroll(loops[-1])
    return True


class Injective(GPURule):
    """Kernels whose every block is spatial (no reduction)."""

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = self.new_schedule(func)
        found = blocks(sch)
        if not found or not all(is_spatial(sch, b) for b in found):
            return None
        inline_all(sch)
        limit = min(THREADS, max_threads(target))
        for block in blocks(sch):
            if schedule_rows(sch, block, limit) or schedule_flat(sch, block, limit):
                continue
            bind_spatial(sch, block, limit)
        return sch
