"""A detector-like ONNX graph whose output has Ultralytics' raw-head shape [1, 4+2, 64]
(a convolution of the image, scaled down, plus two known boxes), deployed for `cpu` with
`--preprocess ultralytics`, run on an image with `edgecv run` and `edgecv demo`: the
detections printed and drawn are the known boxes mapped back through the letterbox, and
predict() gives what decoding ONNX Runtime's outputs of the same input gives."""

from __future__ import annotations

import json
import re

import cv2
import numpy as np
import onnxruntime
from helpers import cli_here, run_cli
from onnx import helper
from onnx_graphs import Graph, save, tensor

import edgecv
from edgecv.board.decoders import decode

ANCHORS = 64


def raw_head_graph():
    """x [1, 3, 64, 64] -> [1, 6, 64]: anchor 0 a 20 x 20 box at (32, 32), class 0 scored
    0.9; anchor 1 an 8 x 8 box at (10, 40), class 1 scored 0.6; the rest scored 0 (plus
    a thousandth of a convolution of the image: the graph computes, not only copies)."""
    g = Graph(seed=3)
    known = np.zeros((1, 6, ANCHORS), np.float32)
    known[0, :, 0] = [32, 32, 20, 20, 0.9, 0.0]
    known[0, :, 1] = [10, 40, 8, 8, 0.0, 0.6]
    conv = g.op("Conv", ["x", g.weight((6, 3, 8, 8))], kernel_shape=[8, 8], strides=[8, 8])
    flat = g.op("Reshape", [conv, g.constant([1, 6, ANCHORS])])
    small = g.op("Mul", [flat, g.constant([1e-3], np.float32)])
    g.nodes.append(helper.make_node("Add", [small, g.constant(known, np.float32)], ["head"]))
    return g.model([tensor("x", [1, 3, 64, 64])], [tensor("head", [1, 6, ANCHORS])])


def test_an_ultralytics_head_deploys_runs_and_draws(tmp_path, capfd):
    """Deploy and demo through the command's entry in this process, `run IMAGE` as its
    own process (what it prints on the way out)."""
    path = save(raw_head_graph(), tmp_path / "yolo.onnx")
    package = tmp_path / "yolo-cpu"
    # NCHW: the graph tuner's layouts are not what this test is about (tests/graph_tuner)
    layout = ("--layout", "NCHW")
    deployed = cli_here(
        capfd,
        "deploy",
        path,
        "--device",
        "cpu",
        "-o",
        package,
        "--preprocess",
        "ultralytics",
        *layout,
    )
    assert deployed.returncode == 0, deployed.stderr
    manifest = json.loads((package / "manifest.json").read_text())
    assert manifest["model"]["task"] == "detection"
    assert manifest["decoder"] == {"kind": "ultralytics", "iou": 0.7, "confidence": 0.25}
    assert manifest["preprocessing"]["resize"] == "letterbox" and len(manifest["classes"]) == 80

    image = np.random.RandomState(0).randint(0, 255, (128, 256, 3)).astype(np.uint8)
    cv2.imwrite(str(tmp_path / "street.png"), image)
    ran = run_cli("run", package, tmp_path / "street.png", "--save", tmp_path / "out.png")
    assert ran.returncode == 0, ran.stderr
    rows = re.findall(r"^\s+([\d.]+)\s+(\w+)\s+\[([\d, ]+)\]$", ran.stdout, re.M)
    # 64 x 64 letterbox of 128 x 256: ratio 1/4, 64 x 32 at top 16
    assert [(label, [int(v) for v in box.split(", ")]) for _, label, box in rows] == [
        ("person", [88, 24, 168, 104]),
        ("bicycle", [24, 80, 56, 112]),
    ], ran.stdout
    assert abs(float(rows[0][0]) - 0.9) < 0.01 and abs(float(rows[1][0]) - 0.6) < 0.01
    drawn = cv2.imread(str(tmp_path / "out.png"))
    assert drawn.shape == image.shape and (drawn != image).any()

    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(2):
        cv2.imwrite(str(folder / f"{i}.png"), image)
    out = tmp_path / "demo.mp4"
    shown = cli_here(capfd, "demo", package, "--images", folder, "--headless", "-o", out)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("2 detections") == 2 and out.stat().st_size > 0, shown.stdout

    model = edgecv.load(package)
    found = model.predict(image)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (head,) = session.run(None, {"x": model.preprocess(image)})
    reference = decode([head], model.processing, (64, 64), image.shape[:2])
    assert [d.label for d in found] == [d.label for d in reference] == ["person", "bicycle"]
    for ours, theirs in zip(found, reference, strict=True):
        np.testing.assert_allclose(ours.box, theirs.box, atol=1e-3)
        assert abs(ours.score - theirs.score) < 1e-5
