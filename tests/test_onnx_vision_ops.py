"""ONNX ``TopK`` and ``NonMaxSuppression`` deployed without other operators (graphs built
with ``onnx.helper``, a test's cases side by side in one graph: one deploy) for `cpu` and
`deeplens` (Intel's OpenCL runtime stands in), against ONNX Runtime's CPU forward of the
same file: indices exactly, ties included; on deeplens the op runs as edgecv's tagged
kernel on the GPU (no CPU launch), one case of each test by default (every case with
``-m heavy``: the converter's forms are the cpu cases', the GPU kernels' shapes and
attributes tests/ops/'s, and each case is a GPU sort program of its own to compile)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_opencl import device_or_skip

import edgecv
from edgecv.board.errors import ConversionError
from edgecv.deploy import deploy
from edgecv.pipelines import BuildOptions

OPTIONS = BuildOptions(check_on=None, tuning=None)


def _model(nodes, inputs, outputs, constants) -> onnx.ModelProto:
    weights = [numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()]
    graph = helper.make_graph(nodes, "vision", inputs, outputs, weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _tensor(name, dims, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, dims)


def topk_model(shape, k, axis, largest) -> onnx.ModelProto:
    node = helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=axis, largest=largest)
    out_shape = list(shape)
    out_shape[axis] = k
    outputs = [_tensor("values", out_shape), _tensor("indices", out_shape, TensorProto.INT64)]
    return _model([node], [_tensor("x", shape)], outputs, {"k": np.array([k], np.int64)})


def nms_model(batch, classes, n, most, iou, score, center=0) -> onnx.ModelProto:
    constants = {"most": np.array([most], np.int64), "iou": np.array([iou], np.float32)}
    names = ["boxes", "scores", "most", "iou"]
    if score is not None:
        constants["score"] = np.array([score], np.float32)
        names.append("score")
    node = helper.make_node("NonMaxSuppression", names, ["selected"], center_point_box=center)
    inputs = [_tensor("boxes", [batch, n, 4]), _tensor("scores", [batch, classes, n])]
    outputs = [_tensor("selected", ["S", 3], TensorProto.INT64)]
    return _model([node], inputs, outputs, constants)


def merged(models: list[onnx.ModelProto]) -> onnx.ModelProto:
    """The graphs of ``models`` (one opset) side by side in one, every name of the i-th
    suffixed ``_i`` (inputs, outputs and symbolic sizes in the models' order): one deploy
    builds every case's kernels, and each case's outputs are compared on their own."""
    nodes, inputs, outputs, weights = [], [], [], []
    for i, model in enumerate(models):

        def rename(name: str, i=i) -> str:
            return f"{name}_{i}" if name else name

        for node in model.graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.input[:] = [rename(n) for n in node.input]
            copy.output[:] = [rename(n) for n in node.output]
            copy.name = rename(node.name)
            nodes.append(copy)
        for given, into in (
            (model.graph.input, inputs),
            (model.graph.output, outputs),
            (model.graph.initializer, weights),
        ):
            for item in given:
                copy = type(item)()
                copy.CopyFrom(item)
                copy.name = rename(item.name)
                if isinstance(copy, onnx.ValueInfoProto):
                    for dim in copy.type.tensor_type.shape.dim:
                        if dim.dim_param:
                            dim.dim_param = rename(dim.dim_param)
                into.append(copy)
    graph = helper.make_graph(nodes, "cases", inputs, outputs, weights)
    opsets = list(models[0].opset_import)
    return helper.make_model(graph, opset_imports=opsets, ir_version=models[0].ir_version)


def onnxruntime(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def deployed(model, tmp_path, profile: str):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    return deploy(path, tmp_path / profile, profile, options=OPTIONS)


def _gpu_only(loaded, package, kernels: set[str]) -> None:
    """Every launch on the GPU, edgecv's tagged kernels (``kernels``) among them, in
    their GPU versions (a ``workspaces`` of device scratch, which the CPU kernels lack)."""
    build = json.loads((package / "manifest.json").read_text())["build"]
    assert build["placement"]["launches"].get("cpu", 0) == 0, build["placement"]
    steps = [s for s in loaded.executor.plan.steps if s.kind == "kernel" and not s.elided]
    assert all(s.device == "gpu" for s in steps)
    assert {s.kernel for s in steps if s.workspaces} >= kernels, [s.kernel for s in steps]


def _random_boxes(rng, batch, n, center):
    """Boxes in a 10x10 field, many overlapping; ONNX's [y1, x1, y2, x2] with some
    diagonals flipped, or [x_center, y_center, width, height]."""
    corner = rng.uniform(0, 8, (batch, n, 2)).astype(np.float32)
    size = rng.uniform(0.5, 3, (batch, n, 2)).astype(np.float32)
    if center:
        return np.concatenate([corner + size / 2, size], -1)
    boxes = np.concatenate([corner, corner + size], -1)
    flip = rng.uniform(size=(batch, n)) < 0.3
    boxes[flip] = boxes[flip][:, [2, 3, 0, 1]]
    return boxes


TOPK_CASES = [((4, 50), 7, -1, 1), ((3, 20, 5), 4, 1, 0), ((2, 3, 16), 16, 2, 1)]


def profiles(gpu_case: int) -> list:
    """(profile, the index of the one case it runs, None: every case): every case on
    `cpu`; on deeplens case ``gpu_case`` by default, every case `heavy` (module docstring)."""
    return [
        pytest.param("cpu", None, id="cpu"),
        pytest.param("deeplens", gpu_case, id="deeplens"),
        pytest.param("deeplens", None, id="deeplens-every-case", marks=pytest.mark.heavy),
    ]


@pytest.mark.parametrize(("profile", "only"), profiles(1))  # the middle axis, smallest first
def test_topk_matches_onnxruntime_ties_included(tmp_path, profile, only):
    """The cases in one graph (one deploy), distinct keys and then many equal ones."""
    on = device_or_skip("intel") if profile == "deeplens" else None
    rng = np.random.RandomState(0)
    cases = TOPK_CASES if only is None else [TOPK_CASES[only]]
    model = merged([topk_model(shape, k, axis, largest) for shape, k, axis, largest in cases])
    package = deployed(model, tmp_path, profile)
    loaded = edgecv.load(package, on=on) if on else edgecv.load(package)
    if on:
        _gpu_only(loaded, package, {"row_argsort"})
    shapes = [shape for shape, _, _, _ in cases]
    for tied in (False, True):
        xs = [
            rng.randint(0, 4, shape).astype(np.float32)  # many equal keys
            if tied
            else rng.permutation(int(np.prod(shape))).reshape(shape).astype(np.float32)
            for shape in shapes
        ]
        ours = loaded.run(*xs)
        ref = onnxruntime(model, {f"x_{i}": x for i, x in enumerate(xs)})
        assert len(ours) == len(ref) == 2 * len(cases)
        for i, (actual, expected) in enumerate(zip(ours, ref, strict=True)):  # per case
            np.testing.assert_array_equal(actual, expected, err_msg=f"output {i}, tied={tied}")


NMS_CASES = [  # batch, classes, boxes, max per class, iou, score threshold, center
    (2, 3, 40, 40, 0.5, 0.3, 0),  # as many rows as boxes: box_nms keeps all
    (1, 2, 30, 100, 0.3, None, 0),
    (3, 2, 25, 5, 0.45, 0.6, 1),  # classes that fill their 5 rows
]


@pytest.mark.parametrize(("profile", "only"), profiles(2))  # centre boxes, rows filled
def test_nms_matches_onnxruntime(tmp_path, profile, only):
    """The cases in one graph (one deploy), run on random scores twice and on tied ones."""
    on = device_or_skip("intel") if profile == "deeplens" else None
    rng = np.random.RandomState(1)
    cases = NMS_CASES if only is None else [NMS_CASES[only]]
    model = merged([nms_model(*case) for case in cases])
    package = deployed(model, tmp_path, profile)
    loaded = edgecv.load(package, on=on) if on else edgecv.load(package)
    if on:
        _gpu_only(loaded, package, {"box_nms", "row_argsort"})
    padded = []
    for tied in (False, False, True):
        feeds = {}
        for i, (batch, classes, n, _, _, _, center) in enumerate(cases):
            feeds[f"boxes_{i}"] = _random_boxes(rng, batch, n, center)
            scores = rng.uniform(size=(batch, classes, n)).astype(np.float32)
            if tied:  # equal scores (lower index first), some exactly at the threshold
                scores = (rng.randint(0, 11, scores.shape) / 10).astype(np.float32)
            feeds[f"scores_{i}"] = scores
        ours_all = loaded.run(*feeds.values())
        ref_all = onnxruntime(model, feeds)
        for case, ours, ref in zip(cases, ours_all, ref_all, strict=True):
            batch, classes, n, most = case[:4]
            assert ours.shape == (batch * classes * min(most, n), 3) and ours.dtype == np.int64
            count = int((ours[:, 0] >= 0).sum())
            padded.append(len(ours) - count)
            np.testing.assert_array_equal(ours[:count], ref)
            assert (ours[count:] == -1).all()
    assert 0 in padded and max(padded) > 0, padded  # rows filled, and padding


def test_nms_indices_read_by_another_node_are_refused(tmp_path):
    model = nms_model(1, 1, 8, 4, 0.5, None)
    gather = helper.make_node("Gather", ["selected", "one"], ["boxes_kept"], axis=1)
    model.graph.node.append(gather)
    model.graph.initializer.append(numpy_helper.from_array(np.array(2, np.int64), "one"))
    del model.graph.output[:]
    model.graph.output.append(_tensor("boxes_kept", ["S"], TensorProto.INT64))
    with pytest.raises(ConversionError, match="selected indices feed Gather"):
        deployed(model, tmp_path, "cpu")
