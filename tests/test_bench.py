"""``edgecv bench`` end to end on a small model, and the shared timing harness."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from helpers import assert_one_error_line, cli_here, run_cli
from test_bad_input import mx, small_net, small_params

from edgecv.bench.harness import alternate
from edgecv.testing import INT8_PER_LAYER, TOLERANCES


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    prefix = root / "tiny"
    small_net().save(f"{prefix}-symbol.json")
    mx.nd.save(f"{prefix}-0000.params", {k: mx.nd.array(v) for k, v in small_params().items()})
    from edgecv.cli import main

    # in this process, without the graph tuner: what bench reports does not depend on it
    argv = ["deploy", f"{prefix}-symbol.json", "--input-shape", "1,2,5,5", "--layout", "NCHW"]
    assert main([*argv, "-o", str(root / "pkg")]) == 0
    return root / "pkg"


def test_alternate_times_in_turns_after_settling():
    calls = []
    timed = alternate(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
        7,
        1,
        settle_s=0.0,
        turn=3,
    )
    # warm-up, then each turn: one untimed settle run and up to 3 timed ones
    assert calls == ["a", "b"] + (["a"] * 4 + ["b"] * 4) * 2 + ["a", "a", "b", "b"]
    assert [len(t.seconds) for t in timed.values()] == [7, 7]
    calls.clear()
    alternate({"a": lambda: calls.append("a")}, 3, 1)
    assert calls == ["a"] * 4  # alone: nothing to settle from


def test_a_turn_settles_for_its_seconds():
    calls = []

    def slow():
        calls.append(time.perf_counter())
        time.sleep(0.01)

    alternate({"a": slow, "b": lambda: None}, 1, 0, settle_s=0.05, turn=1)
    *settle, timed = calls
    assert len(settle) >= 2  # 10 ms runs, untimed for 50 ms
    assert timed - settle[0] >= 0.049  # the timed run waited out the settling
    assert settle[-1] - settle[0] < 0.05  # and no settle run began after it


def test_bench_reports_percentiles_kernels_and_baselines(package, tmp_path):
    out = tmp_path / "bench.json"
    result = run_cli(
        "bench",
        package,
        "--repeat",
        "20",
        "--warmup",
        "2",
        "--vs",
        "mxnet,onnxruntime,openvino",
        "--json",
        out,
        "--plot",
        tmp_path / "bench.png",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    runtimes = report["runtimes"]
    assert "edgecv" in runtimes and "mxnet" in runtimes  # MXNet is a dependency: always there
    # Every requested baseline either ran or is listed with its reason; one that is
    # installed runs (MXNet's ONNX export of this package's source included).
    assert {"mxnet", "onnxruntime", "openvino"} <= set(runtimes) | set(report["not_run"])
    for name in ("onnxruntime", "openvino"):
        if all(importlib.util.find_spec(m) for m in (name, "onnx")):
            assert name in runtimes, report["not_run"]
    for name, r in runtimes.items():
        assert 0 < r["min_ms"] <= r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"], name
        assert r["runs"] == 20
    # Independent runtimes agree with edgecv within the table: max |diff| / scale is at
    # most atol + rtol when assert_close would pass (|diff| <= atol * scale + rtol * |b|).
    rtol, atol = TOLERANCES["float32"]
    for name, r in runtimes.items():
        if name != "edgecv":
            assert r["agreement"]["max_rel_diff"] <= rtol + atol, (name, r["agreement"])
    kernels = report["kernels"]
    assert kernels and kernels[0]["seconds"] >= kernels[-1]["seconds"]
    assert any("conv2d" in k["ops"] for k in kernels)
    assert report["peak_rss_mib"] > 0 and report["load_s"] > 0
    assert "p50 ms" in result.stdout and "top kernels" in result.stdout
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_streams_reports_throughput_of_concurrent_callers(package, tmp_path):
    """--streams 3: every runtime called by 3 threads at once, round after round; the
    package with three streams and with one, each baseline set up for concurrent
    callers or listed with why not (MXNet's forward pass is not thread-safe)."""
    out = tmp_path / "streams.json"
    result = run_cli(
        "bench",
        package,
        "--streams",
        "3",
        "--repeat",
        "10",
        "--warmup",
        "1",
        "--vs",
        "mxnet,onnxruntime,openvino",
        "--json",
        out,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["streams"] == 3
    runtimes = report["runtimes"]
    assert {"edgecv", "edgecv 1 stream"} <= set(runtimes)
    assert "not safe from several threads" in report["not_run"]["mxnet"]
    for name in ("onnxruntime", "openvino"):
        if all(importlib.util.find_spec(m) for m in (name, "onnx")):
            assert name in runtimes, report["not_run"]
    for name, r in runtimes.items():
        # 10 calls a caller: 2 rounds of 5, each round's rate its calls over its time
        assert (r["callers"], r["rounds"], r["calls"]) == (3, 2, 30), name
        assert 0 < r["throughput_min_per_s"] <= r["throughput_per_s"], name
        assert 0 < r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"], name
    assert "3 callers at once" in result.stdout and "inf/s" in result.stdout


def test_bench_refuses_no_streams(package, capfd):
    assert_one_error_line(cli_here(capfd, "bench", package, "--streams", "0"), "--streams 0")


def test_alternate_concurrent_runs_every_caller_in_its_own_thread_in_rounds():
    from edgecv.bench.harness import alternate_concurrent

    seen: dict[str, set] = {"a": set(), "b": set()}
    order: list[str] = []

    def caller(name):
        def run():
            seen[name].add(threading.current_thread())
            order.append(name)

        return run

    timed = alternate_concurrent({n: [caller(n), caller(n)] for n in "ab"}, rounds=2, calls=3)
    assert {len(s) for s in seen.values()} == {4}  # a new thread per caller and round
    # rounds in turns: each round is one untimed and 3 timed calls of both callers
    assert order == ["a"] * 8 + ["b"] * 8 + ["a"] * 8 + ["b"] * 8
    assert [len(t.latencies) for t in timed.values()] == [12, 12]
    assert all(len(t.per_round) == 2 for t in timed.values())


def test_missing_source_is_listed_not_fatal(package, tmp_path, capfd):
    manifest = json.loads((package / "manifest.json").read_text())
    source = manifest["model"]["source"]["symbol"]
    result = cli_here(
        capfd,
        "bench",
        package,
        "--repeat",
        "3",
        "--vs",
        "mxnet",
        "--source",
        tmp_path / "x-symbol.json",
    )
    assert result.returncode == 0, result.stderr
    assert "not run: mxnet" in result.stdout and "does not exist" in result.stdout
    assert source.endswith("tiny-symbol.json")


def test_bench_bad_arguments(package, tmp_path, capfd):
    assert_one_error_line(cli_here(capfd, "bench", package, "--vs", "tensorrt"), "unknown baseline")
    assert_one_error_line(
        cli_here(capfd, "bench", package, "--json", tmp_path / "no" / "b.json"), "does not exist"
    )


def test_agreement_measures_differences():
    from edgecv.bench.command import agreement

    a = [np.array([[0.0, 1.0, 3.0]], np.float32)]
    assert agreement(a, [a[0].copy()]) == {"max_rel_diff": 0.0, "same_top1": True}
    other = agreement(a, [np.array([[0.0, 4.0, 3.0]], np.float32)])
    assert other["same_top1"] is False and other["max_rel_diff"] == pytest.approx(0.75)


def test_detector_agreement_ignores_the_order_of_tied_scores():
    from edgecv.bench.command import agreement

    ids = np.array([[[3], [1], [2], [-1]]], np.float32)
    scores = np.array([[[0.9], [0.5], [0.5], [-1]]], np.float32)
    boxes = np.array(
        [[[0, 0, 9, 9], [10, 10, 50, 50], [60, 0, 90, 40], [-1, -1, -1, -1]]], np.float32
    )
    ref = [ids, scores, boxes]
    swapped = [a[:, [0, 2, 1, 3]] for a in ref]  # the tie at 0.5 in the other order
    swapped[1][0, 1, 0] += 2e-7  # and rounded differently
    assert agreement(swapped, ref, detection=True)["max_rel_diff"] < 1e-6
    assert agreement(swapped, ref)["max_rel_diff"] > 0.5  # as plain tensors: far apart
    moved = [a.copy() for a in swapped]
    moved[2][0, 1] += 5  # one box really differs: 5 / 90 of the boxes' scale
    assert agreement(moved, ref, detection=True)["max_rel_diff"] == pytest.approx(5 / 90)
    other_top = [a.copy() for a in ref]
    other_top[0][0, 0, 0] = 4
    assert agreement(other_top, ref, detection=True)["same_top1"] is False


def test_an_openvino_baseline_leaves_intels_opencl_runtime_loadable(tmp_path):
    """OpenVINO's wheel bundles an older TBB than Intel's CPU OpenCL runtime needs; a
    process that made an OpenVINO baseline must still find that runtime (a deeplens
    package benchmarked after a cpu one). In a fresh process: nothing loaded before."""
    if importlib.util.find_spec("openvino") is None:  # not imported here: see above
        pytest.skip("OpenVINO is not installed (pip install 'edgecv[bench]')")
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from edgecv.board.runtime.opencl_devices import opencl_devices

    if not any(d.matches("intel(r) opencl") for d in opencl_devices()):
        pytest.skip("Intel's CPU OpenCL runtime is not installed")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    script = (
        "from pathlib import Path\n"
        "from edgecv.bench.baselines import openvino_baseline\n"
        "from edgecv.board.runtime.opencl_devices import opencl_devices\n"
        f"openvino_baseline(Path({str(path)!r}))\n"
        "print(sorted(d.label for d in opencl_devices()))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "Intel(R) OpenCL" in result.stdout, result.stdout


@pytest.fixture(scope="module")
def int8_package(tmp_path_factory):
    """(int8 package, its --calibrate .npy) of tests/test_int8.py's small net: every
    arrangement its quantization handles (deployed without the graph tuner)."""
    from test_int8 import SHAPE, _small_net

    from edgecv.deploy import deploy
    from edgecv.pipelines import BuildOptions

    root = tmp_path_factory.mktemp("bench-int8")
    symbol = _small_net(root / "small")
    npy = root / "calibration.npy"
    np.save(npy, np.random.RandomState(1).normal(size=(16, *SHAPE[1:])).astype(np.float32))
    options = BuildOptions(layout="NCHW", tuning=None, precision="int8", calibrate=npy)
    return deploy(symbol, root / "int8", input_shape=SHAPE, options=options), npy


def test_bench_int8_baselines_quantize_on_the_package_calibration_inputs(int8_package, tmp_path):
    """NNCF and quantize_static, calibrated on the inputs the package was calibrated on,
    timed beside the INT8 package; each agrees with it within INT8 tolerance (both
    sides round every layer's input and weights: two quantization steps a layer)."""
    needs = {
        "openvino-int8": ("openvino", "nncf", "onnx"),
        "onnxruntime-int8": ("onnxruntime", "onnx"),
    }
    if not any(all(importlib.util.find_spec(m) for m in ms) for ms in needs.values()):
        pytest.skip("no INT8 baseline is installed (pip install 'edgecv[bench]')")
    package, _ = int8_package
    out = tmp_path / "bench.json"
    result = run_cli(
        "bench",
        package,
        "--repeat",
        "2",
        "--warmup",
        "1",
        "--vs",
        "openvino-int8,onnxruntime-int8",
        "--json",
        out,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["precision"] == "int8"
    runtimes = report["runtimes"]
    for name, modules in needs.items():
        if not all(importlib.util.find_spec(m) for m in modules):
            assert name in report["not_run"]
            continue
        assert name in runtimes, report["not_run"]
        r = runtimes[name]
        assert r["runs"] == 2 and 0 < r["p50_ms"], name
        assert any("the package's calibration inputs: 16 input(s)" in n for n in r["notes"]), r
        # 5 quantized layers on the longest path, each side within INT8_PER_LAYER of float32
        bound = 2 * 5 * INT8_PER_LAYER[1]
        assert r["agreement"]["max_rel_diff"] <= bound, (name, r["agreement"])
        assert f"{name} " in result.stdout  # a row of the table


def test_int8_baselines_stand_in_photos_when_the_calibration_source_is_gone(int8_package):
    import edgecv
    from edgecv.bench.int8_baselines import STAND_IN_INPUTS, calibration_set, stand_in_inputs

    package, npy = int8_package
    model = edgecv.load(package)
    found = calibration_set(model)
    assert found.arrays.shape == (16, *model.input_shape)
    assert np.array_equal(found.arrays[0], np.load(npy)[0][None])
    moved = npy.with_name("moved.npy")
    npy.rename(moved)
    try:
        stand_in = calibration_set(model)
    finally:
        moved.rename(npy)
    assert stand_in.arrays.shape == (STAND_IN_INPUTS, *model.input_shape)
    assert "seeded preprocessed sample photos" in stand_in.note
    assert "cannot be read again" in stand_in.note
    assert np.array_equal(stand_in.arrays, stand_in_inputs(model))  # seeded: the same again
