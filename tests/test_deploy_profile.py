"""``deploy(profile=)``: the profile a package is built for, by name or already loaded;
``device=``, its old name, still works for one release with a warning; ``edgecv deploy``
reads the profile once for the device check, the tuning databases and the build."""

from __future__ import annotations

import pytest

import edgecv.deploy
import edgecv.profiles
from edgecv.board.errors import ModelNotFoundError, ProfileError
from edgecv.cli import main
from edgecv.deploy import deploy


def test_a_cli_deploy_reads_its_profile_once(monkeypatch, tmp_path, capsys):
    """Every reader of the profile gets the one the command loaded (it was read three
    times: for --on, for the tuning databases and by deploy())."""
    read = []
    load = edgecv.profiles.load_profile

    def counted(name):
        read.append(name)
        return load(name)

    monkeypatch.setattr(edgecv.profiles, "load_profile", counted)
    monkeypatch.setattr(edgecv.deploy, "load_profile", counted)
    missing = tmp_path / "missing.onnx"  # refused after the profile is read
    assert main(["deploy", str(missing), "--device", "cpu", "-o", str(tmp_path / "p")]) == 2
    assert "missing.onnx" in capsys.readouterr().err
    assert read == ["cpu"]


def test_device_is_the_old_name_of_profile_and_warns_at_the_caller(tmp_path):
    with pytest.warns(DeprecationWarning, match=r"deploy\(profile=\)") as warned:
        with pytest.raises(ProfileError, match="unknown device profile `no-such`"):
            deploy(tmp_path / "m.onnx", tmp_path / "p", device="no-such")
    assert warned[0].filename == __file__  # the line to change, not edgecv's


def test_profile_and_device_together_are_refused(tmp_path):
    with pytest.warns(DeprecationWarning), pytest.raises(ProfileError, match="not both"):
        deploy(tmp_path / "m.onnx", tmp_path / "p", profile="cpu", device="cpu")


def test_profile_takes_a_name_or_a_loaded_profile(tmp_path):
    """The profile is read before the model: a name and a Profile get as far as the
    missing model file."""
    for profile in ("cpu", edgecv.profiles.load_profile("cpu")):
        with pytest.raises(ModelNotFoundError):
            deploy(tmp_path / "m.onnx", tmp_path / "p", profile=profile)
