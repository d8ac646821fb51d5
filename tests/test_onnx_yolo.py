"""Ultralytics YOLOv8n and YOLO11n, built from their model files and exported by
Ultralytics' own exporter (tests/onnx_models/export_ultralytics.py, weights filled from a
seed here), against ONNX Runtime's CPU forward of the same file: the raw head on `cpu`
and on `deeplens` (every launch on Intel's OpenCL), the end-to-end NMS head
(``nms=True``) on edgecv's box NMS with ONNX Runtime's kept rows (count, class and order
exact), and `edgecv run IMAGE` drawing its detections. YOLOv8n at 320 x 320 in the
default suite, its NMS head there cut from the export at the raw head (the whole NMS
export compiles the backbone a second time: `heavy`); at 640 and YOLO11n `heavy`."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import cv2
import numpy as np
import onnx
import onnxruntime
import pytest
from helpers import cli_here
from test_opencl import device_or_skip

import edgecv
from edgecv.board.errors import ConversionError
from edgecv.board.processing import preset
from edgecv.deploy import deploy
from edgecv.frontend.onnx.importer import from_onnx
from edgecv.pipelines import BuildOptions
from edgecv.testing import compare_with_onnxruntime, match_detections

sys.path.insert(0, str(Path(__file__).resolve().parent / "onnx_models"))
import seeded  # noqa: E402

FOLDER = seeded.FOLDER / "ultralytics"


def _filled(stem: str, folder: Path) -> Path:
    return seeded.filled(FOLDER / f"{stem}.onnx", folder)


def _input(path: Path) -> np.ndarray:
    """A standard normal image tensor of the model's input shape (seed 0)."""
    return np.random.RandomState(0).standard_normal(_input_shape(path)).astype(np.float32)


def _input_shape(path: Path) -> list[int]:
    dims = onnx.load(str(path), load_external_data=False).graph.input[0].type.tensor_type
    return [d.dim_value for d in dims.shape.dim]


def _depth(path: Path) -> float:
    """The loosening compare_with_onnxruntime gives the file: its convolutions / 10."""
    graph = onnx.load(str(path), load_external_data=False).graph
    return max(1.0, sum(n.op_type == "Conv" for n in graph.node) / 10)


def _onnxruntime(path: Path, x: np.ndarray) -> np.ndarray:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


@pytest.fixture(scope="module")
def raw_320(tmp_path_factory):
    """YOLOv8n's raw head at 320 x 320, deployed for `cpu` with the ultralytics preset."""
    folder = tmp_path_factory.mktemp("yolov8n_320")
    path = _filled("yolov8n_320", folder)
    # the tests read the head's numbers, not the layouts: packed without timing candidates
    # (the graph tuner on YOLOv8's channel split: test_a_channel_split_keeps_the_graph_tuner;
    # on an ONNX graph: test_onnx_deploy.py's test_the_classifier_matches_onnxruntime)
    options = BuildOptions(layout="packed")
    package = deploy(path, folder / "cpu", "cpu", processing=preset("ultralytics"), options=options)
    return path, package


# the raw head [1, 4 + 80, 2100] inside the ``nms=True`` export, where its NMS head begins
RAW_HEAD = "/model/model.22/Concat_3_output_0"


@pytest.fixture(scope="module")
def nms_head(tmp_path_factory):
    """The NMS head of YOLOv8n's ``nms=True`` export at 320 x 320, cut from the committed
    file at the raw head (its input) and deployed for `cpu`: the head's dozen kernels,
    not the backbone's 95 again (the whole export: test_the_nms_export_keeps_onnxruntimes_rows)."""
    folder = tmp_path_factory.mktemp("yolov8n_320_nms_head")
    model = onnx.load(str(FOLDER / "yolov8n_320_nms.onnx"))
    head = onnx.utils.Extractor(model).extract_model([RAW_HEAD], ["output0"])
    assert not any(t.doc_string for t in head.graph.initializer), "no weight left to fill"
    assert _shape_of(head.graph.input[0]) == [1, 84, 2100]
    path = folder / "yolov8n_320_nms_head.onnx"
    onnx.save(head, str(path))
    package = deploy(path, folder / "cpu", "cpu", options=BuildOptions(layout="NCHW"))
    return path, package


