"""Packages deployed on this x86-64 machine, run on an emulated aarch64 board.

The board is the user space of ``prepare_aarch64.sh`` under qemu-user (Debian's
Python 3.11 and PoCL for arm64, PyPI's aarch64 wheels of numpy, apache-tvm-ffi and
pyopencl) with edgecv installed from its own wheel, without dependencies: what a board
installs, and nothing of TVM's compiler. The answers are compared here with MXNet's
forward pass of the same weights.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import mxnet_forward
from emulation import aarch64
from graph_tuner.small_model import SHAPE, export_small_model
from test_int8 import SHAPE as INT8_SHAPE
from test_int8 import _small_net, arm_cpu_profile
from user_models import tiny_yolo

from edgecv.deploy import deploy
from edgecv.pipelines import BuildOptions
from edgecv.schedules.cpu.dot_product import NEON_SDOT
from edgecv.testing import assert_close, assert_close_int8, match_detections, network_loosening

pytestmark = pytest.mark.skipif(
    aarch64.unavailable_reason() is not None, reason=str(aarch64.unavailable_reason())
)

# The packages are built in NCHW: what runs on the board is the question here, not the
# graph tuner's layouts (tests/graph_tuner), whose timings a default deploy spends first
NCHW = "NCHW"

# Runs on the board: load a package (the public API, or the CPU library alone for a
# Jetson package whose CUDA part has no GPU here), run it, report what was loaded.
BOARD = """
import json, sys, time
started = time.perf_counter()
import numpy as np
import edgecv
imported = time.perf_counter()
package, x_path, mode = sys.argv[1:4]
x = np.load(x_path)
if mode == "load":
    model = edgecv.load(package)
    loaded = time.perf_counter()
    outputs = model.run(x)
else:  # the CPU library of a package whose every launch runs on the CPU
    from edgecv.board.package import read_manifest
    from edgecv.board.plan import Plan
    from edgecv.board.runtime.cpu import CPUBackend
    from edgecv.board.runtime.executor import Executor
    from edgecv.board.runtime.host import check_host

    root, manifest = read_manifest(package)
    check_host(manifest.host, root)
    kernels = manifest.kernels
    backend = CPUBackend.load(root / kernels["cpu"], [root / kernels["tvm_runtime"]])
    plan = Plan.from_json((root / "plan.json").read_text())
    with np.load(root / "params.npz") as npz:
        constants = {k: npz[k] for k in npz.files}
    executor = Executor(plan, {"cpu": backend}, constants)
    loaded = time.perf_counter()
    outputs = executor.run([x])
ran = time.perf_counter()
np.savez(x_path + ".out.npz", *outputs)
import platform
maps = open("/proc/self/maps").read()
print(json.dumps({
    "machine": platform.machine(),
    "edgecv_file": edgecv.__file__,
    "tvm_imported": sys.modules.get("tvm") is not None,
    "compiler_library": "libtvm_compiler" in maps,
    "runtime_library": "libtvm_runtime" in maps,
    "import_s": imported - started, "load_s": loaded - imported, "run_s": ran - loaded,
}))
"""


@pytest.fixture(scope="module")
def device_runtime(wheel, tmp_path_factory) -> Path:
    """edgecv installed from its wheel as a board installs it (its dependencies are the
    prepared aarch64 wheels); no TVM anywhere on the board's path."""
    target = tmp_path_factory.mktemp("device-runtime")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    assert not (aarch64.site_packages() / "tvm").exists()
    return target


