"""What loading a package trusts (issue 49, items 2 and 3).

Loading a package runs its native code, and its checksums sit in its own manifest: they
catch damage, not tampering. A pin (the sha256 of the manifest, which lists every
file's digest) says which package may load; the library bytes that were checked are the
bytes the dynamic loader opens (a file swapped after the check is not what runs); and
those bytes are written to a folder only this process made, never to a folder of a
predictable name that another user may have made first. Real packages, real loader.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_error_line, cli_here, run_cli
from test_bad_input import mx, small_net, small_params

import edgecv
import edgecv.board.runtime.cpu as cpu_runtime
from edgecv.board.errors import PackageError

TINY_SHAPE = (1, 2, 5, 5)
POOL_SHAPE = (1, 3, 8, 8)


@pytest.fixture(scope="module")
def packages(tmp_path_factory) -> dict[str, Path]:
    """Two small CPU packages whose kernel libraries differ: ``tiny`` (a convolution and
    a dense layer, with weights) and ``pool`` (a max pool, no weights)."""
    from edgecv.deploy import deploy
    from edgecv.pipelines import BuildOptions

    src = tmp_path_factory.mktemp("trust-src")
    small_net().save(str(src / "tiny-symbol.json"))
    mx.nd.save(
        str(src / "tiny-0000.params"), {k: mx.nd.array(v) for k, v in small_params().items()}
    )
    d = mx.sym.var("data")
    pool = mx.sym.Pooling(d, kernel=(2, 2), stride=(2, 2), pool_type="max")
    pool.save(str(src / "pool-symbol.json"))
    out = tmp_path_factory.mktemp("trust-packages")
    nchw = BuildOptions(layout="NCHW")  # no graph tuner: no test here reads layouts
    return {
        "tiny": deploy(
            src / "tiny-symbol.json", out / "tiny", input_shape=TINY_SHAPE, options=nchw
        ),
        "pool": deploy(
            src / "pool-symbol.json", out / "pool", input_shape=POOL_SHAPE, options=nchw
        ),
    }


def pin_of(package: Path) -> str:
    return hashlib.sha256((package / "manifest.json").read_bytes()).hexdigest()


def max_pool(x: np.ndarray) -> np.ndarray:
    n, c, h, w = x.shape
    return x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))


def test_deploy_prints_the_pin_and_run_holds_the_package_to_it(packages, tmp_path, capfd):
    """The CLI round trip: deploy prints the sha256 of the manifest; `run --sha256`
    runs the package it names and refuses, in one line naming both digests, another.
    The deploy in a process of its own, the runs through main() in this one."""
    src = tmp_path / "pool-symbol.json"
    mx.sym.Pooling(mx.sym.var("data"), kernel=(2, 2), stride=(2, 2), pool_type="max").save(str(src))
    out = tmp_path / "pkg"
    deployed = run_cli("deploy", src, "--input-shape", "1,3,8,8", "-o", out, "--archive")
    assert deployed.returncode == 0, deployed.stderr
    lines = [line for line in deployed.stdout.splitlines() if line.startswith("sha256 ")]
    assert len(lines) == 1, deployed.stdout
    assert lines[0].split()[-1] == pin_of(out)
    assert "--sha256" in lines[0]

    x = np.random.default_rng(0).normal(size=POOL_SHAPE).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    ran = cli_here(
        capfd, "run", out, "--input", tmp_path / "x.npy", "--sha256", pin_of(out).upper()
    )
    assert ran.returncode == 0, ran.stderr

    other = pin_of(packages["tiny"])
    refused = cli_here(capfd, "run", out, "--input", tmp_path / "x.npy", "--sha256", other)
    line = assert_one_error_line(refused, other)
    assert pin_of(out) in line
    # an archive is held to the pin before anything of it is written
    shutil.rmtree(out)
    refused = cli_here(
        capfd, "run", tmp_path / "pkg.tar.gz", "--input", tmp_path / "x.npy", "--sha256", other
    )
    assert_one_error_line(refused, other)
    assert not out.exists()
    bad = cli_here(
        capfd, "run", tmp_path / "pkg.tar.gz", "--input", tmp_path / "x.npy", "--sha256", "12ab"
    )
    assert_one_error_line(bad, "64 hex digits")


def test_a_tampered_self_consistent_package_loads_only_without_a_pin(packages, tmp_path):
    """Someone who can write the package can rewrite its manifest's checksums too: the
    package still loads unpinned (checksums catch damage, not tampering), and a pin
    taken at deploy refuses it."""
    original = packages["tiny"]
    pin = pin_of(original)
    tampered = tmp_path / "tiny"
    shutil.copytree(original, tampered)
    with np.load(tampered / "params.npz") as npz:
        weights = {k: -npz[k] for k in npz.files}
    with open(tampered / "params.npz", "wb") as f:
        np.savez(f, **weights)
    manifest = json.loads((tampered / "manifest.json").read_text())
    digest = hashlib.sha256((tampered / "params.npz").read_bytes()).hexdigest()
    manifest["files"]["params.npz"] = digest
    (tampered / "manifest.json").write_text(json.dumps(manifest, indent=2))

    x = np.random.default_rng(1).normal(size=TINY_SHAPE).astype(np.float32)
    honest = edgecv.load(original, sha256=pin).run(x)[0]
    assert not np.allclose(edgecv.load(tampered).run(x)[0], honest)
    with pytest.raises(PackageError) as refused:
        edgecv.load(tampered, sha256=pin)
    message = str(refused.value)
    assert pin in message and pin_of(tampered) in message
    assert len(message.splitlines()) == 1


def test_the_library_that_was_checked_is_the_library_loaded(packages, tmp_path, monkeypatch):
    """kernels/cpu.so replaced after its checksum was checked and before the dynamic
    loader opens it: the checked bytes still run (the swap is made at the last step
    before the library is loaded, the start of the TVM runtime's load)."""
    package = tmp_path / "tiny"
    shutil.copytree(packages["tiny"], package)
    x = np.random.default_rng(2).normal(size=TINY_SHAPE).astype(np.float32)
    expected = edgecv.load(packages["tiny"]).run(x)[0]
    runtime_load = cpu_runtime.load_tvm_runtime

    def swap_then_load(*args, **kwargs):
        shutil.copyfile(packages["pool"] / "kernels/cpu.so", package / "kernels/cpu.so")
        return runtime_load(*args, **kwargs)

    monkeypatch.setattr(cpu_runtime, "load_tvm_runtime", swap_then_load)
    model = edgecv.load(package)
    assert (package / "kernels/cpu.so").read_bytes() != (
        packages["tiny"] / "kernels/cpu.so"
    ).read_bytes()
    np.testing.assert_array_equal(model.run(x)[0], expected)


@pytest.mark.parametrize("planted", ["symlink", "world-writable folder"])
def test_a_folder_another_user_made_in_the_temp_dir_is_never_used(
    packages, tmp_path, monkeypatch, planted
):
    """Another local user makes `<temp dir>/edgecv-kernels-<uid>` before us (a link to a
    folder of theirs, or a folder anyone may write) holding a library under the name a
    redeployed package's kernels would be copied to: it never runs in our process, and
    nothing is written there."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    theirs = tmp_path / "attacker"
    theirs.mkdir()
    shared = temp / f"edgecv-kernels-{os.getuid()}"
    if planted == "symlink":
        shared.symlink_to(theirs)
        folder = theirs
    else:
        shared.mkdir()
        folder = shared
    os.chmod(folder, 0o777)

    package = tmp_path / "pkg"
    shutil.copytree(packages["tiny"], package)
    edgecv.load(package)  # loaded once: its path now holds the tiny kernels
    shutil.rmtree(package)
    shutil.copytree(packages["pool"], package)  # redeployed in place with other kernels
    digest = hashlib.sha256((package / "kernels/cpu.so").read_bytes()).hexdigest()
    plant = folder / f"cpu-{digest[:24]}.so"
    shutil.copyfile(packages["tiny"] / "kernels/cpu.so", plant)
    before = sorted(p.name for p in folder.iterdir())

    x = np.random.default_rng(3).normal(size=POOL_SHAPE).astype(np.float32)
    np.testing.assert_array_equal(edgecv.load(package).run(x)[0], max_pool(x))
    assert sorted(p.name for p in folder.iterdir()) == before
    assert plant.read_bytes() == (packages["tiny"] / "kernels/cpu.so").read_bytes()


LOADED_FROM = """
import json, os, sys, tempfile, edgecv
edgecv.load(sys.argv[1])
with open("/proc/self/maps") as maps:
    library = sorted({l.split()[-1] for l in maps if l.rstrip().endswith("/cpu.so")})[0]
folders, folder = [], os.path.dirname(library)
while folder != tempfile.gettempdir() and folder != "/":
    info = os.lstat(folder)
    folders.append([folder, info.st_uid, info.st_mode])
    folder = os.path.dirname(folder)
print(json.dumps({"library": library, "folders": folders}))
"""


def test_kernels_load_from_a_private_folder_removed_at_exit(packages):
    """Each process loads a package's library from a folder of its own: made for it
    (a new name each time), owned by its user, closed to everyone else, gone when the
    process ends."""
    env = {**os.environ, "PYTHONPATH": str(Path(edgecv.__file__).parent.parent)}
    seen = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", LOADED_FROM, str(packages["pool"])],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        loaded = json.loads(done.stdout.splitlines()[-1])
        assert Path(loaded["library"]).parent.parent.parent == Path(tempfile.gettempdir())
        for folder, uid, mode in loaded["folders"]:
            assert stat.S_ISDIR(mode) and uid == os.getuid(), (folder, uid, oct(mode))
            assert stat.S_IMODE(mode) == 0o700, (folder, oct(mode))
        seen.append(loaded["folders"][-1][0])
    assert seen[0] != seen[1]
    for folder in seen:
        assert not Path(folder).exists()


@pytest.mark.parametrize("command", [["bench", "--repeat", "1", "--warmup", "0"], ["demo"]])
def test_bench_and_demo_hold_the_package_to_its_pin(packages, tmp_path, command, capfd):
    """`bench` and `demo` load a package as `run` does: with `--sha256`, only the pinned
    one (refused in one line naming both digests, before anything of it runs)."""
    package, other = packages["pool"], pin_of(packages["tiny"])
    extra = (
        ["--images", tmp_path, "--headless", "-o", tmp_path / "out.mp4"]
        if command == ["demo"]
        else []
    )
    refused = cli_here(capfd, *command[:1], package, *command[1:], *extra, "--sha256", other)
    line = assert_one_error_line(refused, other)
    assert pin_of(package) in line
    if command[0] == "bench":  # the pinned package itself runs
        ran = cli_here(
            capfd, "bench", package, "--repeat", "1", "--warmup", "0", "--sha256", pin_of(package)
        )
        assert ran.returncode == 0, ran.stderr