def _shape_of(value) -> list[int]:
    return [d.dim_value for d in value.type.tensor_type.shape.dim]


@pytest.fixture(scope="module")
def nms_320(tmp_path_factory):
    """YOLOv8n exported with ``nms=True`` at 320 x 320, deployed for `cpu`."""
    folder = tmp_path_factory.mktemp("yolov8n_320_nms")
    path = _filled("yolov8n_320_nms", folder)
    # the NMS head is what this package is for: packed without timing candidates, as raw_320
    options = BuildOptions(layout="packed")
    package = deploy(
        path, folder / "cpu", "cpu", processing=preset("ultralytics-nms"), options=options
    )
    return path, package


def test_yolov8n_matches_onnxruntime_on_cpu(raw_320):
    path, package = raw_320
    compared = compare_with_onnxruntime(package, path, [_input(path)])
    assert compared["scale"] > 1, compared  # boxes in pixels: the comparison means something


def assert_same_kept_rows(actual: np.ndarray, expected: np.ndarray, side: int, depth: float) -> int:
    """The rows ONNX Runtime keeps (score above 0; zeros after), the same in number and
    class, boxes (pixels of a ``side`` x ``side`` input) and scores within the tolerance
    table loosened by ``depth``, in ONNX Runtime's order except within a run of scores
    tied to that tolerance (compared as a set: edgecv.testing.match_detections); returns
    their count."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    kept = int((expected[0, :, 4] > 0).sum())
    assert int((actual[0, :, 4] > 0).sum()) == kept
    assert not actual[0, kept:].any(), "rows after the kept ones are zeros"

    def gluoncv(rows):  # (ids, scores, boxes), padding ids -1
        ids = np.where(rows[..., 4:5] > 0, rows[..., 5:6], -1.0)
        return [ids, rows[..., 4:5], rows[..., :4]]

    return match_detections(gluoncv(actual), gluoncv(expected), depth, box_scale=side)


def test_the_nms_head_keeps_onnxruntimes_rows(nms_head, raw_320):
    """Ultralytics' NMS head recognized in its export and run on edgecv's box NMS, fed
    the raw head's values on the test image (ONNX Runtime's forward of the raw export):
    ONNX Runtime's kept rows from the same values, compared without loosening."""
    path, package = nms_head
    manifest = json.loads((package / "manifest.json").read_text())
    assert "box_nms" in json.dumps(manifest["build"]), "the head runs on edgecv's box NMS"
    raw, _ = raw_320
    head = _onnxruntime(raw, _input(raw))
    (actual,) = edgecv.load(package).run(head)
    kept = assert_same_kept_rows(actual, _onnxruntime(path, head), 320, 1.0)
    assert 10 <= kept < actual.shape[1], kept  # some boxes kept, some padding


# the whole export compiles the backbone again: its head by default in
# test_the_nms_head_keeps_onnxruntimes_rows, its backbone in
# test_yolov8n_matches_onnxruntime_on_cpu (the raw export's)
@pytest.mark.heavy
def test_the_nms_export_keeps_onnxruntimes_rows(nms_320):
    path, package = nms_320
    manifest = json.loads((package / "manifest.json").read_text())
    kernels = json.dumps(manifest["build"])
    assert "box_nms" in kernels, "the head runs on edgecv's box NMS"
    x = _input(path)
    (actual,) = edgecv.load(package).run(x)
    kept = assert_same_kept_rows(
        actual, _onnxruntime(path, x), max(_input_shape(path)), _depth(path)
    )
    assert 10 <= kept < actual.shape[1], kept  # some boxes kept, some padding


