"""Segmented argsort for GPUs, written once in TIR: balanced blocks, then merge passes.

The segments (one per image, per class, ...) are laid end to end in one array of
``total`` keys, with ``offsets[s]`` the start of segment ``s`` (``offsets[-1] ==
total``; empty and one-element segments are fine). Work is cut by position, never by
segment, so a long segment and many short ones cost the same:

1. each key gets its segment id (a binary search in ``offsets``);
2. block sort: one work-group per block of ``block`` keys sorts it in local memory
   (bitonic network, a barrier per step);
3. merge passes: sorted runs of ``block``, ``2 block``, ``4 block``... keys merge
   pairwise, each work-item placing one element by a binary search for its rank in the
   partner run, one launch per pass, ping-ponging between two workspaces.

Every comparison is on ``(segment, key, index)`` -- segment ascending, key ascending
or descending, index ascending -- so the order is total, segments never mix (the
array is already in segment order) and equal keys keep their input order (stable).
The result is each element's index within its segment, as MXNet's ``argsort`` gives.
:func:`segmented_argsort_reference` is the NumPy reference.
"""

from __future__ import annotations

import numpy as np
from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

__all__ = ["segmented_argsort_gpu", "segmented_argsort_reference", "workspace_shapes"]

SUPPORTED_DTYPES = ("float32", "int32")
_LAST_SEGMENT = 2**31 - 1  # pads a block: sorts after every real element


def segmented_argsort_reference(
    keys: np.ndarray, offsets: np.ndarray, descending: bool = False
) -> np.ndarray:
    """Stable argsort of each segment ``keys[offsets[s]:offsets[s+1]]``, concatenated."""
    out = np.empty(len(keys), np.int32)
    for start, end in zip(offsets[:-1], offsets[1:], strict=True):
        segment = keys[start:end]
        # stable descending: sort the negated rank order, ties by position
        order = np.lexsort((np.arange(len(segment)), -segment if descending else segment))
        out[start:end] = order
    return out


def _passes(total: int, block: int) -> int:
    count, width = 0, block
    while width < total:
        count, width = count + 1, width * 2
    return count


def workspace_shapes(total: int) -> list[tuple[int]]:
    """Shapes of the six workspace buffers (keys, indices, segments; two of each)."""
    return [(total,)] * 6


def segmented_argsort_gpu(
    total: int,
    num_segments: int,
    dtype: str = "float32",
    descending: bool = False,
    block: int = 256,
    subgroup: int | None = None,
    merge_chunk: int = 32,
) -> tirx.PrimFunc:
    """The sort as a scheduled GPU PrimFunc.

    Arguments: ``keys (total,)``, ``offsets (num_segments + 1,) int32``, the result
    ``indices (total,) int32``, then six workspaces (:func:`workspace_shapes`).
    ``subgroup``: the Intel-subgroup variant for that subgroup size (OpenCL only);
    ``merge_chunk``: outputs each work-item merges in a merge pass.
    """
    from .subgroup import check_subgroup

    _check(total, num_segments, dtype, block)
    _check_chunk(merge_chunk)
    check_subgroup(subgroup, block, "argsort")
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("segmented_argsort")
            T.func_attr({"tirx.is_scheduled": True, "global_symbol": "segmented_argsort"})

            def arg(name, shape, dt):
                return T.buffer_proxy(T.match_buffer(T.arg(name, T.handle()), shape, dt))

            keys = arg("keys", (total,), dtype)
            offsets = arg("offsets", (num_segments + 1,), "int32")
            result = arg("indices", (total,), "int32")
            work = [
                (
                    arg(f"key_{s}", (total,), dtype),
                    arg(f"index_{s}", (total,), "int32"),
                    arg(f"segment_{s}", (total,), "int32"),
                )
                for s in "ab"
            ]

            def segment_of(g, scratch):
                """Last segment whose start <= g: a binary search in ``offsets``."""
                scratch[0] = 0
                scratch[1] = num_segments
                with T.While(scratch[1] - scratch[0] > 1):
                    scratch[2] = (scratch[0] + scratch[1]) // 2
                    with T.If(offsets[scratch[2]] <= g):
                        with T.Then():
                            scratch[0] = scratch[2]
                        with T.Else():
                            scratch[1] = scratch[2]
                return scratch[0]

            emit_segmented_sort(
                keys,
                result,
                work,
                total,
                segment_of,
                lambda seg: offsets[seg],
                dtype,
                descending,
                block,
                subgroup,
                merge_chunk,
            )
    return ib.get()