def run_on_board(device_runtime: Path, package: Path, x: np.ndarray, mode: str) -> tuple:
    folder = package.parent
    np.save(folder / "x.npy", x)
    done = aarch64.run_python(
        ["-c", BOARD, str(package), str(folder / "x.npy"), mode],
        binds=[folder, device_runtime],
        env={"PYTHONPATH": str(device_runtime)},
        timeout=1500,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["machine"] == "aarch64"
    assert facts["edgecv_file"].startswith(str(device_runtime)), facts  # the wheel's edgecv
    assert not facts["tvm_imported"] and not facts["compiler_library"], facts
    with np.load(folder / "x.npy.out.npz") as npz:
        outputs = [npz[f"arr_{i}"] for i in range(len(npz.files))]
    return outputs, facts


def test_aisage_detector_with_cpu_nms_runs_on_the_board(device_runtime, tmp_path):
    """(a) A YOLO-like detector for `aisage`, `box_nms` on the CPU: OpenCL on the
    emulated PoCL, the NMS in the cross-linked aarch64 library, MXNet's answer."""
    symbol, params, shape = tiny_yolo(tmp_path / "export" / "tiny_yolo", size=64)
    path = deploy(
        str(symbol),
        tmp_path / "board" / "pkg",
        "aisage",
        params=str(params),
        input_shape=shape,
        options=BuildOptions(cpu_ops=["box_nms"], check_on=None, layout=NCHW),
    )
    build = json.loads((path / "manifest.json").read_text())["build"]
    assert build["placement"]["launches"]["cpu"] >= 1
    assert [n["ops"] for n in build["placement"]["cpu_nodes"]] == [["box_nms"]]
    # the CPU NMS sorts with TVM's library sort: the package carries its extra library
    assert build["kernels"]["tvm_runtime_extra"] == "kernels/libtvm_runtime_extra.so"
    x = np.random.RandomState(4).normal(size=shape).astype(np.float32)
    outputs, facts = run_on_board(device_runtime, path, x, "load")
    assert facts["runtime_library"], facts  # the package's aarch64 libtvm_runtime.so
    for got, want in zip(outputs, mxnet_forward(symbol, params, x), strict=True):
        assert_close(got, want, name="tiny_yolo for aisage on the emulated board")


def test_jetson_cpu_library_runs_on_the_board(device_runtime, tmp_path):
    """(b) A `jetson_orin_nano` package (Cortex-A78 code: dot product, fp16 arithmetic
    allowed) with every launch on the CPU: its CPU library runs on the emulated board.
    The CUDA part cannot run here."""
    symbol, params = export_small_model(tmp_path / "export" / "small")
    everything = ["concatenate", "max_pool2d", "mean", "conv2d", "matmul"]
    path = deploy(
        str(symbol),
        tmp_path / "board" / "pkg",
        "jetson_orin_nano",
        params=str(params),
        input_shape=SHAPE,
        options=BuildOptions(cpu_ops=everything, layout=NCHW),
    )
    build = json.loads((path / "manifest.json").read_text())["build"]
    assert build["placement"]["launches"]["gpu"] == 0
    assert {"dotprod", "fullfp16"} <= set(build["host"]["features"])
    x = np.random.RandomState(2).normal(size=SHAPE).astype(np.float32)
    outputs, facts = run_on_board(device_runtime, path, x, "cpu-library")
    assert facts["runtime_library"], facts
    assert_close(outputs[0], mxnet_forward(symbol, params, x)[0], name="jetson CPU library")


def test_device_runtime_cli_on_the_board(device_runtime, tmp_path):
    """(c) `edgecv run PKG --input x.npy` with the wheel's device runtime on the board:
    no compiler side, no OpenCV; an `aisage` package with CPU launches."""
    symbol, params = export_small_model(tmp_path / "export" / "small")
    path = deploy(
        str(symbol),
        tmp_path / "board" / "pkg",
        "aisage",
        params=str(params),
        input_shape=SHAPE,
        options=BuildOptions(cpu_ops=["max_pool2d", "mean"], check_on=None, layout=NCHW),
    )
    x = np.random.RandomState(3).normal(size=SHAPE).astype(np.float32)
    np.save(tmp_path / "board" / "x.npy", x)
    code = (
        "import sys\n"
        "for name in ('cv2', 'tvm', 'mxnet'):\n"
        "    sys.modules[name] = None\n"
        "from edgecv.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "maps = open('/proc/self/maps').read()\n"
        "print('compiler library mapped:', 'libtvm_compiler' in maps)\n"
        "sys.exit(code)\n"
    )
    out = tmp_path / "board" / "out.npz"
    done = aarch64.run_python(
        [
            "-c",
            code,
            "run",
            str(path),
            "--input",
            str(tmp_path / "board" / "x.npy"),
            "--output",
            str(out),
            "--repeat",
            "1",
        ],
        binds=[tmp_path / "board", device_runtime],
        env={"PYTHONPATH": str(device_runtime)},
        timeout=1500,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "compiler library mapped: False" in done.stdout
    with np.load(out) as npz:
        assert_close(npz["output0"], mxnet_forward(symbol, params, x)[0], name="edgecv run")


def test_int8_package_on_arm_sdot_runs_on_the_board(device_runtime, tmp_path):
    """(d) ``--precision int8`` for a CPU profile of the Jetson Orin's Cortex-A78 (a
    profile file, as a user writes one): calibrated here, its uint8 x int8 convolutions
    on ``sdot`` with 7-bit data, run on the emulated board (qemu's CPU has the dot
    product). Against MXNet's float32 forward pass of the same weights: within the
    quantization step, as on x86."""
    symbol = _small_net(tmp_path / "export" / "small")
    inputs = np.random.RandomState(1).normal(size=(16, *INT8_SHAPE[1:])).astype(np.float32)
    np.save(tmp_path / "calibration.npy", inputs)
    profile = arm_cpu_profile(tmp_path, "cortex-a78")  # the Jetson Orin Nano's CPU
    options = dict(layout="NCHW", tuning=None, calibration_method="minmax")
    path = deploy(
        str(symbol),
        tmp_path / "board" / "pkg",
        str(profile),
        input_shape=INT8_SHAPE,
        options=BuildOptions(
            precision="int8", calibrate=str(tmp_path / "calibration.npy"), **options
        ),
    )
    build = json.loads((path / "manifest.json").read_text())["build"]
    facts = build["quantization"]
    assert facts["dot_product"] == NEON_SDOT
    assert build["schedules"]["cpu"]["rules"].get("cpu.Conv2DInt8") == 2  # the 1x1, the 3x3
    on_dot = {op["name"]: op for op in facts["operators"] if op["arithmetic"] == "int32"}
    assert sorted(on_dot) == ["conv2d_2", "conv2d_3"]
    # sdot multiplies signed bytes: 7-bit data for both, 8-bit weights
    assert {(op["input_max"], op["weight_max"]) for op in on_dot.values()} == {(127, 127)}
    params = symbol.with_name(symbol.name.replace("-symbol.json", "-0000.params"))
    x = inputs[:1]  # one of the calibration inputs: min/max clips nothing of it
    outputs, loaded = run_on_board(device_runtime, path, x, "load")
    assert loaded["runtime_library"], loaded
    error = assert_close_int8(outputs[0], mxnet_forward(symbol, params, x)[0], layers=5)
    assert error > 0, "int8 gave exactly the float32 outputs: was anything quantized?"


@pytest.mark.heavy
def test_ssd_mobilenet_for_aisage_on_the_board(device_runtime, exported, tmp_path):
    """SSD-512 MobileNet for `aisage`, every launch on the emulated PoCL: MXNet's
    detections (tens of minutes under qemu; benchmarks/board_runtime.py --ssd times it)."""
    model = exported("ssd_512_mobilenet1.0_voc")
    path = deploy(
        str(model.symbol_path),
        tmp_path / "board" / "pkg",
        "aisage",
        params=str(model.params_path),
        input_shape=model.input_shape,
        check_on=None,
    )
    x = np.random.RandomState(0).normal(size=model.input_shape).astype(np.float32)
    outputs, _ = run_on_board(device_runtime, path, x, "load")
    reference = mxnet_forward(model.symbol_path, model.params_path, x)
    loosen, scale = network_loosening(model.symbol_path), max(model.input_shape[2:])
    assert match_detections(outputs, reference, loosen, scale) > 0
