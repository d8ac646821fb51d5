"""top_class_rows (the rows box_nms can keep, made from scores and boxes): NumPy
reference, the CPU and OpenCL versions, the NMS it stands in front of, and the import
rewrite of GluonCV's per-class rows."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from conftest import needs_pocl
from kernels import run_cpu, run_opencl
from tvm import te

from edgecv._mxnet import import_mxnet
from edgecv.board.runtime.cpu import CPUBackend
from edgecv.board.runtime.executor import Executor
from edgecv.board.runtime.opencl_devices import opencl_devices
from edgecv.codegen.llvm import build_cpu
from edgecv.frontend.mxnet.importer import from_mxnet
from edgecv.frontend.mxnet.mxnet_graph import parse_symbol
from edgecv.lowering import lower
from edgecv.ops.box_nms_reference import box_nms_reference
from edgecv.ops.class_rows import top_class_rows, top_class_rows_gpu, top_class_rows_reference

INTEL = any(d.matches("intel(r) opencl") for d in opencl_devices())


def inputs(batch, n, classes, levels=None, seed=0):
    """Scores in [0, 1) (``levels``: rounded to that many values, so many tie) and boxes."""
    rng = np.random.RandomState(seed)
    scores = rng.rand(batch, n, classes).astype(np.float32)
    if levels:
        scores = (np.floor(scores * levels) / levels).astype(np.float32)
    corner = rng.rand(batch, n, 2) * 90
    boxes = np.concatenate([corner, corner + rng.rand(batch, n, 2) * 30], -1)
    return scores, boxes.astype(np.float32)


def cpu_rows(scores, boxes, k, **attrs):
    s = te.placeholder(scores.shape, "float32", "scores")
    b = te.placeholder(boxes.shape, "float32", "boxes")
    func = te.create_prim_func([s, b, top_class_rows(s, b, k, **attrs)])
    out = np.zeros((scores.shape[0], k, 6), np.float32)
    return run_cpu(func, [scores, boxes, out])[2]


def gpu_rows(scores, boxes, k, device, threads=64, **attrs):
    func = top_class_rows_gpu(scores.shape, boxes.shape, k, threads=threads, **attrs)
    out = np.zeros((scores.shape[0], k, 6), np.float32)
    return run_opencl(func, [scores, boxes, out], device)[2]


CASES = [  # batch, anchors, classes, k, score levels, attributes
    (1, 50, 3, 20, None, {}),
    (2, 300, 7, 100, 5, {"valid_thresh": 0.3, "background_id": 1}),
    (1, 1000, 20, 400, 50, {"valid_thresh": 0.01}),
    (1, 37, 2, 74, None, {}),  # k = every row
    (1, 64, 4, 10, 1, {}),  # every score 0: all tie, the first rows win
    (1, 200, 3, 50, 4, {"valid_thresh": 0.9}),  # fewer valid rows than k
]


def test_reference_is_the_first_k_rows_of_a_stable_sort():
    scores, boxes = inputs(1, 6, 2, levels=2)
    rows = top_class_rows_reference(scores, boxes, 5, valid_thresh=0.0)
    keys = scores[0].T.reshape(-1)  # r = c * N + n
    order = sorted(range(12), key=lambda r: (-(keys[r] if keys[r] > 0 else -np.inf), r))[:5]
    chosen = sorted(order)
    np.testing.assert_array_equal(rows[0, :, 0], [r // 6 for r in chosen])
    np.testing.assert_array_equal(rows[0, :, 1], keys[chosen])
    np.testing.assert_array_equal(rows[0, :, 2:], boxes[0, [r % 6 for r in chosen]])


@pytest.mark.parametrize(("batch", "n", "classes", "k", "levels", "attrs"), CASES)
def test_cpu_matches_reference(batch, n, classes, k, levels, attrs):
    scores, boxes = inputs(batch, n, classes, levels)
    ref = top_class_rows_reference(scores, boxes, k, **attrs)
    np.testing.assert_array_equal(cpu_rows(scores, boxes, k, **attrs), ref)


@pytest.mark.skipif(not INTEL, reason="no Intel OpenCL runtime here")
@pytest.mark.parametrize(("batch", "n", "classes", "k", "levels", "attrs"), CASES)
def test_opencl_matches_reference(batch, n, classes, k, levels, attrs):
    scores, boxes = inputs(batch, n, classes, levels)
    ref = top_class_rows_reference(scores, boxes, k, **attrs)
    np.testing.assert_array_equal(gpu_rows(scores, boxes, k, "intel", **attrs), ref)


@needs_pocl()
def test_pocl_matches_reference_at_yolo_size():
    """One scale of yolo3_mobilenet1.0_coco (64x64 cells x 3 anchors, 80 classes), top
    400, scores in 1000 levels: many ties across the 983,040 rows."""
    scores, boxes = inputs(1, 64 * 64 * 3, 80, levels=1000)
    ref = top_class_rows_reference(scores, boxes, 400, valid_thresh=0.01)
    got = gpu_rows(scores, boxes, 400, "portable", threads=256, valid_thresh=0.01)
    np.testing.assert_array_equal(got, ref)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="boxes"):
        top_class_rows_gpu((1, 10, 3), (1, 9, 4), 5)
    with pytest.raises(ValueError, match="k=31"):
        top_class_rows_reference(*inputs(1, 10, 3), 31)
    with pytest.raises(ValueError, match="power of two"):
        top_class_rows_gpu((1, 10, 3), (1, 10, 4), 5, threads=48)


def gluoncv_rows(scores: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """GluonCV's rows of one scale: (B, C * N, 6), class-major."""
    batch, n, classes = scores.shape
    ids = np.broadcast_to(np.arange(classes, dtype=np.float32)[None, :, None], (batch, classes, n))
    tiled = np.broadcast_to(boxes[:, None], (batch, classes, n, 4))
    rows = np.concatenate([ids[..., None], scores.transpose(0, 2, 1)[..., None], tiled], -1)
    return rows.reshape(batch, classes * n, 6)


