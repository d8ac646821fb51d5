"""The first ``k`` per-class detection rows by score, made from scores and boxes.

GluonCV's detectors hand ``box_nms`` one row ``(class, score, x1, y1, x2, y2)`` per
anchor and class: YOLOv3 tiles each anchor's box once per class and concatenates
``(ids, scores, boxes)``, so yolo3_mobilenet1.0_coco feeds its NMS 80 classes x 16,128
anchors = 1.29M rows (31 MB in float32, its tiled boxes 24 MB more) of which the NMS
keeps the first ``topk`` (400) by score. ``top_class_rows`` makes only those: from
``scores (B, N, C)`` and ``boxes (B, N, 4)`` it writes the ``k`` rows of the largest
sort keys among the virtual rows ``r = c * N + n`` (class-major, GluonCV's order), in
increasing ``r``.

The key of a row is ``box_nms``'s (:func:`.box_nms.sort_key`): its score when valid
(above ``valid_thresh``, class not ``background_id``), else the lowest float; among
equal keys the smaller ``r`` wins, as ``box_nms``'s stable sort decides. So
``box_nms(topk=k)`` over the concatenation of each piece's ``top_class_rows``, pieces in
their order, gives what it gives over all the rows: every row of the global first ``k``
is among the first ``k`` of its own piece, and the rows keep their relative order
(:func:`edgecv.frontend.mxnet.converters.vision.contrib_box_nms` rewrites the graph so).

The CPU version is a tensor expression (TVM's ``topk``, then the chosen indices
sorted); the GPU version (:func:`top_class_rows_gpu`) selects without sorting, in
workspaces of a few hundred bytes per work-group instead of the rows' size:

1. radix select, 4 bits a pass from the top: each work-group counts, per 4-bit digit,
   the keys (as order-preserving unsigned integers) that match the digits chosen so
   far; one work-group per batch row then picks the digit holding the ``k``-th largest
   key. Eight passes give that key ``t`` and how many keys equal to it are taken;
2. compaction in ``r`` order: per work-group the count of keys above ``t`` and equal
   to it, an exclusive scan over the work-groups, then each work-item walks its
   contiguous span and writes each chosen row at its rank.

:func:`top_class_rows_reference` is the NumPy reference.
"""

from __future__ import annotations

import numpy as np
from tvm import te, tirx, topi
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from .box_nms import key_of
from .launch import launch

__all__ = ["top_class_rows", "top_class_rows_gpu", "top_class_rows_reference"]

ROW = 6  # class, score, four box coordinates
DIGIT_BITS = 4
DIGITS = 1 << DIGIT_BITS
ITEMS = 16  # keys per work-item per pass


def check_shapes(scores_shape, boxes_shape, k: int) -> tuple[int, int, int]:
    """(batch, anchors N, classes C) of ``scores (B, N, C)`` and ``boxes (B, N, 4)``;
    ValueError naming what does not fit."""
    scores_shape = tuple(int(d) for d in scores_shape)
    boxes_shape = tuple(int(d) for d in boxes_shape)
    if len(scores_shape) != 3 or len(boxes_shape) != 3:
        raise ValueError(
            f"top_class_rows: scores must be (B, N, C) and boxes (B, N, 4), found "
            f"{scores_shape} and {boxes_shape}"
        )
    batch, n, classes = scores_shape
    if boxes_shape != (batch, n, 4):
        raise ValueError(
            f"top_class_rows: boxes {boxes_shape} do not match scores {scores_shape}: "
            f"expected {(batch, n, 4)}"
        )
    if not 0 < k <= n * classes:
        raise ValueError(f"top_class_rows: k={k} must be in 1..{n * classes} (N x C)")
    return batch, n, classes


