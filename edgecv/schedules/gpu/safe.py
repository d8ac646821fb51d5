"""The last resort: a schedule for any kernel, slow perhaps, but one that compiles.

Every block that can be inlined is; each remaining block gets its spatial loops fused
and spread over work-groups of at most 64 work-items, its reductions run serially
inside the work-item. A block whose loops resist that (an opaque block, loops that do
not map to its iterators) runs in one work-item of its own. Blocks that already launch
their own threads (edgecv's hand-written operators) are left as they are.
"""

from __future__ import annotations

import tvm_ffi
from tvm import s_tir, tirx
from tvm.target import Target

from .base import GPURule, bind_spatial, blocks, max_threads

# Small groups keep the rule valid on every device (Mali's limit for register-heavy
# kernels drops below 256) and leave enough groups for small kernels.
SAFE_THREADS = 64


def _binds_threads(stmt) -> bool:
    found = []

    def visit_for(node) -> None:
        if node.kind == tirx.ForKind.THREAD_BINDING:
            found.append(node)

    def visit_attr(node) -> None:
        if node.attr_key in ("thread_extent", "virtual_thread"):
            found.append(node)

    tvm_ffi.structural_walk(stmt, [(tirx.For, visit_for), (tirx.AttrStmt, visit_attr)])
    return bool(found)


def inline_all(sch: s_tir.Schedule) -> None:
    """Inline every block that will inline, into its consumers or its producer."""
    changed = True
    while changed:
        changed = False
        for block in blocks(sch):
            for inline in (sch.compute_inline, sch.reverse_compute_inline):
                try:
                    inline(block)
                except Exception:  # not inlinable is the common case
                    continue
                changed = True
                break
            if changed:
                break


def _one_item(sch: s_tir.Schedule, block) -> None:
    loops = sch.get_loops(block)
    outer = loops[0] if loops else block
    sch.bind(sch.add_unit_loop(outer), "threadIdx.x")
    sch.bind(sch.add_unit_loop(sch.get_loops(block)[0]), "blockIdx.x")


class SafeFallback(GPURule):
    """Any kernel: inline, bind fused spatial loops, serial reductions."""

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = self.new_schedule(func)
        inline_all(sch)
        limit = min(SAFE_THREADS, max_threads(target))
        for block in blocks(sch):
            if _binds_threads(sch.get(block)) or any(
                sch.get(loop).thread_binding is not None for loop in sch.get_loops(block)
            ):
                continue
            trial = sch.copy()
            try:
                bind_spatial(trial, block, limit)
            except Exception:  # fall back to one work-item for the block
                _one_item(sch, block)
            else:
                sch = trial
        return sch
