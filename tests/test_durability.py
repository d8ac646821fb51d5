"""Durability (issue 49, item 8, and its fault-injection test): what edgecv writes
survives a kill or a power loss, and what a user had before is never lost.

Kills are real: a process is sent SIGKILL, either at a chosen point (a child that kills
itself right after its first rename, the window between a deploy's two renames) or
after a seeded random delay, and the next command must work or say exactly what to do.
A power loss cannot be made here; what it needs (each file fsynced before its rename,
its folder after) is read from the calls themselves, and damage it leaves behind (a
flipped or torn cache entry) is written by hand.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_error_line, run_cli
from test_run_faults import SHAPE, quick_package, tiny_model, x_of

import edgecv
from edgecv.board.errors import PackageError
from edgecv.board.manifest import Manifest
from edgecv.board.package import PackageWriter, archive
from edgecv.board.runtime import kernel_cache

REPO = Path(__file__).resolve().parent.parent

# A deploy's last stage in a child process: the files of ``source`` written to a
# PackageWriter for ``destination`` and committed, over and over (``loop``), or once,
# the child killing itself when a point is reached (``die-at-commit``,
# ``die-after-rename``) or waiting there to be killed (``wait-at-commit``).
REWRITE = r"""
import json, os, signal, sys, time
from pathlib import Path
from edgecv.board.manifest import Manifest
from edgecv.board.package import PackageWriter

source, destination, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
manifest = json.loads((source / "manifest.json").read_text())
files = manifest.pop("files")
del manifest["format"], manifest["format_version"]
if mode == "die-after-rename":
    rename = Path.rename

    def rename_then_die(self, target):
        result = rename(self, target)
        os.kill(os.getpid(), signal.SIGKILL)

    Path.rename = rename_then_die
print("started", flush=True)
while True:
    writer = PackageWriter(destination, force=True)
    for relative in files:
        writer.path(relative).write_bytes((source / relative).read_bytes())
    if mode == "die-at-commit":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "wait-at-commit":
        print("waiting", flush=True)
        time.sleep(600)
    writer.commit(Manifest(manifest))
    if mode != "loop":
        break