@pytest.mark.parametrize("levels", [None, 20])
def test_nms_over_the_chosen_rows_is_the_nms_over_all(levels):
    """box_nms(topk=k) over each piece's top_class_rows, concatenated, is box_nms over
    all the pieces' rows: the claim the import rewrite rests on."""
    nms = dict(overlap_thresh=0.45, valid_thresh=0.01, topk=60, id_index=0, score_index=1)
    pieces = [inputs(2, n, 5, levels, seed=n) for n in (120, 30, 8)]
    full = np.concatenate([gluoncv_rows(s, b) for s, b in pieces], axis=1)
    chosen = np.concatenate(
        [top_class_rows_reference(s, b, min(60, s.shape[1] * 5), 0.01) for s, b in pieces], 1
    )
    expected = box_nms_reference(full, **nms)[:, :40]
    np.testing.assert_array_equal(box_nms_reference(chosen, **nms)[:, :40], expected)


mx = import_mxnet()
S = mx.sym


def yolo_tail(classes: int, cells: tuple[int, ...], topk: int, keep: int | None):
    """GluonCV YOLOv3's output layers and NMS, written as its ``hybrid_forward`` does,
    over ``data (1, sum(cells), 3, 4 + classes)``; ``keep``: the rows sliced after the
    NMS (None: no slice, every row is read)."""
    data = S.var("data")
    pieces, start = [], 0
    for count in cells:
        pred = S.slice_axis(data, axis=1, begin=start, end=start + count)
        start += count
        bbox = S.slice_axis(pred, axis=-1, begin=0, end=4)
        score = S.sigmoid(S.slice_axis(pred, axis=-1, begin=4, end=None))
        bboxes = S.tile(bbox, reps=(classes, 1, 1, 1, 1))
        scores = S.transpose(score, axes=(3, 0, 1, 2)).expand_dims(axis=-1)
        ids = S.broadcast_add(scores * 0, S.arange(0, classes).reshape((0, 1, 1, 1, 1)))
        rows = S.concat(ids, scores, bboxes, dim=-1)
        pieces.append(S.reshape(S.transpose(rows, axes=(1, 0, 2, 3, 4)), (0, -1, 6)))
    result = S.contrib.box_nms(
        S.concat(*pieces, dim=1),
        overlap_thresh=0.45,
        valid_thresh=0.01,
        topk=topk,
        id_index=0,
        score_index=1,
        coord_start=2,
        force_suppress=False,
    )
    return result if keep is None else S.slice_axis(result, axis=1, begin=0, end=keep)


def call_tir_names(mod) -> list[str]:
    return [
        b.value.args[0].name_hint
        for block in mod["main"].body.blocks
        for b in block.bindings
        if isinstance(b.value, tvm.relax.Call) and b.value.op.name == "relax.call_tir"
    ]


@pytest.mark.parametrize("levels", [None, 8])
def test_gluoncv_rows_are_made_by_top_class_rows_and_match_mxnet(levels):
    """The importer finds GluonCV's per-class rows before box_nms and makes only the
    rows the NMS can keep; the answer is MXNet's, ids and scores exactly (``levels``:
    inputs on a few values, so that scores tie)."""
    classes, cells, topk, keep = 6, (40, 12, 1), 30, 25
    sym = yolo_tail(classes, cells, topk, keep)
    shape = (1, sum(cells), 3, 4 + classes)
    x = np.random.RandomState(1).normal(0, 2, shape).astype(np.float32)
    if levels:
        x = np.round(x * levels / 4) * 4 / levels
    x[..., 2:4] = x[..., :2] + np.abs(x[..., 2:4])  # corners: x2 > x1, y2 > y1
    imported = from_mxnet(parse_symbol(sym.tojson()), {}, {"data": shape})
    names = call_tir_names(imported.mod)
    # the two scales of more than topk rows (40 x 3 x 6, 12 x 3 x 6); 1 x 3 x 6 stays
    assert sum(n.startswith("top_class_rows") for n in names) == 2
    lowered = lower(imported.mod)
    lib = build_cpu(lowered.kernels, tvm.target.Target({"kind": "llvm"}))
    (ours,) = Executor(lowered.plan, CPUBackend(lib), lowered.constants).run([x])
    (ref,) = sym.bind(mx.cpu(), {"data": mx.nd.array(x)}).forward(is_train=False)
    ref = ref.asnumpy()
    np.testing.assert_array_equal(ours[..., :2], ref[..., :2])
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-5)


def test_other_rows_are_left_alone():
    """A box_nms that keeps every row (no slice after it), or whose rows are not
    GluonCV's per-class rows, is converted as it was."""
    shape = (1, 20, 3, 8)

    def rewritten(sym, shape) -> bool:
        mod = from_mxnet(parse_symbol(sym.tojson()), {}, {"data": shape}).mod
        return any(n.startswith("top_class_rows") for n in call_tir_names(mod))

    assert rewritten(yolo_tail(4, (20,), 10, 8), shape)
    assert not rewritten(yolo_tail(4, (20,), 10, None), shape)
    plain = S.contrib.box_nms(S.var("data"), topk=10, id_index=0, coord_start=2)
    assert not rewritten(S.slice_axis(plain, axis=1, begin=0, end=8), (1, 240, 6))