def top_class_rows_reference(
    scores: np.ndarray,
    boxes: np.ndarray,
    k: int,
    valid_thresh: float = 0.0,
    background_id: int = -1,
) -> np.ndarray:
    """``(B, k, 6)``: the rows of the ``k`` largest keys, in increasing ``r = c*N + n``."""
    batch, n, classes = check_shapes(scores.shape, boxes.shape, k)
    out = np.empty((batch, k, ROW), np.float32)
    c = np.repeat(np.arange(classes), n)  # class of r
    a = np.tile(np.arange(n), classes)  # anchor of r
    for b in range(batch):
        score = scores[b].T.reshape(-1).astype(np.float32)  # score of r
        valid = (score > np.float32(valid_thresh)) & (c.astype(np.float32) != background_id)
        key = np.where(valid, score, np.finfo(np.float32).min)
        # the first k by key, descending, ties by r ascending; then in r order
        chosen = np.sort(np.lexsort((np.arange(len(key)), -key))[:k])
        out[b, :, 0] = c[chosen]
        out[b, :, 1] = score[chosen]
        out[b, :, 2:] = boxes[b, a[chosen]]
    return out


def _key(score, c, valid_thresh: float, background_id: int, dtype: str):
    """``box_nms``'s sort key (:func:`.box_nms.key_of`) of the row of class ``c`` with
    ``score``; a zero key is +0 (the unsigned order would put -0 below +0, which
    compare equal)."""
    attrs = {"valid_thresh": valid_thresh, "background_id": background_id}
    key = key_of(score, tirx.Cast(dtype, c), attrs, dtype)
    zero = tirx.const(0.0, dtype)
    return tirx.Select(key == zero, zero, key)


