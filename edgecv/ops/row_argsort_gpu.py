"""GPU version of :func:`edgecv.ops.row_argsort.row_argsort` (MXNet's argsort/sort/topk).

Every row is a segment of edgecv's segmented sort; the row top-k sort
(:func:`edgecv.ops.segmented_argsort.row_topk_argsort_gpu`) covers both cases: with ``k`` the
row length its merge passes keep everything (a full stable argsort), with a smaller
``k`` they keep only the first ``k`` of each merged run.
"""

from __future__ import annotations

import tvm

from .segmented_argsort import row_topk_argsort_gpu


def row_argsort_gpu_version(
    spec: dict, target: tvm.target.Target, threads: int, subgroup: int | None = None
):
    """The GPU PrimFunc for a kernel tagged ``row_argsort`` (the signature of
    :mod:`edgecv.codegen.op_versions`): same parameters, ``keys (rows, n)`` -> ``indices``."""
    rows, n = spec["shape"]
    k = spec["k"] if 0 < spec["k"] < n else n
    block = 1 << (min(threads, 256).bit_length() - 1)  # a power of two within the limit
    if subgroup is not None and block % subgroup:
        subgroup = None
    return row_topk_argsort_gpu(rows, n, k, spec["dtype"], spec["descending"], block, subgroup)
