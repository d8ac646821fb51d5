"""Packages for boards: CPU code built and linked for the profile's host on this x86-64
workstation, refused with one line where it cannot run, and a device runtime that runs
packages without the compiler side (checked here in a process where TVM, MXNet, GluonCV
and OpenCV cannot be imported; under qemu in tests/emulation/test_board_packages.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import mxnet_forward
from graph_tuner.small_model import SHAPE, export_small_model
from helpers import assert_one_error_line, run_cli

import edgecv
from edgecv.board.errors import PackageError
from edgecv.board.runtime.host import X86_FEATURES, this_arch, this_cpu_features
from edgecv.deploy import deploy
from edgecv.pipelines import BuildOptions
from edgecv.testing import assert_close

REPO = Path(__file__).resolve().parent.parent
EM_AARCH64 = 183  # ELF e_machine of aarch64
# Modules of the board's device runtime (what `edgecv.load(...).run(x)` and `edgecv run`
# import); they keep to the oldest Python the device runtime's wheels support.
DEVICE_RUNTIME = [
    "edgecv/__init__.py",
    "edgecv/op_registry.py",
    "edgecv/board",
    "edgecv/cli.py",
    "edgecv/commands",
]
COMPILER_MODULES = ("tvm", "mxnet", "gluoncv", "cv2", "tqdm", "skimage", "scipy", "xgboost")
# The packages here are built in NCHW: what they test is where the code runs and what it
# imports, not the graph tuner's layouts (tests/graph_tuner), whose timings a default
# deploy would spend first
NCHW = "NCHW"


def elf_machine(path: Path) -> int:
    header = path.read_bytes()[:20]
    assert header[:4] == b"\x7fELF", f"{path} is not an ELF file"
    return int.from_bytes(header[18:20], "little")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """The small model (every kind of graph-tuner node), its input and MXNet's answer."""
    symbol, params = export_small_model(tmp_path_factory.mktemp("small") / "small")
    x = np.random.RandomState(1).normal(size=SHAPE).astype(np.float32)
    return symbol, params, x, mxnet_forward(symbol, params, x)


@pytest.fixture(scope="module")
def cpu_package(small, tmp_path_factory) -> Path:
    """The small model's `cpu` package, deployed once; a test that changes it copies it."""
    symbol, params, _, _ = small
    folder = tmp_path_factory.mktemp("cpu") / "pkg"
    options = BuildOptions(layout=NCHW)
    return deploy(
        str(symbol), folder, "cpu", params=str(params), input_shape=SHAPE, options=options
    )


def test_aisage_package_with_cpu_fallback_is_built_for_aarch64(small, tmp_path):
    symbol, params, _, _ = small
    path = deploy(
        str(symbol),
        tmp_path / "pkg",
        "aisage",
        params=str(params),
        input_shape=SHAPE,
        options=BuildOptions(cpu_ops=["max_pool2d", "mean"], layout=NCHW),
    )
    build = json.loads((path / "manifest.json").read_text())["build"]
    assert build["placement"]["launches"]["cpu"] == 2
    assert build["host"]["triple"] == "aarch64-linux-gnu"
    assert build["host"]["cpu"] == "cortex-a72"
    assert {"neon", "fp-armv8"} <= set(build["host"]["features"])
    # the kernels and TVM's runtime library beside them are aarch64 code
    assert elf_machine(path / build["kernels"]["cpu"]) == EM_AARCH64
    assert elf_machine(path / build["kernels"]["tvm_runtime"]) == EM_AARCH64
    if this_arch() != "aarch64":
        with pytest.raises(PackageError, match="holds CPU code for aarch64 .* --host native"):
            edgecv.load(path)


def test_a_missing_cross_linker_is_one_error_naming_the_install(small, tmp_path):
    """Without the ziglang wheel, an aarch64 package with CPU launches stops with one
    line naming the install step (ziglang blocked in a fresh process), before compiling."""
    symbol, params, _, _ = small
    argv = [
        "deploy",
        str(symbol),
        "--params",
        str(params),
        "--input-shape",
        "1,3,12,12",
        "--device",
        "aisage",
        "--cpu-ops",
        "mean",
        "--no-device-check",
        "--layout",
        NCHW,
        "-o",
        str(tmp_path / "pkg"),
    ]
    code = (
        "import sys; sys.modules['ziglang'] = None\n"
        f"from edgecv.cli import main\nsys.exit(main({argv!r}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=600
    )
    assert_one_error_line(done, "pip install 'edgecv[compiler]'")
    assert "ziglang" in done.stderr
    assert not (tmp_path / "pkg").exists()
    # refused once the model is lowered, before its GPU kernels are compiled, not at the link
    assert "lowering (Relax passes" in done.stderr and "scheduling and" not in done.stderr


