"""Segmented argsort on OpenCL against NumPy (stable) and MXNet's argsort."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tvm
from conftest import needs_pocl, pocl_unusable
from hypothesis import given, settings
from hypothesis import strategies as st
from matrix import each_once, examples, heavy_selected

from edgecv.board.runtime.opencl_devices import opencl_devices
from edgecv.codegen.opencl import build_opencl
from edgecv.ops.segmented_argsort import (
    segmented_argsort_gpu,
    segmented_argsort_reference,
    workspace_shapes,
)
from edgecv.profiles import load_profile

pytestmark = pytest.mark.skipif(
    not any(d.matches("intel(r) opencl") for d in opencl_devices()),
    reason="no Intel OpenCL runtime here",
)


@functools.cache
def _backend(total, segments, dtype, descending, block, device="intel", subgroup=None, chunk=8):
    from edgecv.board.runtime.opencl import OpenCLBackend

    func = segmented_argsort_gpu(total, segments, dtype, descending, block, subgroup, chunk)
    profile = load_profile("deeplens" if subgroup else "aisage")
    kernels = build_opencl(
        tvm.IRModule({"segmented_argsort": func}), profile.tvm_target(), subgroup
    )
    assert not kernels.unsupported
    assert ("cl_intel_subgroups" in kernels.requires) == (subgroup is not None)
    return OpenCLBackend(device, kernels.source, kernels.launches, kernels.requires)


def sort_on_opencl(
    keys, offsets, descending=False, block=64, device="intel", subgroup=None, chunk=8
):
    backend = _backend(
        len(keys), len(offsets) - 1, str(keys.dtype), descending, block, device, subgroup, chunk
    )
    arrays = [keys, offsets.astype(np.int32), np.zeros(len(keys), np.int32)]
    for shape, dtype in zip(
        workspace_shapes(len(keys)), [keys.dtype, "int32", "int32"] * 2, strict=True
    ):
        arrays.append(np.zeros(shape, dtype))
    tensors = []
    for array in arrays:
        tensor = backend.view(backend.alloc(array.nbytes), array.shape, str(array.dtype))
        backend.upload(tensor, array)
        tensors.append(tensor)
    backend.bind("segmented_argsort", tensors)()
    backend.synchronize()
    return backend.download(tensors[2])


def _heavy_where(params, pred):
    """``params`` with the heavy mark added to those whose values satisfy ``pred``."""
    return [
        pytest.param(
            *p.values, marks=[*p.marks, pytest.mark.heavy] if pred(*p.values) else p.marks, id=p.id
        )
        for p in params
    ]


def offsets_of(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


@pytest.mark.parametrize(
    ("lengths", "descending", "dtype"),
    each_once(
        [
            [1],  # one element
            [0, 1, 0, 2, 0],  # empty segments
            [63],
            [64],
            [65],  # around a block
            [300, 1, 1000, 7, 0, 33],  # segments spanning block interfaces
            [70000],  # > 2^16 elements, 11 merge passes
        ],
        [(False, "float32"), (True, "int32"), (True, "float32"), (False, "int32")],
    ),
)
def test_edge_cases_match_the_stable_reference(lengths, descending, dtype):
    rng = np.random.RandomState(len(lengths) + sum(lengths))
    total = sum(lengths)
    keys = rng.randint(-5, 5, total).astype(dtype)  # many equal keys: stability matters
    offsets = offsets_of(lengths)
    got = sort_on_opencl(keys, offsets, descending)
    np.testing.assert_array_equal(got, segmented_argsort_reference(keys, offsets, descending))


@settings(max_examples=examples(12), deadline=None)
@given(
    lengths=st.lists(st.integers(0, 300), min_size=1, max_size=12).filter(lambda x: sum(x) > 0),
    descending=st.booleans(),
    block=st.sampled_from([2, 16, 128]),
    chunk=st.sampled_from([1, 2, 8, 64]),  # merge outputs per work-item; 1: rank search
    subgroup=st.sampled_from([None, 16]),
    seed=st.integers(0, 2**16),
)
def test_random_segments(lengths, descending, block, chunk, subgroup, seed):
    """The work-group version at ``block`` keys a block, or the Intel-subgroup version
    (blocks of 64, sorted within subgroups of 16 by shuffles). One variant an example
    (drawn: each example is a program of its own), both with ``-m heavy``."""
    keys = np.random.RandomState(seed).normal(size=sum(lengths)).astype(np.float32)
    keys[::3] = 0.5  # and ties
    offsets = offsets_of(lengths)
    want = segmented_argsort_reference(keys, offsets, descending)
    for variant in [None, 16] if heavy_selected() else [subgroup]:
        got = sort_on_opencl(
            keys,
            offsets,
            descending,
            block if variant is None else 64,
            subgroup=variant,
            chunk=chunk,
        )
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("lengths", "descending", "block"),
    _heavy_where(
        each_once(
            [[1], [0, 1, 0, 2, 0], [15], [16], [17], [300, 1, 1000, 7, 0, 33], [70000]],
            [(False, 16), (True, 256), (True, 16), (False, 256)],
        ),
        # heavy past 2^16: the subgroups sort the blocks only; the merge passes past 2^16
        # are the work-group variant's, test_edge_cases_match_the_stable_reference[70000]
        lambda lengths, *_: sum(lengths) > 2**16,
    ),
)
def test_intel_subgroup_variant_matches_the_stable_reference(lengths, descending, block):
    """Block sort exchanging within subgroups of 16 by shuffles (cl_intel_subgroups)."""
    rng = np.random.RandomState(sum(lengths) + block)
    keys = rng.randint(-5, 5, sum(lengths)).astype(np.int32)
    keys = keys.astype(np.float32) if descending else keys  # both key types
    offsets = offsets_of(lengths)
    got = sort_on_opencl(keys, offsets, descending, block, subgroup=16)
    np.testing.assert_array_equal(got, segmented_argsort_reference(keys, offsets, descending))


@needs_pocl()
@pytest.mark.parametrize(
    ("lengths", "descending"),
    [
        ([300, 1, 1000, 7, 0, 33], True),  # PoCL compiles a sort in ~25 s: the rest is heavy
        pytest.param([0, 1, 0, 2, 0], False, marks=pytest.mark.heavy),
        pytest.param([70000], True, marks=pytest.mark.heavy),
    ],
)
def test_on_pocl(lengths, descending):
    rng = np.random.RandomState(sum(lengths))
    keys = rng.randint(-5, 5, sum(lengths)).astype(np.float32)
    offsets = offsets_of(lengths)
    got = sort_on_opencl(keys, offsets, descending, 256, device="pocl")
    np.testing.assert_array_equal(got, segmented_argsort_reference(keys, offsets, descending))


def test_rows_match_mxnet_argsort():
    from edgecv._mxnet import import_mxnet

    mx = import_mxnet()
    rows = np.random.RandomState(3).permutation(4 * 500).reshape(4, 500).astype(np.float32)
    offsets = offsets_of([500] * 4)
    for descending in (False, True):
        theirs = mx.nd.argsort(mx.nd.array(rows), axis=-1, is_ascend=not descending)
        theirs = theirs.asnumpy().astype(np.int32)
        ours = segmented_argsort_reference(rows.reshape(-1), offsets, descending)
        np.testing.assert_array_equal(ours.reshape(4, 500), theirs)
        # each direction's kernel matches the reference in the tests above: one program
        # (a compile of seconds) by default, both with -m heavy
        if descending or heavy_selected():
            ours = sort_on_opencl(rows.reshape(-1), offsets, descending)
            np.testing.assert_array_equal(ours.reshape(4, 500), theirs)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="float64"):
        segmented_argsort_gpu(4, 1, "float64")
    with pytest.raises(ValueError, match="power of two"):
        segmented_argsort_gpu(4, 1, block=48)
    with pytest.raises(ValueError, match="total >= 1"):
        segmented_argsort_gpu(0, 1)
    with pytest.raises(ValueError, match="merge_chunk must be a power of two"):
        segmented_argsort_gpu(4, 1, merge_chunk=3)
    with pytest.raises(ValueError, match="subgroup size 16 must .* dividing the work-group"):
        segmented_argsort_gpu(4, 1, block=8, subgroup=16)


def topk_reference(keys, k, descending):
    return np.stack(
        [segmented_argsort_reference(row, np.array([0, len(row)]), descending)[:k] for row in keys]
    ).astype(np.int32)


@pytest.mark.parametrize(
    ("rows", "n", "k", "block", "subgroup", "chunk", "descending"),
    _heavy_where(
        each_once(
            [
                (1, 1, 1, 2, None, 32),
                (1, 10, 3, 16, None, 32),
                (2, 5, 10, 2, None, 1),  # k > n: the whole row
                (3, 122, 7, 16, 16, 4),
                (4, 257, 256, 64, None, 8),
                (2, 1000, 400, 256, None, 32),
                (1, 70000, 400, 256, 16, 32),  # > 2^16, SSD's topk
            ],
            [True, False],
        ),
        # heavy: box_nms_gpu's test_more_boxes_than_2_16[intel-subgroup] runs this top-k
        # sort's subgroup variant on 70,000 keys (SSD's topk 400) in the default suite
        lambda rows, n, *_: n > 2**16,
    ),
)
def test_row_topk_matches_the_stable_reference(rows, n, k, block, subgroup, chunk, descending):
    """Merge passes that keep only the first k of each merged run: the first k of each
    row's stable sort, ties by index."""
    from kernels import run_opencl

    from edgecv.ops.segmented_argsort import row_topk_argsort_gpu

    keys = np.random.RandomState(n + k).randint(0, 20, (rows, n)).astype(np.float32)
    func = row_topk_argsort_gpu(rows, n, k, "float32", descending, block, subgroup, chunk)
    out = np.zeros((rows, min(k, n)), np.int32)
    profile = "deeplens" if subgroup else "aisage"
    got = run_opencl(func, [keys, out], "intel", profile)[1]
    np.testing.assert_array_equal(got, topk_reference(keys, min(k, n), descending))
    if pocl_unusable() is None and (n, descending) == (1000, True):  # PoCL: one case
        got = run_opencl(func, [keys, out], "pocl", profile)[1]
        np.testing.assert_array_equal(got, topk_reference(keys, min(k, n), descending))