def _check(total: int, num_segments: int, dtype: str, block: int) -> None:
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"argsort: dtype {dtype} is not supported (use {SUPPORTED_DTYPES})")
    if total < 1 or num_segments < 1:
        raise ValueError(f"argsort: need total >= 1 and a segment, got {total}, {num_segments}")
    if block < 2 or block & (block - 1):
        raise ValueError(f"argsort: block must be a power of two >= 2, not {block}")


def _check_chunk(merge_chunk: int) -> None:
    if merge_chunk < 1 or merge_chunk & (merge_chunk - 1):
        raise ValueError(f"argsort: merge_chunk must be a power of two >= 1, not {merge_chunk}")


def _block_buffers(block: int, dtype: str):
    """A block's keys, indices and segments in local memory, and 3 ints of scratch."""

    def shared(dt):
        return T.buffer_proxy(T.alloc_buffer((block,), dt, scope="shared"))

    scratch = T.buffer_proxy(T.alloc_buffer((3,), "int32", scope="local"))
    return shared(dtype), shared("int32"), shared("int32"), scratch


def _emit_block_sort(keys, out, total: int, segment_of, dtype: str, block: int, before):
    """Segment ids and a bitonic sort per block in local memory: ``block / 2``
    work-items, each owning one compare-exchange pair per step (reads both, writes
    both), one barrier a step."""
    blocks = -(-total // block)
    int32 = "int32"
    half = block // 2
    bx, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.x")
    with T.launch_thread(bx, blocks), T.launch_thread(tx, half):
        sk, si, ss, lo = _block_buffers(block, dtype)
        pair = T.buffer_proxy(T.alloc_buffer((5,), int32, scope="local"))  # i, s of p and q; swap
        key = T.buffer_proxy(T.alloc_buffer((2,), dtype, scope="local"))
        for slot in (tx, tx + half):  # each work-item loads two keys
            g = bx * block + slot
            with T.If(g < total):
                with T.Then():
                    ss[slot] = segment_of(g, lo)
                    sk[slot] = keys[g]
                    si[slot] = g
                with T.Else():
                    ss[slot] = _LAST_SEGMENT
                    sk[slot] = keys[0]
                    si[slot] = g
        size = 2
        while size <= block:  # bitonic network
            stride = size // 2
            while stride >= 1:
                T.evaluate(T.tvm_storage_sync("shared"))
                p = (tx // stride) * 2 * stride + tx % stride
                q = p + stride
                key[0], pair[0], pair[1] = sk[p], si[p], ss[p]
                key[1], pair[2], pair[3] = sk[q], si[q], ss[q]
                q_first = before(pair[3], key[1], pair[2], pair[1], key[0], pair[0])
                p_first = before(pair[1], key[0], pair[0], pair[3], key[1], pair[2])
                # ascending (by `before`) where bit `size` of p is clear, else descending
                swap = tirx.Select((p & size) == 0, q_first, p_first)
                pair[4] = tirx.Select(swap, 1, 0)
                with T.If(pair[4] == 1):
                    with T.Then():
                        sk[p], si[p], ss[p] = key[1], pair[2], pair[3]
                        sk[q], si[q], ss[q] = key[0], pair[0], pair[1]
                stride //= 2
            size *= 2
        T.evaluate(T.tvm_storage_sync("shared"))
        for slot in (tx, tx + half):
            g = bx * block + slot
            with T.If(g < total):
                with T.Then():
                    out[0][g] = sk[slot]
                    out[1][g] = si[slot]
                    out[2][g] = ss[slot]


def _emit_subgroup_block_sort(
    keys, out, total: int, segment_of, dtype: str, block: int, size: int, before
):
    """The bitonic block sort with each work-item's element held in registers: steps
    whose partner is less than ``size`` positions away are within the subgroup and
    exchange by ``intel_sub_group_shuffle_xor`` (no local memory, no barrier); only the
    wider steps go through local memory. For a 256-key block and subgroups of 16 that
    is 10 of the 36 steps."""
    from . import subgroup as sg

    blocks = -(-total // block)
    int32 = "int32"
    bx, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.x")
    with T.launch_thread(bx, blocks), T.launch_thread(tx, block):
        sk, si, ss, lo = _block_buffers(block, dtype)
        own = T.buffer_proxy(T.alloc_buffer((3,), int32, scope="local"))  # index, segment, take
        other = T.buffer_proxy(T.alloc_buffer((2,), int32, scope="local"))
        key = T.buffer_proxy(T.alloc_buffer((2,), dtype, scope="local"))  # own, other
        g = bx * block + tx
        with T.If(g < total):
            with T.Then():
                own[1] = segment_of(g, lo)
                key[0] = keys[g]
            with T.Else():
                own[1] = _LAST_SEGMENT
                key[0] = keys[0]
        own[0] = g
        size_ = 2
        while size_ <= block:  # bitonic network
            stride = size_ // 2
            while stride >= 1:
                partner = tx ^ stride
                if stride >= size:  # across subgroups: through local memory
                    T.evaluate(T.tvm_storage_sync("shared"))
                    sk[tx] = key[0]
                    si[tx] = own[0]
                    ss[tx] = own[1]
                    T.evaluate(T.tvm_storage_sync("shared"))
                    key[1] = sk[partner]
                    other[0] = si[partner]
                    other[1] = ss[partner]
                else:  # within the subgroup: lane ^ stride is the partner
                    key[1] = sg.shuffle_xor(key[0], stride)
                    other[0] = sg.shuffle_xor(own[0], stride)
                    other[1] = sg.shuffle_xor(own[1], stride)
                p_first = before(other[1], key[1], other[0], own[1], key[0], own[0])
                keep_first = (tx < partner) == ((tx & size_) == 0)
                own[2] = tirx.Select(tirx.Select(keep_first, p_first, tirx.Not(p_first)), 1, 0)
                key[0] = tirx.Select(own[2] == 1, key[1], key[0])
                own[0] = tirx.Select(own[2] == 1, other[0], own[0])
                own[1] = tirx.Select(own[2] == 1, other[1], own[1])
                stride //= 2
            size_ *= 2
        with T.If(g < total):
            with T.Then():
                out[0][g] = key[0]
                out[1][g] = own[0]
                out[2][g] = own[1]


def emit_segmented_sort(
    keys,
    result,
    work,
    total: int,
    segment_of,
    segment_start,
    dtype: str,
    descending: bool,
    block: int,
    subgroup: int | None = None,
    merge_chunk: int = 32,
):
    """Emit the sort's launches into the PrimFunc being built (see the module docstring).

    ``keys``/``result`` are ``(total,)`` buffers, ``work`` two (key, index, segment)
    workspace triples; ``segment_of(g, scratch)`` may emit statements using the 3-int
    local ``scratch`` and returns the segment of position ``g``; ``segment_start(s)`` is
    the first position of segment ``s``; ``subgroup``: the Intel subgroup size for the
    subgroup block sort (OpenCL only); ``merge_chunk``: outputs per work-item in the
    merge passes (1: each element finds its own rank). Returns the work triple holding the sorted
    (key, index, segment) arrays. Callers should read the sorted keys: a buffer the
    PrimFunc only writes is compacted to one element by TVM 0.27's
    CompactBufferAllocation, which then fails in FlattenBuffer ("Buffer is used before
    its definition").
    """

    def before(s1, k1, i1, s2, k2, i2):
        """(s1, k1, i1) sorts strictly before (s2, k2, i2)."""
        key_first = k1 > k2 if descending else k1 < k2
        return tirx.Or(s1 < s2, tirx.And(s1 == s2, tirx.Or(key_first, tirx.And(k1 == k2, i1 < i2))))

    # 1 + 2. segment ids and block sort, one work-group per block
    if subgroup is not None:
        _emit_subgroup_block_sort(keys, work[0], total, segment_of, dtype, block, subgroup, before)
    else:
        _emit_block_sort(keys, work[0], total, segment_of, dtype, block, before)

    # 3. merge passes: runs of `width` merge pairwise
    width, src = block, 0
    threads = min(block, 256)
    for _ in range(_passes(total, block)):
        if merge_chunk == 1:
            _emit_rank_merge(work[src], work[1 - src], total, width, threads, before)
        else:
            # a chunk never straddles two pairs of runs (both are powers of two); one
            # chunk per pair (chunk == 2 * width) makes TVM 0.27's CompactBufferAllocation
            # divide by zero on workspaces, so a chunk is at most one run
            _emit_path_merge(
                work[src], work[1 - src], total, width, min(merge_chunk, width), before
            )
        width, src = width * 2, 1 - src

    # 4. indices within their segments
    k_in, i_in, s_in = work[src]
    bx, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.x")
    threads = min(block, 256)
    with T.launch_thread(bx, -(-total // threads)), T.launch_thread(tx, threads):
        e = bx * threads + tx
        with T.If(e < total):
            with T.Then():
                result[e] = i_in[e] - segment_start(s_in[e])
    return work[src]


def _emit_rank_merge(src, dst, total: int, width: int, threads: int, before) -> None:
    """One merge pass, a work-item per element: its rank in the partner run by binary
    search gives its place (``log2(width)`` probes of three arrays per element)."""
    (k_in, i_in, s_in), (k_out, i_out, s_out) = src, dst
    bx, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.x")
    with T.launch_thread(bx, -(-total // threads)), T.launch_thread(tx, threads):
        pos = T.buffer_proxy(T.alloc_buffer((4,), "int32", scope="local"))
        e = bx * threads + tx
        with T.If(e < total):
            with T.Then():
                run = e // width
                left = (run // 2) * 2 * width
                mid = tirx.min(left + width, total)
                end = tirx.min(left + 2 * width, total)
                in_left = run % 2 == 0
                # search the partner run for this element's rank
                pos[0] = tirx.Select(in_left, mid, left)  # low
                pos[1] = tirx.Select(in_left, end, mid)  # high
                with T.While(pos[0] < pos[1]):
                    pos[2] = (pos[0] + pos[1]) // 2
                    with T.If(
                        before(s_in[pos[2]], k_in[pos[2]], i_in[pos[2]], s_in[e], k_in[e], i_in[e])
                    ):
                        with T.Then():
                            pos[0] = pos[2] + 1
                        with T.Else():
                            pos[1] = pos[2]
                rank = pos[0] - tirx.Select(in_left, mid, left)
                own = e - tirx.Select(in_left, left, mid)
                pos[3] = left + own + rank
                k_out[pos[3]] = k_in[e]
                i_out[pos[3]] = i_in[e]
                s_out[pos[3]] = s_in[e]


def _emit_path_merge(src, dst, total: int, width: int, chunk: int, before) -> None:
    """One merge pass along the merge path: work-item ``t`` of a pair writes the
    ``chunk`` consecutive outputs from ``t * chunk``: one binary search finds how many
    of the outputs before it come from the left run (the co-rank), then it merges
    ``chunk`` steps sequentially. The whole array as one row whose pairs keep all
    their outputs (:func:`_emit_truncated_merge` with ``k = 2 * width``); the order is
    strict (indices differ), so the cut is unique and the merge stable."""
    _emit_truncated_merge(src, dst, 1, total, width, 2 * width, chunk, before)


# -- the first k of each row ----------------------------------------------------------


def topk_row_stride(n: int, block: int) -> int:
    """Positions per row in the top-k sort's layout: ``n`` padded to whole blocks."""
    return -(-n // block) * block


def topk_pad_key(dtype: str, descending: bool):
    """The key of a padding position: it sorts after every real key (ties: by index)."""
    info = np.finfo(dtype) if dtype.startswith("float") else np.iinfo(dtype)
    return tirx.const(info.min if descending else info.max, dtype)


def emit_row_topk_sort(
    keys,
    work,
    rows: int,
    n: int,
    k: int,
    dtype: str,
    descending: bool,
    block: int,
    subgroup: int | None = None,
    merge_chunk: int = 32,
):
    """Emit a sort that keeps only the first ``k`` of each row: ``keys`` is
    ``(rows * S,)`` with row ``r`` at ``r * S`` (``S =`` :func:`topk_row_stride`) and
    :func:`topk_pad_key` past ``n``; ``work`` two (key, index, segment) triples of that
    size. Rows never share a block, so blocks sort as in the full sort (row = segment);
    then each merge pass keeps only the first ``k`` outputs of every merged pair --
    the first ``k`` of a union are among the first ``k`` of each part -- so the work
    per pass falls with the number of runs instead of staying at the row length.

    Returns the triple whose key and index arrays hold, at ``r * S + j`` for
    ``j < min(k, S)``, row ``r``'s ``j``-th key and its flat index (``r * S + i``).
    """
    stride = topk_row_stride(n, block)
    total = rows * stride
    descending_cmp = descending

    def before(s1, k1, i1, s2, k2, i2):
        key_first = k1 > k2 if descending_cmp else k1 < k2
        return tirx.Or(s1 < s2, tirx.And(s1 == s2, tirx.Or(key_first, tirx.And(k1 == k2, i1 < i2))))

    def row_of(g, scratch):
        return g // stride

    if subgroup is not None:
        _emit_subgroup_block_sort(keys, work[0], total, row_of, dtype, block, subgroup, before)
    else:
        _emit_block_sort(keys, work[0], total, row_of, dtype, block, before)
    width, src = block, 0
    while width < stride:
        _emit_truncated_merge(
            work[src], work[1 - src], rows, stride, width, k, min(merge_chunk, k, width), before
        )
        width, src = width * 2, 1 - src
    return work[src]


def _emit_truncated_merge(
    src, dst, rows: int, stride: int, width: int, k: int, chunk: int, before
) -> None:
    """Merge runs of ``width`` pairwise within each row, writing only the first ``k``
    outputs of each pair (runs hold at most ``k`` meaningful keys after the first
    pass). Merge path: a co-rank search per ``chunk`` outputs (the split of the outputs
    before them between the two runs), then a sequential merge with the next element
    of each run in registers. ``chunk`` is at most ``width``: one chunk per pair makes
    TVM 0.27's CompactBufferAllocation divide by zero on workspaces."""
    (k_in, i_in, s_in), (k_out, i_out, s_out) = src, dst
    pairs = -(-stride // (2 * width))
    per_pair = -(-min(2 * width, k) // chunk)  # work-items per pair
    items = rows * pairs * per_pair
    threads = min(256, items)
    bx, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.x")
    with T.launch_thread(bx, -(-items // threads)), T.launch_thread(tx, threads):
        pos = T.buffer_proxy(T.alloc_buffer((6,), "int32", scope="local"))
        head = T.buffer_proxy(T.alloc_buffer((1,), "int32", scope="local"))
        item = bx * threads + tx
        with T.If(item < items):
            with T.Then():
                row, rest = item // (pairs * per_pair), item % (pairs * per_pair)
                pair, o = rest // per_pair, (rest % per_pair) * chunk
                base = row * stride + pair * 2 * width
                room = stride - pair * 2 * width  # positions of this row from the pair on
                len_a = tirx.min(tirx.min(room, width), k)
                len_b = tirx.min(tirx.min(tirx.max(room - width, 0), width), k)
                out_len = tirx.min(len_a + len_b, k)
                a0, b0 = base, base + width
                with T.If(o < out_len):
                    with T.Then():
                        pos[0] = tirx.max(0, o - len_b)
                        pos[1] = tirx.min(o, len_a)
                        with T.While(pos[0] < pos[1]):
                            pos[2] = (pos[0] + pos[1]) // 2
                            a, b_ = a0 + pos[2], b0 + o - pos[2] - 1
                            with T.If(
                                before(s_in[a], k_in[a], i_in[a], s_in[b_], k_in[b_], i_in[b_])
                            ):
                                with T.Then():
                                    pos[0] = pos[2] + 1
                                with T.Else():
                                    pos[1] = pos[2]
                        pos[3] = a0 + pos[0]
                        pos[4] = b0 + o - pos[0]
                        with T.serial(0, chunk) as c:
                            with T.If(o + c < out_len):
                                with T.Then():
                                    a, b_ = pos[3], pos[4]
                                    a_ok, b_ok = a < a0 + len_a, b_ < b0 + len_b
                                    ca = tirx.min(a, a0 + len_a - 1)
                                    # clamped reads (an empty right run reads a0)
                                    cb = tirx.Select(len_b > 0, tirx.min(b_, b0 + len_b - 1), a0)
                                    take_left = tirx.Or(
                                        tirx.Not(b_ok),
                                        tirx.And(
                                            a_ok,
                                            before(
                                                s_in[ca],
                                                k_in[ca],
                                                i_in[ca],
                                                s_in[cb],
                                                k_in[cb],
                                                i_in[cb],
                                            ),
                                        ),
                                    )
                                    head[0] = tirx.Select(take_left, 1, 0)
                                    pos[5] = tirx.Select(head[0] == 1, a, b_)
                                    k_out[base + o + c] = k_in[pos[5]]
                                    i_out[base + o + c] = i_in[pos[5]]
                                    s_out[base + o + c] = s_in[pos[5]]
                                    pos[3] = pos[3] + head[0]
                                    pos[4] = pos[4] + 1 - head[0]


def row_topk_argsort_gpu(
    rows: int,
    n: int,
    k: int,
    dtype: str = "float32",
    descending: bool = True,
    block: int = 256,
    subgroup: int | None = None,
    merge_chunk: int = 32,
) -> tirx.PrimFunc:
    """The first ``k`` entries of each row's stable argsort, as a scheduled GPU PrimFunc:
    ``keys (rows, n)`` -> ``indices (rows, min(k, n)) int32`` (see
    :func:`emit_row_topk_sort`); its workspaces are allocated inside."""
    from .subgroup import check_subgroup

    _check(rows * n, rows, dtype, block)
    _check_chunk(merge_chunk)
    check_subgroup(subgroup, block, "argsort")
    if k < 1:
        raise ValueError(f"argsort: k must be >= 1, not {k}")
    kk, stride = min(k, n), topk_row_stride(n, block)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("row_topk_argsort")
            T.func_attr({"tirx.is_scheduled": True, "global_symbol": "row_topk_argsort"})
            keys = T.buffer_proxy(T.match_buffer(T.arg("keys", T.handle()), (rows, n), dtype))
            result = T.buffer_proxy(
                T.match_buffer(T.arg("indices", T.handle()), (rows, kk), "int32")
            )

            def workspace(dt):
                return T.buffer_proxy(T.alloc_buffer((rows * stride,), dt, scope="global"))

            padded = workspace(dtype)
            work = [(workspace(dtype), workspace("int32"), workspace("int32")) for _ in "ab"]
            pad = topk_pad_key(dtype, descending)
            bx, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.x")
            with T.launch_thread(bx, rows * stride // block), T.launch_thread(tx, block):
                g = bx * block + tx
                r, i = g // stride, g % stride
                padded[g] = tirx.Select(i < n, keys[r, tirx.min(i, n - 1)], pad)
            s_keys, s_index, _ = emit_row_topk_sort(
                padded, work, rows, n, kk, dtype, descending, block, subgroup, merge_chunk
            )
            bx, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.x")
            threads = min(256, rows * kk)
            with T.launch_thread(bx, -(-rows * kk // threads)), T.launch_thread(tx, threads):
                e = bx * threads + tx
                with T.If(e < rows * kk):
                    with T.Then():
                        r, j = e // kk, e % kk
                        # reading the sorted key keeps its buffer (see emit_segmented_sort)
                        result[r, j] = (
                            s_index[r * stride + j]
                            - r * stride
                            + tirx.Select(s_keys[r * stride + j] == s_keys[r * stride + j], 0, 0)
                        )
    return ib.get()
