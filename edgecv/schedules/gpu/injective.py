"""Injective kernels: elementwise chains, transpose, concat, slices, pad, upsampling.

Everything inlines into the blocks that write outputs; each of those gets one
work-item per output element, consecutive work-items on consecutive elements (the
innermost axis), in work-groups that divide the element count where they can.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.target import Target

from .base import GPURule, bind_spatial, blocks, is_spatial, max_threads
from .safe import inline_all

# 256 work-items (or the device's limit): enough to fill a 16-lane vector 16 times on
# Intel's runtime and a few warps on a GPU.
THREADS = 256


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
            bind_spatial(sch, block, limit)
        return sch