def top_class_rows(
    scores: te.Tensor,
    boxes: te.Tensor,
    k: int,
    valid_thresh: float = 0.0,
    background_id: int = -1,
) -> te.Tensor:
    """The CPU version as a tensor expression: ``(B, k, 6)`` float32 rows."""
    batch, n, classes = check_shapes(scores.shape, boxes.shape, k)
    dtype = scores.dtype
    keys = te.compute(
        (batch, n * classes),
        lambda b, r: _key(scores[b, r % n, r // n], r // n, valid_thresh, background_id, dtype),
        name="class_row_keys",
    )
    # TVM's CPU topk keeps a heap of k, ties in input order (box_nms relies on it too)
    chosen = topi.topk(keys, k=k, axis=1, ret_type="indices", is_ascend=False, dtype="int32")
    ordered = topi.sort(chosen, axis=1, is_ascend=True)

    def row(b, j, f):
        r = ordered[b, j]
        c, a = r // n, r % n
        value = boxes[b, a, tirx.max(f - 2, 0)]
        value = tirx.Select(f == 1, scores[b, a, c], value)
        return tirx.Select(f == 0, tirx.Cast(dtype, c), value)

    return te.compute((batch, k, ROW), row, name="top_class_rows")


# -- GPU ------------------------------------------------------------------------------


def _ordered(key):
    """The float ``key`` as an unsigned integer of the same order."""
    bits = tirx.reinterpret("uint32", key)
    top = tirx.const(0x80000000, "uint32")
    negative = (bits & top) != tirx.const(0, "uint32")
    return tirx.Select(negative, bits ^ tirx.const(0xFFFFFFFF, "uint32"), bits | top)


def top_class_rows_gpu(
    scores_shape,
    boxes_shape,
    k: int,
    valid_thresh: float = 0.0,
    background_id: int = -1,
    dtype: str = "float32",
    threads: int = 256,
) -> tirx.PrimFunc:
    """The GPU version as a scheduled PrimFunc ``(scores, boxes, out)``; the stages are
    in the module's docstring. Batch rows are independent: each stage's work-groups
    cover every batch row."""
    batch, n, classes = check_shapes(scores_shape, boxes_shape, k)
    if threads & (threads - 1) or threads < DIGITS:
        raise ValueError(f"top_class_rows: threads must be a power of two >= 16, not {threads}")
    total = n * classes
    span = threads * ITEMS  # keys per work-group
    groups = -(-total // span)
    u32 = "uint32"

    def ordered_key(score, c):
        """The row's key as an unsigned integer, each step in a register: written as one
        expression, every use of it repeats the whole computation in the source."""
        value = T.buffer_proxy(T.alloc_buffer((2,), dtype, scope="local"))
        value[0] = score
        value[1] = _key(value[0], c, valid_thresh, background_id, dtype)
        ordered = T.buffer_proxy(T.alloc_buffer((1,), u32, scope="local"))
        ordered[0] = _ordered(value[1])
        return ordered[0]

    def row_key(b, r):  # virtual row r = c * n + a
        c, a = r // n, r % n
        return ordered_key(scores[b, a, c], c)

    def key_in_memory_order(b, m):  # m = a * classes + c: neighbours read neighbours
        a, c = m // classes, m % classes
        return ordered_key(scores[b, a, c], c)

    def sync():
        T.evaluate(T.tvm_storage_sync("shared"))

    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("top_class_rows")
            T.func_attr({"tirx.is_scheduled": True, "global_symbol": "top_class_rows"})
            scores = T.buffer_proxy(
                T.match_buffer(T.arg("scores", T.handle()), (batch, n, classes), dtype)
            )
            boxes = T.buffer_proxy(T.match_buffer(T.arg("boxes", T.handle()), (batch, n, 4), dtype))
            out = T.buffer_proxy(T.match_buffer(T.arg("out", T.handle()), (batch, k, ROW), dtype))

            def workspace(shape, dt):
                return T.buffer_proxy(T.alloc_buffer(shape, dt, scope="global"))

            # per batch row: the digits chosen so far and which bits they cover
            prefix = workspace((batch, 2), u32)  # [prefix, mask]
            remaining = workspace((batch,), "int32")  # keys still to take at the prefix
            counts = workspace((batch, groups, DIGITS), "int32")
            offsets = workspace((batch, groups, 2), "int32")  # above t, equal to t

            g_frame, t_frame, bx, tx = launch(-(-batch // threads), threads)
            with g_frame, t_frame:
                b = bx * threads + tx
                with T.If(b < batch):
                    with T.Then():
                        prefix[b, 0] = tirx.const(0, u32)
                        prefix[b, 1] = tirx.const(0, u32)
                        remaining[b] = k

            # 1. radix select, most significant digit first
            for shift in range(32 - DIGIT_BITS, -1, -DIGIT_BITS):
                g_frame, t_frame, bx, tx = launch(batch * groups, threads)
                with g_frame, t_frame:
                    b, g = bx // groups, bx % groups
                    tally = T.buffer_proxy(T.alloc_buffer((DIGITS,), "int32", scope="local"))
                    shared = T.buffer_proxy(
                        T.alloc_buffer((DIGITS * threads,), "int32", scope="shared")
                    )
                    with T.serial(0, DIGITS) as d:
                        tally[d] = 0
                    with T.serial(0, ITEMS) as i:
                        m = g * span + i * threads + tx
                        with T.If(m < total):
                            with T.Then():
                                u = key_in_memory_order(b, m)
                                with T.If((u & prefix[b, 1]) == prefix[b, 0]):
                                    with T.Then():
                                        d = tirx.Cast(
                                            "int32",
                                            (u >> tirx.const(shift, u32))
                                            & tirx.const(DIGITS - 1, u32),
                                        )
                                        tally[d] = tally[d] + 1
                    with T.serial(0, DIGITS) as d:
                        shared[d * threads + tx] = tally[d]
                    sync()
                    with T.If(tx < DIGITS):
                        with T.Then():
                            tally[0] = 0
                            with T.serial(0, threads) as j:
                                tally[0] = tally[0] + shared[tx * threads + j]
                            counts[b, g, tx] = tally[0]

                g_frame, t_frame, bx, tx = launch(batch, DIGITS)
                with g_frame, t_frame:
                    b = bx
                    tally = T.buffer_proxy(T.alloc_buffer((3,), "int32", scope="local"))
                    totals = T.buffer_proxy(T.alloc_buffer((DIGITS,), "int32", scope="shared"))
                    tally[0] = 0
                    with T.serial(0, groups) as g:
                        tally[0] = tally[0] + counts[b, g, tx]
                    totals[tx] = tally[0]
                    sync()
                    with T.If(tx == 0):
                        with T.Then():
                            tally[0] = 0  # keys above the digit being looked at
                            tally[1] = -1  # the digit holding the k-th key
                            with T.serial(0, DIGITS) as j:
                                d = DIGITS - 1 - j
                                tally[2] = totals[d]  # (no shared memory in a condition)
                                with T.If(tally[1] < 0):
                                    with T.Then():
                                        with T.If(tally[0] + tally[2] >= remaining[b]):
                                            with T.Then():
                                                tally[1] = d
                                            with T.Else():
                                                tally[0] = tally[0] + tally[2]
                            digit = tirx.Cast(u32, tirx.max(tally[1], 0))
                            prefix[b, 0] = prefix[b, 0] | (digit << tirx.const(shift, u32))
                            prefix[b, 1] = prefix[b, 1] | tirx.const((DIGITS - 1) << shift, u32)
                            remaining[b] = remaining[b] - tally[0]

            # 2. compaction in r order: each work-item owns ITEMS consecutive rows
            def own_counts(b, g, tx, tally):
                """tally[0], tally[1]: this work-item's keys above t and equal to t."""
                tally[0] = 0
                tally[1] = 0
                with T.serial(0, ITEMS) as i:
                    r = g * span + tx * ITEMS + i
                    with T.If(r < total):
                        with T.Then():
                            u = row_key(b, r)
                            tally[0] = tally[0] + tirx.Select(u > prefix[b, 0], 1, 0)
                            tally[1] = tally[1] + tirx.Select(u == prefix[b, 0], 1, 0)

            g_frame, t_frame, bx, tx = launch(batch * groups, threads)
            with g_frame, t_frame:
                b, g = bx // groups, bx % groups
                tally = T.buffer_proxy(T.alloc_buffer((2,), "int32", scope="local"))
                shared = T.buffer_proxy(T.alloc_buffer((2 * threads,), "int32", scope="shared"))
                own_counts(b, g, tx, tally)
                shared[tx] = tally[0]
                shared[threads + tx] = tally[1]
                sync()
                with T.If(tx < 2):
                    with T.Then():
                        tally[0] = 0
                        with T.serial(0, threads) as j:
                            tally[0] = tally[0] + shared[tx * threads + j]
                        offsets[b, g, tx] = tally[0]

            g_frame, t_frame, bx, tx = launch(batch, 2)
            with g_frame, t_frame:  # exclusive scan over the work-groups, in place
                b = bx
                tally = T.buffer_proxy(T.alloc_buffer((2,), "int32", scope="local"))
                tally[0] = 0
                with T.serial(0, groups) as g:
                    tally[1] = offsets[b, g, tx]
                    offsets[b, g, tx] = tally[0]
                    tally[0] = tally[0] + tally[1]

            g_frame, t_frame, bx, tx = launch(batch * groups, threads)
            with g_frame, t_frame:
                b, g = bx // groups, bx % groups
                tally = T.buffer_proxy(T.alloc_buffer((4,), "int32", scope="local"))
                shared = T.buffer_proxy(T.alloc_buffer((2 * threads,), "int32", scope="shared"))
                own_counts(b, g, tx, tally)
                shared[tx] = tally[0]
                shared[threads + tx] = tally[1]
                sync()
                offset = 1
                while offset < threads:  # inclusive scan of both counts (Hillis-Steele)
                    tally[2] = tirx.Select(tx >= offset, shared[tirx.max(tx - offset, 0)], 0)
                    tally[3] = tirx.Select(
                        tx >= offset, shared[threads + tirx.max(tx - offset, 0)], 0
                    )
                    sync()
                    shared[tx] = shared[tx] + tally[2]
                    shared[threads + tx] = shared[threads + tx] + tally[3]
                    sync()
                    offset *= 2
                # keys above t and equal to t before this work-item's first row
                tally[2] = offsets[b, g, 0] + shared[tx] - tally[0]
                tally[3] = offsets[b, g, 1] + shared[threads + tx] - tally[1]
                with T.serial(0, ITEMS) as i:
                    r = g * span + tx * ITEMS + i
                    with T.If(r < total):
                        with T.Then():
                            u = row_key(b, r)
                            above, equal = u > prefix[b, 0], u == prefix[b, 0]
                            chosen = tirx.Or(above, tirx.And(equal, tally[3] < remaining[b]))
                            with T.If(chosen):
                                with T.Then():
                                    at = tally[2] + tirx.min(tally[3], remaining[b])
                                    c, a = r // n, r % n
                                    out[b, at, 0] = tirx.Cast(dtype, c)
                                    out[b, at, 1] = scores[b, a, c]
                                    for f in range(4):
                                        out[b, at, 2 + f] = boxes[b, a, f]
                            tally[2] = tally[2] + tirx.Select(above, 1, 0)
                            tally[3] = tally[3] + tirx.Select(equal, 1, 0)
    return ib.get()