def test_run_image_draws_the_raw_heads_detections(raw_320, tmp_path, capfd):
    """`edgecv run IMAGE` through the ultralytics decoder (letterbox, NMS in NumPy); the
    threshold under the random weights' best scores on this image (about 0.03). The
    command runs in this process (its own process and exit codes: tests/test_cli.py)."""
    _, package = raw_320
    image = np.random.RandomState(1).randint(0, 255, (240, 400, 3)).astype(np.uint8)
    cv2.imwrite(str(tmp_path / "street.png"), image)
    saved = tmp_path / "out.png"
    args = ["run", package, tmp_path / "street.png", "--threshold", "0.01", "--save", saved]
    ran = cli_here(capfd, *args)
    out = ran.stdout
    assert ran.returncode == 0, ran.stderr
    rows = re.findall(r"^\s+([\d.]+)\s+(\w[\w ]*?)\s+\[([-\d, ]+)\]$", out, re.M)
    assert rows and all(float(score) >= 0.01 for score, _, _ in rows), out
    drawn = cv2.imread(str(saved))
    assert drawn.shape == image.shape and (drawn != image).any()


@pytest.mark.heavy  # a whole detector deployed: minutes (docs/testing.md)
def test_yolov8n_runs_every_launch_on_intel_opencl(tmp_path):
    on = device_or_skip("intel")
    path = _filled("yolov8n_320", tmp_path)
    package = deploy(path, tmp_path / "deeplens", "deeplens")
    manifest = json.loads((package / "manifest.json").read_text())
    assert manifest["build"]["placement"]["launches"].get("cpu", 0) == 0, manifest["build"]
    compare_with_onnxruntime(edgecv.load(package, on=on), path, [_input(path)])


def test_an_nms_head_in_another_form_is_refused_in_one_line(tmp_path):
    """The head with its score threshold computed at run time (from the input) is not
    Ultralytics' export: one error naming what, not a wrong mapping."""
    path = FOLDER / "yolov8n_320_nms.onnx"
    model = onnx.load(str(path), load_external_data=False)
    greater = next(n for n in model.graph.node if n.op_type == "Greater")
    image = model.graph.input[0].name
    computed = [
        onnx.helper.make_node("ReduceMin", [image], ["lowest"], keepdims=0),
        onnx.helper.make_node("Mul", [greater.input[1], "lowest"], ["computed"]),
    ]
    greater.input[1] = "computed"
    nodes = computed + list(model.graph.node)  # the image and a constant: first
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    with pytest.raises(ConversionError, match="confidence threshold computed at run time"):
        from_onnx(model, source="yolo.onnx")


def test_a_channel_split_keeps_the_graph_tuner(tmp_path):
    """A ``Split`` of a convolution's channels in two (YOLOv8's and YOLO11's blocks) leaves
    the graph tuner choosing layouts: Relax's layout conversion of TVM's ``split`` failed
    on packed channels and the whole model built in NCHW."""
    rng = np.random.RandomState(0)

    def weight(name, shape):
        values = rng.standard_normal(shape).astype(np.float32) * 0.2
        return onnx.numpy_helper.from_array(values, name)

    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("Conv", ["x", "w0"], ["wide"]),
            onnx.helper.make_node("Split", ["wide", "halves"], ["a", "b"], axis=1),
            onnx.helper.make_node("Conv", ["b", "w1"], ["conv"], pads=[1, 1, 1, 1]),
            onnx.helper.make_node("Add", ["conv", "a"], ["y"]),
        ],
        "split_conv",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 16, 16, 16])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 16, 16, 16])],
        [
            weight("w0", (32, 16, 1, 1)),
            weight("w1", (16, 16, 3, 3)),
            onnx.numpy_helper.from_array(np.array([16, 16], np.int64), "halves"),
        ],
    )
    path = tmp_path / "split.onnx"
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    package = deploy(path, tmp_path / "split-cpu", "cpu")
    layouts = json.loads((package / "manifest.json").read_text())["build"]["layouts"]
    assert "reason" not in layouts, layouts
    compare_with_onnxruntime(package, path)


@pytest.mark.heavy
@pytest.mark.parametrize("stem", ["yolov8n", "yolo11n", "yolov8n_nms", "yolo11n_nms"])
def test_the_640_exports_match_onnxruntime(stem, tmp_path):
    path = _filled(stem, tmp_path)
    package = deploy(path, tmp_path / "cpu", "cpu")
    x = _input(path)
    if stem.endswith("_nms"):
        (actual,) = edgecv.load(package).run(x)
        side, depth = max(_input_shape(path)), _depth(path)
        assert assert_same_kept_rows(actual, _onnxruntime(path, x), side, depth) >= 10
    else:
        compare_with_onnxruntime(package, path, [x])
