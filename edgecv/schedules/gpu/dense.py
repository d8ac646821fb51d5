"""Dense layers at batch 1 (MXNet's FullyConnected): ``out[n] = sum_k x[k] * w[k, n]``.

edgecv's importer emits ``matmul(x, permute_dims(w))`` and constant folding stores the
weight as ``[K, N]``, a layout dlight's GEMV rule does not take (it falls to its
cross-thread Reduction: one work-group per output). Here one work-item computes one
output: consecutive work-items read consecutive weights (coalesced; a vector load on
Intel's CPU runtime) and the same input value (uniform), accumulating in a register
with the bias and activation fused after. A ``[N, K]`` weight is left to dlight.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.target import Target

from .base import GPURule, bind_spatial, extent, inline_around, iter_kinds, max_threads

THREADS = 64  # a 1000-class layer still spreads over 16 work-groups
UNROLL = 4


class DenseColumns(GPURule):
    """A ``matmul`` block over ``(1, N)`` outputs whose weight is ``[K, N]``."""

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        started = self.start(func, target)
        if started is None:
            return None
        sch, found, reductions = started
        if len(reductions) != 1 or iter_kinds(sch, reductions[0]) != "SSR":
            return None
        dense = reductions[0]
        stmt = sch.get(dense)
        if not stmt.name_hint.startswith(("matmul", "T_matmul")) or len(stmt.reads) != 2:
            return None
        weight = stmt.reads[1].source  # reads: x, w
        batch, columns, depth = (extent(sch, loop) for loop in sch.get_loops(dense))
        if batch != 1 or [int(d) for d in weight.shape] != [depth, columns]:
            return None
        _, out = inline_around(sch, dense, found)
        _, item, reduce = bind_spatial(sch, dense, min(THREADS, max_threads(target)))
        if out is None:
            out = sch.cache_write(dense, 0, "local")
        else:
            sch.set_scope(dense, 0, "local")
        sch.reverse_compute_at(out, item, preserve_unit_loops=True)
        outer, inner = sch.split(reduce[0], [None, UNROLL if depth % UNROLL == 0 else 1])
        sch.decompose_reduction(dense, outer)
        sch.unroll(inner)
        return sch
