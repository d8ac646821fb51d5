"""CPU rule: dense ``x @ w`` with ``w`` as ``[in, out]``, vectorized over outputs."""

from __future__ import annotations

from tvm import s_tir
from tvm.s_tir.schedule import SBlockRV

from .base import OneReductionRule
from .loop_nest import (
    NotApplicable,
    Simd,
    accumulate_locally,
    extent,
    largest_divisor,
    nest,
    read_index,
    unroll,
    vector_width,
)


def schedule_dense(
    sch: s_tir.Schedule, block: SBlockRV, epilogue: SBlockRV | None, simd: Simd
) -> set[str]:
    """``out[i, j] = sum_k x[i, k] * w[k, j]``, vectorized over ``j``.

    At batch 1 this is a matrix-vector product bound by reading ``w`` once: each thread
    takes a few vectors of outputs and streams their columns of ``w`` row by row.
    """
    i, j, k = nest(sch, block, "SSR")
    read_index(sch, block, (2, 1))  # w[k, j]: contiguous along the vectorized j
    outputs = extent(sch, j)
    lanes = vector_width(outputs, simd)
    if lanes < 4:
        raise NotApplicable(f"{outputs} outputs leave no vector")
    vectors = largest_divisor(outputs // lanes, simd.registers // 4)
    write_back = accumulate_locally(sch, block, epilogue)
    j_o, j_r, j_v = sch.split(j, [None, vectors, lanes])
    sch.reorder(i, j_o, k, j_r, j_v)
    parallel = sch.fuse(i, j_o)
    sch.parallel(parallel)
    unroll(sch, j_r)
    sch.vectorize(j_v)
    init = sch.decompose_reduction(block, k)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.reverse_compute_at(write_back, parallel)
    sch.vectorize(sch.get_loops(write_back)[-1])
    return set()


class Dense(OneReductionRule):
    """Dense at small batch: a matrix-vector product streaming ``w`` once."""

    def schedule(self, sch, main, epilogue, simd):
        return schedule_dense(sch, main, epilogue, simd)
