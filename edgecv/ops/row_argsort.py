"""MXNet's ``argsort``/``sort``/``topk`` as one kernel: a stable argsort of each row.

The importer moves the sorted axis last, so every row of the ``(rows, n)`` keys is a
segment of edgecv's segmented sort (:mod:`.argsort`): the CPU version here is TVM's
stable argsort; the kernel is tagged ``edgecv.op = "row_argsort"`` so a GPU build can
swap in the segmented (or, for ``topk``, the row top-k) sort with the same parameters.
"""

from __future__ import annotations

from tvm import te, topi


def row_argsort(keys: te.Tensor, descending: bool = False, k: int = 0) -> te.Tensor:
    """Indices (int32) that sort each row of ``keys (rows, n)``, equal keys in input order;
    only the first ``k`` columns when ``0 < k < n``."""
    n = int(keys.shape[-1])
    order = topi.argsort(keys, axis=-1, is_ascend=not descending, dtype="int32")
    if 0 < k < n:
        rows = int(keys.shape[0])
        return te.compute((rows, k), lambda r, j: order[r, j], name="row_topk")
    return order
