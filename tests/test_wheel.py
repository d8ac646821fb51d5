"""edgecv installed the way a user installs it: ``pip wheel --no-deps .``, the wheel
installed into a fresh venv on another path, the CLI run from a folder outside the
repository.

The venv's dependencies (TVM, MXNet, ...) come from this interpreter's site-packages
through a ``.pth`` line, because installing them from PyPI takes many minutes. A ``.pth``
line only adds a folder; the ``.pth`` files inside it (this checkout's editable install)
are not run, so the repository is on no path of the venv and everything edgecv reads
(its device profiles, its shipped tuning databases) must come from the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import mxnet_forward
from graph_tuner.small_model import SHAPE, export_small_model

from edgecv.testing import assert_close

REPO = Path(__file__).resolve().parent.parent
PROFILES = REPO / "device_profiles"
# What setuptools reads to build the wheel (pyproject.toml names the readme). Built from
# a copy: setuptools writes build/ and *.egg-info into the source folder, and files left
# in a checkout's build/lib/ by an older build would go into the wheel.
SOURCES = ("pyproject.toml", "setup.py", "README.md", "edgecv", "device_profiles")


@dataclass
class Installed:
    python: Path  # the venv's interpreter
    edgecv: Path  # the venv's console script
    site: Path  # the venv's site-packages, where the wheel went
    work: Path  # the working directory of every command: outside the repository
    env: dict[str, str]

    def run(self, *args) -> subprocess.CompletedProcess:
        done = subprocess.run(
            list(map(str, args)),
            capture_output=True,
            text=True,
            cwd=self.work,
            env=self.env,
            timeout=600,
        )
        assert done.returncode == 0, f"{args}\n{done.stdout}\n{done.stderr}"
        return done


def _run(*args, cwd: Path | None = None) -> None:
    done = subprocess.run(
        list(map(str, args)), capture_output=True, text=True, cwd=cwd, timeout=600
    )
    assert done.returncode == 0, f"{args}\n{done.stdout}\n{done.stderr}"


def build_wheel(folder: Path) -> Path:
    """edgecv's wheel, built from a copy of the sources in ``folder`` (building in the
    checkout would let a leftover ``build/`` put old files into it)."""
    source = folder / "source"
    for name in SOURCES:
        if (REPO / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(REPO / name, source / name, ignore=ignore)
        else:
            source.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    dist = folder / "dist"
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist, ".", cwd=source)
    (wheel,) = dist.glob("edgecv-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Installed:
    # Another path: a venv without pip (ensurepip alone takes 15 s), the wheel installed
    # into it by this pip (--python).
    venv = tmp_path_factory.mktemp("elsewhere") / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel)
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.check_output([python, "-c", purelib], text=True).strip())
    dependencies = sorted({sysconfig.get_paths()[key] for key in ("purelib", "platlib")})
    (site / "workstation-dependencies.pth").write_text("\n".join(dependencies) + "\n")

    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "EDGECV_PROFILES")
    }
    # a user with no cache and no tuning records of their own
    env["EDGECV_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    env["EDGECV_TUNING_DIR"] = str(tmp_path_factory.mktemp("tuning"))
    work = tmp_path_factory.mktemp("work")
    return Installed(python, venv / "bin" / "edgecv", site, work, env)


def test_the_edgecv_imported_is_the_wheels(installed):
    done = installed.run(
        installed.python,
        "-c",
        "import edgecv, json, sys; print(json.dumps([edgecv.__file__, sys.path]))",
    )
    file, path = json.loads(done.stdout)
    print(f"edgecv imported from {file}")
    assert Path(file) == installed.site / "edgecv" / "__init__.py"
    # the wheel's folder is the only one on the path that holds an edgecv package
    holding = [p for p in path if (installed.work / p / "edgecv" / "__init__.py").is_file()]
    assert holding == [str(installed.site)], holding


def test_profiles_lists_every_profile(installed):
    done = installed.run(installed.edgecv, "profiles")
    listed = [line.split()[0] for line in done.stdout.splitlines() if line.strip()]
    assert sorted(listed) == sorted(p.stem for p in PROFILES.glob("*.json")), done.stdout


def test_deploy_reads_the_shipped_database_and_the_package_runs(installed, tmp_path):
    symbol, params = export_small_model(tmp_path / "small")
    package = tmp_path / "pkg"
    # NCHW: the graph tuner's timings are not what this test is about (tests/graph_tuner)
    done = installed.run(
        installed.edgecv,
        "deploy",
        symbol,
        "--device",
        "cpu",
        "--input-shape",
        ",".join(map(str, SHAPE)),
        "-o",
        package,
        "--layout",
        "NCHW",
        "--explain",
    )
    manifest = json.loads((package / "manifest.json").read_text())
    read = manifest["build"]["tuning_databases"]

    # The shipped database of this machine's device class, as the installed edgecv finds it.
    where = (
        "from edgecv.profiles import load_profile; "
        "from edgecv.schedules.device_class import profile_class; "
        "print(profile_class(load_profile('cpu')).shipped_folder())"
    )
    shipped = Path(installed.run(installed.python, "-c", where).stdout.strip())
    assert shipped.is_relative_to(installed.site / "edgecv" / "device_profiles"), shipped
    if (PROFILES / "tuning" / shipped.name).is_dir():
        assert (shipped / "database_workload.json.gz").is_file(), shipped
        assert read == [str(shipped)], read
        assert f"tuning databases: {shipped}" in done.stdout, done.stdout
    else:  # this machine's CPU has no shipped database; the user's folder is empty
        assert read == [], read

    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    installed.run(
        installed.edgecv,
        "run",
        package,
        "--input",
        tmp_path / "x.npy",
        "--output",
        tmp_path / "y.npz",
    )
    assert_close(np.load(tmp_path / "y.npz")["output0"], mxnet_forward(symbol, params, x)[0])