def test_a_package_needing_cpu_features_this_machine_lacks_is_refused(small, cpu_package, tmp_path):
    """A `cpu` package built where AVX-512 (say) exists dies with SIGILL on an AVX2 box:
    loading one whose recorded features this CPU lacks is refused, naming them."""
    if this_arch() != "x86_64":
        pytest.skip("x86-64 feature names")
    lacking = sorted(set(X86_FEATURES) - (this_cpu_features("x86_64") or set()))
    if not lacking:
        pytest.skip("this CPU has every feature edgecv checks")
    _, _, x, reference = small
    path = Path(shutil.copytree(cpu_package, tmp_path / "pkg"))  # its manifest is changed
    manifest_path = path / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert set(manifest["build"]["host"]["features"]) <= this_cpu_features("x86_64")
    assert_close(edgecv.load(path).run(x)[0], reference[0])  # built here: runs here
    manifest["build"]["host"]["features"].append(lacking[0])
    manifest_path.write_text(json.dumps(manifest))
    done = run_cli("run", path, "--input", _save(tmp_path, x))
    assert_one_error_line(done, f"uses {lacking[0]}, which this machine's CPU lacks")


def _save(folder: Path, x: np.ndarray) -> Path:
    np.save(folder / "x.npy", x)
    return folder / "x.npy"


DEVICE_RUN = """
import json, sys
for name in {blocked!r}:
    sys.modules[name] = None  # a board's install has none of them
import numpy as np
import edgecv
model = edgecv.load(sys.argv[1], on=sys.argv[3] or None)
outputs = model.run(np.load(sys.argv[2]))
np.savez(sys.argv[2] + ".out.npz", *outputs)
maps = open("/proc/self/maps").read()
print(json.dumps({{"tvm": sys.modules.get("tvm") is not None,
                   "compiler_library": "libtvm_compiler" in maps,
                   "runtime_library": "libtvm_runtime" in maps,
                   "edgecv_modules": sorted(m for m in sys.modules if m.startswith("edgecv"))}}))
"""


@pytest.mark.parametrize("profile", ["cpu", "deeplens"])
def test_device_runtime_runs_packages_without_the_compiler(profile, small, cpu_package, tmp_path):
    """`edgecv.load(path).run(x)` in a process that cannot import TVM, MXNet, GluonCV or
    OpenCV: the same answer as MXNet, TVM's compiler library never mapped."""
    symbol, params, x, reference = small
    on = ""
    if profile == "deeplens":
        from test_opencl import device_or_skip

        device_or_skip("intel(r) opencl")
        on = "intel"
    path = cpu_package
    if profile == "deeplens":  # with a CPU fallback launch too
        path = deploy(
            str(symbol),
            tmp_path / "pkg",
            profile,
            params=str(params),
            input_shape=SHAPE,
            options=BuildOptions(cpu_ops=["max_pool2d"], layout=NCHW),
            host="native",
        )
    code = DEVICE_RUN.format(blocked=COMPILER_MODULES)
    done = subprocess.run(
        [sys.executable, "-c", code, str(path), str(_save(tmp_path, x)), on],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert not facts["tvm"] and not facts["compiler_library"], facts
    assert facts["runtime_library"], facts  # the package's own copy served the kernels
    compiler_side = (
        "frontend",
        "lowering",
        "schedules",
        "codegen",
        "pipelines",
        "tuning",
        "graph_tuner",
        "fallback",
        "ops",
        "deploy",
    )
    assert not [
        m for m in facts["edgecv_modules"] if m.split(".")[1:2] in [[s] for s in compiler_side]
    ]
    with np.load(tmp_path / "x.npy.out.npz") as outputs:
        assert_close(outputs["arr_0"], reference[0], name=f"small on {profile}")


def python_3_9() -> str | None:
    """A CPython 3.9 on this machine (pyenv's, or on PATH), for the device runtime."""
    found = sorted(Path("/root/.pyenv/versions").glob("3.9.*/bin/python3.9"))
    return str(found[-1]) if found else shutil.which("python3.9")


@pytest.mark.skipif(python_3_9() is None, reason="no Python 3.9 on this machine")
def test_device_runtime_installs_and_runs_on_python_3_9(small, cpu_package, wheel, tmp_path):
    """The device runtime installed as a board would, on Python 3.9: `pip install` of
    edgecv's wheel (its base dependencies only), then `edgecv run` on a `cpu` package."""
    _, _, x, reference = small
    path = cpu_package
    venv = tmp_path / "venv"
    # a venv without pip of its own (ensurepip alone costs seconds): this pip installs
    # into it with --python, running under the venv's Python 3.9 and resolving for it
    subprocess.run([python_3_9(), "-m", "venv", "--without-pip", str(venv)], check=True)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    # with its base dependencies, from PyPI
    install = subprocess.run([*pip, "install", "-q", str(wheel)], capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-2000:]
    listed = subprocess.run(
        [*pip, "list", "--format=freeze"], capture_output=True, text=True, check=True
    ).stdout
    assert "apache-tvm-ffi==" in listed and "apache-tvm==" not in listed, listed
    done = subprocess.run(
        [
            str(venv / "bin" / "edgecv"),
            "run",
            str(path),
            "--input",
            str(_save(tmp_path, x)),
            "--output",
            str(tmp_path / "out.npz"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    with np.load(tmp_path / "out.npz") as outputs:
        assert_close(outputs["output0"], reference[0], name="small on Python 3.9")


def test_device_runtime_keeps_to_python_3_9():
    """The board's modules parse and run on Python 3.9 (the oldest apache-tvm-ffi has
    aarch64 wheels for): vermin finds nothing newer."""
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("vermin")),
            "--target=3.9-",
            "--no-tips",
            "--violations",
            *DEVICE_RUNTIME,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout + done.stderr
