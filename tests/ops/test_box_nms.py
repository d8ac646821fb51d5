"""box_nms: TVM (CPU) vs the NumPy reference vs MXNet's own operator."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from matrix import examples
from tvm import relax, te

from edgecv._mxnet import import_mxnet
from edgecv.ops.box_nms import box_nms, box_nms_reference
from edgecv.testing import assert_close

mx = import_mxnet()
_CACHE: dict = {}


def run_tvm(data: np.ndarray, **attrs) -> np.ndarray:
    key = (data.shape, tuple(sorted(attrs.items())))
    if key not in _CACHE:
        x = te.placeholder(data.shape, "float32", name="data")
        y = box_nms(x, **attrs)
        func = te.create_prim_func([x, y]).with_attr("global_symbol", "nms")
        target = tvm.target.Target({"kind": "llvm"})
        built = tvm.tirx.build(tvm.IRModule({"nms": func}), target=target, pipeline=None)
        _CACHE[key] = built, tuple(int(d) for d in y.shape)
    built, shape = _CACHE[key]
    out = tvm.runtime.empty(shape, "float32")
    built["nms"](tvm.runtime.tensor(data), out)
    return out.numpy()


def run_mxnet(data: np.ndarray, **attrs) -> np.ndarray:
    return mx.nd.contrib.box_nms(mx.nd.array(data), **attrs).asnumpy()


def boxes(rng, batch, n, score_levels=None, degenerate=False, classes=3):
    data = np.zeros((batch, n, 6), np.float32)
    data[..., 0] = rng.randint(-1, classes, (batch, n))
    if score_levels:
        data[..., 1] = rng.choice(score_levels, (batch, n))  # many exact ties
    else:
        data[..., 1] = rng.uniform(0, 1, (batch, n))
    xy = rng.uniform(0, 40, (batch, n, 2))
    wh = rng.uniform(0, 20, (batch, n, 2))
    if degenerate:
        wh[..., 0] *= rng.randint(0, 2, (batch, n))
    data[..., 2:4] = xy
    data[..., 4:6] = xy + wh
    return data


def check_all(data: np.ndarray, **attrs) -> np.ndarray:
    ref = box_nms_reference(data, **attrs)
    assert_close(run_mxnet(data, **attrs), ref, "MXNet box_nms")
    ours = run_tvm(data, **attrs)
    # Same rows in the same order: ids and scores exactly, coordinates within float32.
    np.testing.assert_array_equal(ours[..., :2], ref[..., :2])
    assert_close(ours, ref, "TIR box_nms")
    return ours


ATTRS = st.fixed_dictionaries(
    {
        "overlap_thresh": st.sampled_from([0.0, 0.3, 0.5, 0.7, 1.0]),
        "valid_thresh": st.sampled_from([0.0, 0.2, 0.5]),
        "topk": st.sampled_from([-1, 1, 3, 10, 100]),
        "id_index": st.sampled_from([-1, 0]),
        "force_suppress": st.booleans(),
        "background_id": st.sampled_from([-1, 0]),
        "in_format": st.sampled_from(["corner", "center"]),
        "out_format": st.sampled_from(["corner", "center"]),
    }
)


@settings(max_examples=examples(30), deadline=None)
@given(attrs=ATTRS, seed=st.integers(0, 2**16), n=st.integers(1, 70), ties=st.booleans())
def test_random_boxes(attrs, seed, n, ties):
    rng = np.random.RandomState(seed)
    check_all(
        boxes(rng, 2, n, [0.1, 0.3, 0.6] if ties else None, degenerate=seed % 3 == 0), **attrs
    )


def test_one_box_and_no_valid_box():
    one = np.array([[[0, 0.9, 1, 1, 5, 5]]], np.float32)
    np.testing.assert_array_equal(check_all(one), one)
    none_valid = boxes(np.random.RandomState(1), 1, 9)
    out = check_all(none_valid, valid_thresh=1.0)
    assert (out == -1).all()


def test_all_suppressed_and_none_suppressed():
    same = np.tile(np.array([[0, 0.5, 0, 0, 10, 10]], np.float32), (7, 1))[None]
    same[0, :, 1] = np.linspace(0.9, 0.3, 7)
    out = check_all(same, overlap_thresh=0.5)
    assert (out[0, 0] == same[0, 0]).all() and (out[0, 1:] == -1).all()
    apart = same.copy()
    apart[0, :, 2] = apart[0, :, 4] = 0
    apart[0, :, 2] = np.arange(7) * 20
    apart[0, :, 4] = apart[0, :, 2] + 10
    out = check_all(apart, overlap_thresh=0.5)
    assert (out[0, :, 1] > 0).all()


def test_equal_scores_keep_input_order():
    data = np.zeros((1, 6, 6), np.float32)
    data[0, :, 1] = 0.5
    data[0, :, 2] = np.arange(6) * 20
    data[0, :, 4] = data[0, :, 2] + 10
    data[0, :, 5] = 10
    out = check_all(data)
    np.testing.assert_array_equal(out[0, :, 2], data[0, :, 2])


def fractional_ids() -> np.ndarray:
    """Overlapping pairs whose float ids differ but truncate to one class (1.2 and 1.7,
    -0.5 and 0.3, -1.5 and -1.2) or differ as integers (1.0 and 2.0), and a background
    test on a fractional id (-1.5 is not class -1's background)."""
    pairs = [(1.2, 1.7), (1.0, 2.0), (-0.5, 0.3), (-1.5, -1.2), (-1.0, 0.6)]
    data = np.zeros((1, 2 * len(pairs), 6), np.float32)
    for p, ids in enumerate(pairs):
        for q, ident in enumerate(ids):
            data[0, 2 * p + q] = [ident, 0.9 - 0.1 * p - 0.05 * q, 20 * p, 0, 20 * p + 10, 10]
    return data


def test_class_ids_compare_as_truncated_integers():
    """MXNet casts ids to int before comparing classes (1.2 and 1.7 suppress each other)
    and drops the background by the float id itself."""
    data = fractional_ids()
    out = check_all(data, id_index=0)
    kept = sorted(out[0, :, 0][out[0, :, 1] > 0])
    np.testing.assert_allclose(kept, [-1.5, -0.5, 0.6, 1.0, 1.2, 2.0], rtol=1e-6)
    check_all(data, id_index=0, background_id=0)


def test_leading_dims_and_non_power_of_two():
    data = boxes(np.random.RandomState(2), 6, 37).reshape(2, 3, 37, 6)
    check_all(data, topk=11, id_index=0)


def test_ssd_sized_input_runs_and_matches():
    rng = np.random.RandomState(3)
    n = 122640  # SSD-512 VOC: 6132 anchors x 20 classes
    data = boxes(rng, 1, n, classes=20)
    data[..., 2:] *= 12
    attrs = dict(overlap_thresh=0.45, valid_thresh=0.01, topk=400, id_index=0)
    run_tvm(data, **attrs)
    start = time.perf_counter()
    ours = run_tvm(data, **attrs)
    elapsed = time.perf_counter() - start
    ref = run_mxnet(data, **attrs)
    np.testing.assert_array_equal(ours[..., :2], ref[..., :2])
    assert_close(ours, ref, "TIR box_nms, SSD-sized")
    print(f"box_nms {data.shape}: TVM CPU {elapsed * 1e3:.1f} ms")


@settings(max_examples=examples(20), deadline=None)
@given(attrs=ATTRS, seed=st.integers(0, 2**16), n=st.integers(2, 70), cut=st.integers(1, 69))
def test_first_rows_only(attrs, seed, n, cut):
    """``out_rows``: the first rows of MXNet's output (what a following slice keeps),
    however many boxes are kept before or after the cut."""
    rng = np.random.RandomState(seed)
    data = boxes(rng, 2, n, [0.1, 0.3, 0.6] if seed % 2 else None)
    rows = min(cut, n - 1)
    ours = run_tvm(data, out_rows=rows, **attrs)
    ref = run_mxnet(data, **attrs)[:, :rows]
    np.testing.assert_array_equal(ours[..., :2], ref[..., :2])
    assert_close(ours, ref, "TIR box_nms, first rows")


def test_first_rows_of_leading_dims_and_bad_count():
    data = boxes(np.random.RandomState(4), 6, 37).reshape(2, 3, 37, 6)
    ours = run_tvm(data, topk=11, id_index=0, out_rows=5)
    assert ours.shape == (2, 3, 5, 6)
    np.testing.assert_array_equal(ours, run_tvm(data, topk=11, id_index=0)[..., :5, :])
    with pytest.raises(ValueError, match="out_rows=0"):
        box_nms(te.placeholder((1, 5, 6), "float32"), out_rows=0)


@pytest.mark.parametrize(
    ("attrs", "fragment"),
    [
        ({"in_format": "xyz"}, "in_format"),
        ({"out_format": "xywh"}, "out_format"),
        ({"coord_start": 4}, "coord_start=4"),
        ({"score_index": 9}, "score_index=9"),
    ],
)
def test_bad_attributes(attrs, fragment):
    x = te.placeholder((1, 5, 6), "float32")
    with pytest.raises(ValueError, match=fragment):
        box_nms(x, **attrs)
    with pytest.raises(ValueError, match=fragment):
        box_nms_reference(np.zeros((1, 5, 6), np.float32), **attrs)


def test_shape_dtype_through_relax():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 50, 6), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit_te(box_nms, x, topk=10))
        bb.emit_func_output(out)
    ty = bb.get()["main"].ret_ty
    assert tuple(int(d) for d in ty.shape) == (2, 50, 6) and str(ty.dtype) == "float32"