"""


def rewrite(source: Path, destination: Path, mode: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", REWRITE, str(source), str(destination), mode],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def killed_by_itself(child: subprocess.Popen) -> None:
    assert child.wait(timeout=120) == -signal.SIGKILL


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return quick_package("cpu", tmp_path_factory)


@pytest.fixture(scope="module")
def reference(package):
    return [np.asarray(o) for o in edgecv.load(package).run(x_of(0))]


def assert_loads_and_runs(path: Path, reference: list[np.ndarray], rebuilt=False) -> None:
    """The package at ``path`` computes ``reference`` (the same package: exactly; one
    deployed again, whose schedules may differ: to float32 rounding)."""
    outputs = edgecv.load(path).run(x_of(0))
    for got, expected in zip(outputs, reference, strict=True):
        np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5 if rebuilt else 0)


# -- the compiled-program cache ---------------------------------------------------------


def test_a_damaged_cache_entry_is_built_again_not_loaded(tmp_path, monkeypatch):
    """A cubin whose bytes changed on disk (a flipped bit, a torn write after a power
    loss) is never handed to the driver: every later load would fail on it. It is
    deleted and built again, as OpenCL's cache forgets an entry its driver refuses."""
    monkeypatch.setenv("EDGECV_CACHE_DIR", str(tmp_path))
    builds = []

    def build() -> bytes:
        builds.append(1)
        return b"\x7fELF" + bytes(range(256)) * 8

    parts = ("cuda", "__global__ void k() {}", "sm_87", "13.0")
    first = kernel_cache.get_or_build(parts, "cubin", build)
    assert kernel_cache.get_or_build(parts, "cubin", build) == first and len(builds) == 1
    (entry,) = tmp_path.iterdir()
    for damage in ("flipped", "torn"):
        data = bytearray(entry.read_bytes())
        if damage == "flipped":
            data[-100] ^= 0x10
        else:
            data = data[: len(data) // 2]
        entry.write_bytes(bytes(data))
        assert kernel_cache.get_or_build(parts, "cubin", build) == first, damage
        assert kernel_cache.get_or_build(parts, "cubin", build) == first, damage
    assert len(builds) == 3  # once, then once after each damage


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_a_damaged_cubin_in_the_cache_is_compiled_again(tmp_path, monkeypatch):
    """The same through nvcc: a source-only CUDA package's cubin, cached, damaged."""
    monkeypatch.setenv("EDGECV_CACHE_DIR", str(tmp_path))
    source = 'extern "C" __global__ void twice(float* y) { y[threadIdx.x] *= 2.0f; }\n'
    cubin = kernel_cache.compile_cuda_cached(source, "sm_87")
    assert cubin[:4] == b"\x7fELF"
    (entry,) = tmp_path.iterdir()
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.write_bytes(bytes(data))
    assert kernel_cache.compile_cuda_cached(source, "sm_87") == cubin


def sync_log(monkeypatch) -> list[tuple[str, str]]:
    """("fsync", path) and ("replace"/"rename", new path) as they happen."""
    events: list[tuple[str, str]] = []
    fsync, replace, rename = os.fsync, os.replace, os.rename

    def logged_fsync(fd: int) -> None:
        events.append(("fsync", os.path.realpath(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def logged(kind, real):
        def call(source, target, **kwargs):
            events.append((kind, os.path.realpath(source)))
            real(source, target, **kwargs)
            events.append((f"{kind}d to", os.path.realpath(target)))

        return call

    monkeypatch.setattr(os, "fsync", logged_fsync)
    monkeypatch.setattr(os, "replace", logged("replace", replace))
    monkeypatch.setattr(os, "rename", logged("rename", rename))
    return events


def test_cache_entries_are_synced_before_their_rename_and_their_folder_after(tmp_path, monkeypatch):
    """Renamed but never fsynced, an entry may be empty after a power loss."""
    monkeypatch.setenv("EDGECV_CACHE_DIR", str(tmp_path / "cache"))
    events = sync_log(monkeypatch)
    kernel_cache.write("ab" * 32, "cubin", b"a cubin")
    entry = os.path.realpath(kernel_cache.entry_path("ab" * 32, "cubin"))
    (i,) = [k for k, e in enumerate(events) if e == ("replaced to", entry)]
    temporary = events[i - 1][1]
    assert ("fsync", temporary) in events[: i - 1], events
    assert ("fsync", os.path.dirname(entry)) in events[i:], events


# -- packages: the swap, its staging, the archive ----------------------------------------


def test_a_package_is_synced_before_it_is_renamed_into_place(package, tmp_path, monkeypatch):
    events = sync_log(monkeypatch)
    destination = tmp_path / "pkg"
    child_files = sorted(p.relative_to(package) for p in package.rglob("*") if p.is_file())
    writer = PackageWriter(destination)
    for relative in child_files:
        writer.path(str(relative)).write_bytes((package / relative).read_bytes())
    writer.commit(Manifest({"model": {"name": "tiny"}}))
    into_place = ("renamed to", os.path.realpath(destination))
    (moved,) = [k for k, e in enumerate(events) if e == into_place]
    synced = [path for kind, path in events[:moved] if kind == "fsync"]
    for relative in child_files:  # synced where they were written, before the rename
        assert any(path.endswith(os.sep + str(relative)) for path in synced), relative
    assert ("fsync", os.path.realpath(tmp_path)) in events[moved:], events


@pytest.mark.parametrize("then", ["load", "deploy"])
def test_a_deploy_killed_between_its_two_renames_loses_nothing(
    package, reference, tmp_path, capfd, then
):
    """`deploy --force` moves the old package aside, then the new one in: killed in
    between, nothing is at -o. The next load of it, or the next deploy beside it, puts
    the old package back and says so in one line."""
    destination = tmp_path / "pkg"
    shutil.copytree(package, destination)
    killed_by_itself(rewrite(package, destination, "die-after-rename"))
    assert not destination.exists()  # the old package was aside when the kill came
    capfd.readouterr()
    if then == "load":
        assert_loads_and_runs(destination, reference)
    else:
        with pytest.raises(PackageError, match="pass --force to replace it"):
            PackageWriter(destination)  # the restored package is there to be refused
        assert_loads_and_runs(destination, reference)
    restored = [line for line in capfd.readouterr().err.splitlines() if "restored" in line]
    assert restored == [f"[edgecv] restored {destination}, which a killed deploy had moved aside"]
    assert os.listdir(tmp_path) == ["pkg"]  # the killed deploy's staging folder is gone


def test_staging_folders_of_killed_deploys_are_cleaned_and_nothing_else(package, tmp_path):
    """A deploy killed before its commit leaves its staging folder: the next deploy
    into the same folder removes it, and leaves alone a running deploy's and any
    folder edgecv did not mark, whatever its name."""
    running = rewrite(package, tmp_path / "b", "wait-at-commit")
    try:
        assert running.stdout.readline() == "started\n"
        assert running.stdout.readline() == "waiting\n"
        dead = rewrite(package, tmp_path / "a", "die-at-commit")
        killed_by_itself(dead)
        left = set(os.listdir(tmp_path))
        assert len(left) == 2 and all(name.startswith((".a.", ".b.")) for name in left)
        killed = next(name for name in left if name.startswith(".a."))
        # named as edgecv names them, after a process that is gone, but not marked
        users = [tmp_path / f".a.edgecv-{dead.pid}-mine", tmp_path / f".c{killed[2:]}"]
        for folder in users:
            folder.mkdir()
            (folder / "notes.txt").write_text("mine")
        PackageWriter(tmp_path / "d").abort()
        assert killed not in os.listdir(tmp_path)
        assert left - {killed} <= set(os.listdir(tmp_path))  # the running deploy's
        for folder in users:
            assert (folder / "notes.txt").read_text() == "mine"
    finally:
        running.kill()
        running.wait()
    PackageWriter(tmp_path / "d").abort()  # now that one is a killed deploy's too
    assert sorted(os.listdir(tmp_path)) == sorted(f.name for f in users)


def test_archive_force_replaces_the_archive_whole(package, tmp_path, monkeypatch):
    """`archive --force` wrote over the old archive in place: a full disk (or a kill)
    midway left neither the old archive nor a new one."""
    folder = shutil.copytree(package, tmp_path / "pkg")
    out = archive(folder)
    before = out.read_bytes()

    def full_disk(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patch:
        patch.setattr(tarfile.TarFile, "addfile", full_disk)
        with pytest.raises(PackageError, match="No space left on device; the archive there is"):
            archive(folder, force=True)
    assert out.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["pkg", "pkg.tar.gz"]  # no temporary left
    inode = out.stat().st_ino
    assert archive(folder, force=True) == out and out.stat().st_ino != inode


# -- fault injection: processes killed at random points ---------------------------------


def kill_after(command: list[str], delay: float, env: dict | None = None) -> None:
    """Run ``command`` and SIGKILL it after ``delay`` seconds (if it still runs)."""
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        child.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        child.kill()
    child.wait()


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "edgecv.cli", *args]


def assert_works_or_says_what_to_do(result: subprocess.CompletedProcess, fragment: str):
    if result.returncode != 0:
        assert_one_error_line(result, fragment)


def test_killed_writes_and_runs_at_random_points_lose_nothing(package, reference, tmp_path):
    """A deploy's writing stage and `edgecv run` killed at seeded random points, again
    and again: after each kill the package the user had loads and computes what it did,
    and the next deploy leaves no staging folder behind."""
    rng = random.Random(49)
    destination = tmp_path / "out" / "pkg"
    shutil.copytree(package, destination)
    for _ in range(8):  # a commit takes about 0.15 s: kills land all over the first few
        child = rewrite(package, destination, "loop")
        assert child.stdout.readline() == "started\n"
        time.sleep(rng.uniform(0.0, 0.6))
        child.kill()
        child.wait()
        assert_loads_and_runs(destination, reference)
    PackageWriter(destination, force=True).abort()
    assert os.listdir(destination.parent) == ["pkg"]
    np.save(tmp_path / "x.npy", x_of(0))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = ("run", str(destination), "--input", str(tmp_path / "x.npy"))
    for _ in range(3):
        kill_after(cli(*run, "--output", str(tmp_path / "y.npz")), rng.uniform(0.5, 4.0), env)
    result = run_cli(*run, "--output", tmp_path / "y.npz")
    assert result.returncode == 0, result.stderr
    with np.load(tmp_path / "y.npz") as saved:
        np.testing.assert_array_equal(saved["output0"], reference[0])


@pytest.mark.heavy
@pytest.mark.parametrize("seed", [0, 1])
def test_deploy_tune_and_run_killed_at_random_points(package, reference, tmp_path, seed):
    """The whole commands, compiling and tuning, killed at random points: the package
    the user had still loads (or is put back), a tuning database a killed tune left is
    read by the next tune and deploy, or refused with one line saying what to do, and
    the next deploy completes and leaves nothing of the killed ones behind."""
    rng = random.Random(seed)
    symbol, params = tiny_model(tmp_path / "model")
    destination, db = tmp_path / "out" / "pkg", tmp_path / "db"
    shutil.copytree(package, destination)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    model = (str(symbol), "--params", str(params), "--input-shape", ",".join(map(str, SHAPE)))
    deploy = ("deploy", *model, "--layout", "NCHW", "-o", str(destination), "--force")
    tune = ("tune", *model, "--trials", "2", "--tasks", "1", "--db", str(db))
    for _ in range(2):
        kill_after(cli(*deploy), rng.uniform(1.0, 25.0), env)
        assert_loads_and_runs(destination, reference, rebuilt=True)
        kill_after(cli(*tune), rng.uniform(2.0, 50.0), env)
        kill_after(cli("run", str(destination), "--sample", "chelsea"), rng.uniform(0.5, 4), env)
    assert_works_or_says_what_to_do(run_cli(*tune, "--resume"), "")
    result = run_cli(*deploy, "--db", str(db))
    assert result.returncode == 0, result.stderr
    assert_loads_and_runs(destination, reference, rebuilt=True)
    assert os.listdir(destination.parent) == ["pkg"]
    assert run_cli("run", destination, "--sample", "chelsea").returncode == 0


class _Unsaveable:
    """An array-like whose conversion fails: np.savez has written the members before it."""

    def __array__(self, dtype=None, copy=None):
        raise RuntimeError("conversion failed")


def test_run_outputs_are_replaced_whole_or_not_at_all(tmp_path):
    """`edgecv run --output`/`--save` write beside the old file and rename over it: a
    write that stops midway (here an array that cannot be converted, after another was
    written; in the field a kill) leaves the earlier result as it was, not half a file."""
    from edgecv.board.outputs import save_arrays, save_image

    earlier = {"scores": np.arange(1000, dtype=np.float32)}
    path = save_arrays(tmp_path / "result.npz", earlier)
    before = path.read_bytes()
    with pytest.raises(RuntimeError, match="conversion failed"):
        save_arrays(path, {"boxes": np.ones((50000, 4), np.float32), "bad": _Unsaveable()})
    assert path.read_bytes() == before
    np.testing.assert_array_equal(np.load(path)["scores"], earlier["scores"])
    assert [p.name for p in tmp_path.iterdir()] == ["result.npz"]  # no temporary left

    image = np.full((8, 8, 3), 200, np.uint8)
    save_image(tmp_path / "boxes.png", image)
    import cv2

    np.testing.assert_array_equal(cv2.imread(str(tmp_path / "boxes.png")), image)


# Extracts a package archive with the extraction stopped by SIGKILL after its files are
# written and before the folder is renamed into place (a kill or a power loss mid-load).
KILLED_EXTRACTION = """
import os, signal, sys, tarfile
from pathlib import Path
from edgecv.board.package import unpack_if_archive

extract = tarfile.TarFile.extractall

def extract_then_die(self, *args, **kwargs):
    extract(self, *args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)

tarfile.TarFile.extractall = extract_then_die
unpack_if_archive(Path(sys.argv[1]))
"""


def test_an_extraction_killed_midway_leaves_nothing_the_next_load_keeps(package, tmp_path):
    """A `.tar.gz` is extracted in a marked staging folder beside it: one a killed load
    left behind is removed by the next load (or deploy) there, which then extracts the
    package whole; before, the half-extracted folder stayed beside the archive for good."""
    folder = tmp_path / "copy"
    shutil.copytree(package, folder)
    tarred = archive(folder)
    shutil.rmtree(folder)
    child = subprocess.run([sys.executable, "-c", KILLED_EXTRACTION, str(tarred)], timeout=120)
    assert child.returncode == -signal.SIGKILL
    assert not folder.exists()
    assert len(list(tmp_path.iterdir())) == 2  # the archive and the killed staging folder
    model = edgecv.load(tarred)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([tarred.name, folder.name])
    assert model.run(x_of(0))
