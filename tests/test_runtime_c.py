"""The device runtime in C (runtime_c/, issue 53, phase 1: `cpu` packages).

libedgecv_runtime is built once per session with CMake (warnings are errors), loaded
through ctypes as a camera application links it, and held to the Python runtime:
outputs equal bit for bit on a classifier and a detector (and close to MXNet's, the
independent reference), the same packages refused (damaged manifest, plan, weights, a
missing file, foreign host code), each with one status code and one line, never a
crash; a build with AddressSanitizer and UndefinedBehaviorSanitizer runs its demo clean.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import c_library as rc
import numpy as np
import pytest
from c_library_fuzz import fuzz, fuzz_archive, reseal
from conftest import mxnet_forward
from graph_tuner.small_model import SHAPE, export_small_model
from user_models import tiny_yolo

import edgecv
from edgecv.board.errors import EdgecvError
from edgecv.board.manifest import FORMAT_VERSION
from edgecv.board.package import manifest_sha256
from edgecv.board.runtime.host import X86_FEATURES, this_arch, this_cpu_features
from edgecv.deploy import deploy  # imports TVM first: its runtime then serves both runtimes
from edgecv.pipelines import BuildOptions
from edgecv.testing import assert_close

pytestmark = pytest.mark.skipif(rc.missing_tools() is not None, reason=str(rc.missing_tools()))


@pytest.fixture(scope="session")
def c_build(tmp_path_factory) -> Path:
    return rc.build(tmp_path_factory.mktemp("runtime_c") / "build")


@pytest.fixture(scope="session")
def c_lib(c_build):
    return rc.library(c_build)


@pytest.fixture(scope="module")
def packages(tmp_path_factory) -> dict:
    """A classifier and a detector (`box_nms`, TVM's library sort) deployed for `cpu` in
    NCHW: name -> (package, symbol, params)."""
    root = tmp_path_factory.mktemp("c_packages")
    small = export_small_model(root / "export" / "small")
    yolo = tiny_yolo(root / "export" / "tiny_yolo", size=64)[:2]
    made = {}
    for name, (symbol, params), shape in (
        ("small", small, SHAPE),
        ("tiny_yolo", yolo, (1, 3, 64, 64)),
    ):
        path = deploy(
            str(symbol),
            root / name,
            "cpu",
            params=str(params),
            input_shape=shape,
            options=BuildOptions(layout="NCHW"),
        )
        made[name] = (path, symbol, params)
    return made


def inputs_for(model: rc.CModel, seed: int) -> list[np.ndarray]:
    rng = np.random.RandomState(seed)
    return [rng.normal(size=shape).astype(dtype) for _, shape, dtype, _ in model.inputs]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("name", ["small", "tiny_yolo"])
def test_outputs_equal_the_python_runtime_bit_for_bit(c_lib, packages, name):
    path, symbol, params = packages[name]
    model, python = rc.CModel(c_lib, path), edgecv.load(path)
    try:
        for seed in range(3):
            x = inputs_for(model, seed)
            got, want = model.run(*x), python.run(*x)
            assert all(same_bits(g, w) for g, w in zip(got, want, strict=True)), (name, seed)
        if name == "tiny_yolo":  # rows kept by the NMS, not only padding
            assert (got[0][..., 0] >= 0).sum() >= 1
        for g, w in zip(got, mxnet_forward(symbol, params, x[0]), strict=True):
            assert_close(g, w, name=f"{name} on the C runtime")
    finally:
        model.close()


def test_the_model_describes_its_tensors_and_package(c_lib, packages):
    path = packages["tiny_yolo"][0]
    manifest = json.loads((path / "manifest.json").read_text())
    model = rc.CModel(c_lib, path, device=None)
    try:
        for described, declared in (
            (model.inputs, manifest["inputs"]),
            (model.outputs, manifest["outputs"]),
        ):
            assert [(n, list(s), str(d)) for n, s, d, _ in described] == [
                (t["name"], t["shape"], t["dtype"]) for t in declared
            ]
            assert [b for *_, b in described] == [
                int(np.prod(t["shape"])) * np.dtype(t["dtype"]).itemsize for t in declared
            ]
        assert model.name == "tiny_yolo"
        assert model.sha256 == manifest_sha256(path)
    finally:
        model.close()
    assert c_lib.edgecv_version().decode() == edgecv.__version__
    assert c_lib.edgecv_format_version() == FORMAT_VERSION


def test_concurrent_runs_on_one_model_give_each_call_its_own_answer(c_lib, packages):
    model = rc.CModel(c_lib, packages["small"][0])
    try:
        inputs = [inputs_for(model, seed) for seed in range(4)]
        expected = [model.run(*x)[0] for x in inputs]
        results, failures = {}, []

        def work(index: int) -> None:
            try:
                for round_ in range(10):
                    results[index, round_] = model.run(*inputs[index])[0]
            except Exception as err:  # noqa: BLE001 (reported below)
                failures.append(err)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures, failures
        assert all(same_bits(results[i, r], expected[i]) for i in range(4) for r in range(10))
    finally:
        model.close()


def test_a_call_with_wrong_buffers_is_one_error(c_lib, packages):
    model = rc.CModel(c_lib, packages["small"][0])
    try:
        x = inputs_for(model, 0)[0]
        with pytest.raises(rc.CError) as refused:
            model.run(x, sizes=[x.nbytes - 4])
        assert refused.value.code == rc.E_ARGUMENT
        assert "input 0 (`data`) is 1724 bytes, the model's is 1728 bytes" in refused.value.message
        assert not model.run(x)[0].size == 0  # the model is still usable
    finally:
        model.close()


# -- damaged packages: one status code and one line each, refused by both runtimes --------


def edit_json(package: Path, relative: str, change) -> None:
    data = json.loads((package / relative).read_text())
    change(data)
    (package / relative).write_text(json.dumps(data, indent=1))
    if relative != "manifest.json":
        reseal(package, relative)


def flip_byte(package: Path, relative: str, at: int = 100) -> None:
    data = bytearray((package / relative).read_bytes())
    data[at] ^= 0x55
    (package / relative).write_bytes(bytes(data))


def out_of_bounds(plan: dict) -> None:
    temp = next(b for b in plan["buffers"] if b["kind"] == "temp")
    temp["offset"] = plan["storage_sizes"][temp["storage"]]


def writes_a_constant(plan: dict) -> None:
    constant = next(b["id"] for b in plan["buffers"] if b["kind"] == "const")
    plan["steps"][0]["args"][-1] = constant


def reshaped_weight(package: Path) -> None:
    with np.load(package / "params.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    first = sorted(arrays)[0]
    arrays[first] = arrays[first].reshape(-1)
    with open(package / "params.npz", "wb") as f:
        np.savez(f, **arrays)
    reseal(package, "params.npz")


def truncated_weights(package: Path) -> None:
    data = (package / "params.npz").read_bytes()
    (package / "params.npz").write_bytes(data[: len(data) // 2])
    reseal(package, "params.npz")


def lacking_feature(package: Path) -> None:
    lacking = sorted(set(X86_FEATURES) - (this_cpu_features("x86_64") or set(X86_FEATURES)))
    if this_arch() != "x86_64" or not lacking:
        pytest.skip("this CPU has every feature edgecv checks")
    edit_json(package, "manifest.json", lambda m: m["build"]["host"]["features"].append(lacking[0]))


DAMAGE = {
    "manifest not JSON": (
        lambda p: (p / "manifest.json").write_text('{"format": '),
        rc.E_MANIFEST,
        "is corrupt",
    ),
    "manifest field": (
        lambda p: edit_json(p, "manifest.json", lambda m: m["inputs"][0].update(shape="1,3")),
        rc.E_MANIFEST,
        "field `inputs.0.shape` should be a list, found str '1,3'",
    ),
    "manifest of another edgecv": (
        lambda p: edit_json(p, "manifest.json", lambda m: m["versions"].update(edgecv="0.0.1")),
        rc.E_MANIFEST,
        "built by edgecv '0.0.1'",
    ),
    "manifest lists a file outside": (
        lambda p: edit_json(p, "manifest.json", lambda m: m["files"].update({"../x": "0" * 64})),
        rc.E_MANIFEST,
        "which is not a file inside the package",
    ),
    "plan changed": (
        lambda p: flip_byte(p, "plan.json"),
        rc.E_CHECKSUM,
        "plan.json is corrupt (checksum",
    ),
    "plan out of bounds": (
        lambda p: edit_json(p, "plan.json", out_of_bounds),
        rc.E_PLAN,
        "a place inside storage slot",
    ),
    "plan writes a constant": (
        lambda p: edit_json(p, "plan.json", writes_a_constant),
        rc.E_PLAN,
        "not a constant",
    ),
    "plan not JSON": (
        lambda p: ((p / "plan.json").write_text("[1, 2"), reseal(p, "plan.json")),
        rc.E_PLAN,
        "plan.json is malformed",
    ),
    "weights changed": (
        lambda p: flip_byte(p, "params.npz"),
        rc.E_CHECKSUM,
        "params.npz is corrupt",
    ),
    "weights truncated": (truncated_weights, rc.E_PARAMS, "params.npz"),
    "weight of another shape": (reshaped_weight, rc.E_PARAMS, "its plan says"),
    "weights missing": (
        lambda p: (p / "params.npz").unlink(),
        rc.E_NOT_FOUND,
        "is missing params.npz",
    ),
    "kernels changed": (
        lambda p: flip_byte(p, "kernels/cpu.so", 5000),
        rc.E_CHECKSUM,
        "cpu.so is corrupt",
    ),
    "kernels missing": (
        lambda p: (p / "kernels/cpu.so").unlink(),
        rc.E_NOT_FOUND,
        "kernels/cpu.so",
    ),
    "code for another ISA": (
        lambda p: edit_json(
            p, "manifest.json", lambda m: m["build"]["host"].update(triple="aarch64-linux-gnu")
        ),
        rc.E_HOST,
        "holds CPU code for aarch64",
    ),
    "code needing a feature this CPU lacks": (lacking_feature, rc.E_HOST, "would stop with SIGILL"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_package_is_one_error_from_both_runtimes(c_lib, packages, tmp_path, damage):
    change, code, fragment = DAMAGE[damage]
    package = tmp_path / "pkg"
    shutil.copytree(packages["small"][0], package)
    change(package)
    with pytest.raises(rc.CError) as refused:
        rc.CModel(c_lib, package)
    message = refused.value.message
    assert refused.value.code == code, message
    assert fragment in message and "\n" not in message, message
    with pytest.raises(EdgecvError):  # the Python loader refuses it too
        edgecv.load(package)


def test_a_wrong_pin_a_missing_package_and_other_devices_are_refused(c_lib, packages, tmp_path):
    path = packages["small"][0]
    cases = [
        (dict(path=path, pin="0" * 64), rc.E_PIN, "is not the pinned package"),
        (dict(path=path, pin="abc"), rc.E_ARGUMENT, "is not a package pin"),
        (dict(path=tmp_path / "nothing"), rc.E_NOT_FOUND, "does not exist"),
        (dict(path=path, device="opencl"), rc.E_DEVICE, "runs packages on `cpu` only"),
    ]
    for arguments, code, fragment in cases:
        with pytest.raises(rc.CError) as refused:
            rc.CModel(c_lib, **arguments)
        assert refused.value.code == code and fragment in refused.value.message, refused.value
    model = rc.CModel(c_lib, path, pin=manifest_sha256(path).upper())  # the right pin loads
    model.close()
    package = tmp_path / "opencl"
    shutil.copytree(path, package)
    edit_json(package, "manifest.json", lambda m: m["profile"].update(runtime="opencl"))
    with pytest.raises(rc.CError) as refused:
        rc.CModel(c_lib, package)
    assert refused.value.code == rc.E_DEVICE and "runs on opencl" in refused.value.message


def test_the_library_links_no_tvm_library(c_build):
    """The board's side: libtvm_ffi.so and the C library, never TVM's compiler; TVM's
    runtime is the package's own copy, opened at load time."""
    needed = subprocess.run(
        ["readelf", "-d", str(c_build / "libedgecv_runtime.so")], capture_output=True, text=True
    ).stdout
    libraries = [line.split("[")[1].rstrip("]") for line in needed.splitlines() if "NEEDED" in line]
    assert "libtvm_ffi.so" in libraries and not any(n.startswith("libtvm.") for n in libraries)
    assert not any(n.startswith("libtvm_runtime") for n in libraries), libraries


# -- the demo, the sanitizers, the fuzzed loader ---------------------------------------


def run_demo(program: Path, package: Path, *arguments, env=None) -> subprocess.CompletedProcess:
    """demos/c/run_package in a process of its own: no Python, no TVM but the package's
    runtime library, as on a board."""
    return subprocess.run(
        [str(program), str(package), *map(str, arguments)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_the_c_demo_runs_packages_on_npy_inputs(c_build, packages, tmp_path):
    for name in ("small", "tiny_yolo"):
        path = packages[name][0]
        python = edgecv.load(path)
        x = np.random.RandomState(7).normal(size=python.input_shape).astype(np.float32)
        np.save(tmp_path / "x.npy", x)
        done = run_demo(
            c_build / "run_package", path, tmp_path / "x.npy", "--save", tmp_path / "out"
        )
        assert done.returncode == 0, done.stderr
        want = python.run(x)
        assert (tmp_path / "out").read_bytes() == b"".join(w.tobytes() for w in want), name
        if name == "small":  # top-5 in the Python runtime's order
            ranked = [
                int(line.split()[2]) for line in done.stdout.splitlines() if line.startswith("top")
            ]
            assert ranked == list(np.argsort(-want[0][0], kind="stable")[:5]), done.stdout
        else:
            assert "detection(s) with score >= 0.5" in done.stdout, done.stdout
    # the portable SHA-256 (this CPU's SHA instructions serve the loads above): every
    # file's digest must still be the one Python's hashlib wrote into the manifest
    portable = {**os.environ, "EDGECV_PORTABLE_SHA256": "1"}
    done = run_demo(c_build / "run_package", packages["tiny_yolo"][0], env=portable)
    assert done.returncode == 0, done.stderr
    done = run_demo(c_build / "run_package", tmp_path / "nothing")
    assert done.returncode == rc.E_NOT_FOUND and done.stderr.count("\n") == 1, done.stderr
    assert (
        done.stderr.startswith("run_package: error: package ") and "does not exist" in done.stderr
    )


def test_the_runtime_runs_clean_under_address_and_undefined_behaviour_sanitizers(
    packages, tmp_path_factory, tmp_path
):
    """The demo and the library built with -fsanitize=address,undefined: a detector run
    (its outputs still the Python runtime's) and damaged packages refused with no report
    and no leak; then the fuzzed loads, in a Python with the sanitizers preloaded."""
    build = rc.build(tmp_path_factory.mktemp("runtime_c_asan") / "build", sanitize=True)
    env = {
        "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=99",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1:exitcode=98",
        "PATH": "/usr/bin:/bin",
    }
    path = packages["tiny_yolo"][0]
    x = np.random.RandomState(3).normal(size=(1, 3, 64, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    done = run_demo(
        build / "run_package", path, tmp_path / "x.npy", "--save", tmp_path / "out", env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "out").read_bytes() == edgecv.load(path).run(x)[0].tobytes()
    archive = packed(tmp_path, path, None)
    done = run_demo(build / "run_package", archive, tmp_path / "x.npy", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    for damage in ("plan out of bounds", "weights truncated", "manifest field", "plan not JSON"):
        change, code, fragment = DAMAGE[damage]
        package = tmp_path / damage.replace(" ", "_")
        shutil.copytree(packages["small"][0], package)
        change(package)
        done = run_demo(build / "run_package", package, env=env)
        assert done.returncode == code and fragment in done.stderr, (damage, done.stderr[-3000:])
    for report in ("AddressSanitizer", "LeakSanitizer", "runtime error"):
        assert report not in done.stderr
    preload = [rc.sanitizer_runtime(name) for name in ("libasan.so", "libubsan.so")]
    fuzzed = subprocess.run(
        [sys.executable, str(rc.REPO / "tests" / "c_library_fuzz.py"), str(build)]
        + [str(packages["small"][0]), str(tmp_path), "6"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "LD_PRELOAD": ":".join(preload), "ASAN_OPTIONS": "detect_leaks=0:exitcode=99"},
    )
    assert fuzzed.returncode == 0, fuzzed.stderr[-3000:]
    assert str(rc.E_MANIFEST) in fuzzed.stdout, fuzzed.stdout  # the codes seen
    assert "AddressSanitizer" not in fuzzed.stderr and "runtime error" not in fuzzed.stderr


def test_the_loader_fuzzed_never_crashes_and_says_one_line(c_lib, packages, tmp_path):
    """See tests/c_library_fuzz.py: 155 loads of changed packages."""
    codes = fuzz(c_lib, packages["small"][0], tmp_path, count=40)
    assert {rc.E_MANIFEST, rc.E_PLAN, rc.E_PARAMS} <= codes, codes


# -- packages as .tar.gz: read in memory, refused where unsafe --------------------------


def test_an_archived_package_loads_in_memory_with_the_same_outputs(c_lib, packages, tmp_path):
    path = packages["tiny_yolo"][0]
    folder = tmp_path / "board"
    folder.mkdir()
    packed = folder / f"{path.name}.tar.gz"
    with tarfile.open(packed, "w:gz") as tar:  # as edgecv.board.package.archive packs it
        tar.add(path, arcname=path.name)
    model = rc.CModel(c_lib, packed)
    try:
        x = inputs_for(model, 5)
        assert all(
            same_bits(g, w) for g, w in zip(model.run(*x), edgecv.load(path).run(*x), strict=True)
        )
        assert model.sha256 == manifest_sha256(path)
    finally:
        model.close()
    assert [p.name for p in folder.iterdir()] == [packed.name]  # nothing extracted


def packed(tmp_path: Path, package: Path, extra: tarfile.TarInfo | None, skip: str = "") -> Path:
    """The package as a .tar.gz, with ``extra`` (a member of no file) added and the
    member ``skip`` left out."""
    out = tmp_path / f"{package.name}.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(
            package,
            arcname=package.name,
            filter=lambda m: None if m.name.endswith(skip) and skip else m,
        )
        if extra is not None:
            tar.addfile(extra, io.BytesIO(b"x" * extra.size) if extra.isfile() else None)
    return out


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, 1 if kind == tarfile.REGTYPE else 0
    return info


ARCHIVES = {
    "climbs out": (lambda n: member(f"{n}/../evil"), rc.E_ARCHIVE, "climbs out with `..`"),
    "outside the folder": (
        lambda n: member("other/x"),
        rc.E_ARCHIVE,
        "lies outside the package folder",
    ),
    "absolute": (lambda n: member("/etc/x"), rc.E_ARCHIVE, "has an absolute path"),
    "a link": (
        lambda n: member(f"{n}/kernels/l", tarfile.SYMTYPE, "/etc"),
        rc.E_ARCHIVE,
        "is a link",
    ),
    "a device": (lambda n: member(f"{n}/dev", tarfile.CHRTYPE), rc.E_ARCHIVE, "is a device"),
}


@pytest.mark.parametrize("case", sorted(ARCHIVES))
def test_an_unsafe_archive_is_one_error_from_both_runtimes(c_lib, packages, tmp_path, case):
    make, code, fragment = ARCHIVES[case]
    path = packages["small"][0]
    archive = packed(tmp_path, path, make(path.name))
    with pytest.raises(rc.CError) as refused:
        rc.CModel(c_lib, archive)
    assert refused.value.code == code and fragment in refused.value.message, refused.value
    assert "\n" not in refused.value.message
    with pytest.raises(EdgecvError):
        edgecv.load(archive)


def test_a_damaged_or_incomplete_archive_is_one_error(c_lib, packages, tmp_path):
    path = packages["small"][0]
    whole = packed(tmp_path, path, None).read_bytes()
    (tmp_path / f"{path.name}.tar.gz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(rc.CError) as refused:
        rc.CModel(c_lib, tmp_path / f"{path.name}.tar.gz")
    assert (
        refused.value.code == rc.E_ARCHIVE
        and "not a readable package archive" in refused.value.message
    )
    archive = packed(tmp_path, path, None, skip="params.npz")
    with pytest.raises(rc.CError) as refused:
        rc.CModel(c_lib, archive)
    assert refused.value.code == rc.E_NOT_FOUND and "is missing params.npz" in refused.value.message


def test_archives_fuzzed_never_crash(c_lib, packages, tmp_path):
    """See tests/c_library_fuzz.py: the tar of a package with bytes changed, gzipped."""
    codes = fuzz_archive(c_lib, packages["small"][0], tmp_path, count=16)
    assert rc.E_ARCHIVE in codes, codes


# -- the zoo's models (heavy: each deploy takes minutes) --------------------------------


@pytest.mark.heavy
@pytest.mark.parametrize(
    "name", ["mobilenet1.0", "ssd_512_mobilenet1.0_voc", "yolo3_mobilenet1.0_coco"]
)
def test_zoo_models_equal_the_python_runtime_bit_for_bit(c_lib, tmp_path, name):
    """The issue's models (random weights, seed 0) deployed for `cpu` in NCHW."""
    path = deploy(
        name, tmp_path / name, "cpu", pretrained=False, options=BuildOptions(layout="NCHW")
    )
    model, python = rc.CModel(c_lib, path), edgecv.load(path)
    try:
        x = inputs_for(model, 0)
        got, want = model.run(*x), python.run(*x)
        assert all(same_bits(g, w) for g, w in zip(got, want, strict=True)), name
    finally:
        model.close()
