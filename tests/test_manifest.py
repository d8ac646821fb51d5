"""The manifest's one owner (edgecv.board.manifest): what it writes is the JSON packages have
always held, key for key, and what it reads comes back typed."""

from __future__ import annotations

import json

import pytest

from edgecv import __version__
from edgecv.board.errors import PackageError
from edgecv.board.manifest import FORMAT, FORMAT_VERSION, Manifest, Tensor
from edgecv.board.precision import Precision

MODEL = {
    "name": "tiny",
    "task": "classification",
    "weights": "random",
    "symbol": "tiny-symbol.json",
    "source": {"kind": "zoo", "name": "tiny"},
}
PROFILE = {"name": "cpu", "description": "this machine", "runtime": "cpu"}
PREPROCESSING = {
    "color": "RGB",
    "scale": 1 / 255,
    "mean": [0.485, 0.456, 0.406],
    "std": [0.229, 0.224, 0.225],
    "resize": "stretch",
}
BUILD = {"kernels": {"cpu": "kernels/cpu.so"}, "precision": "fp32", "launches": 3}
VERSIONS = {"edgecv": __version__, "tvm": "0.27.0"}
FILES = {"kernels/cpu.so": "2" * 64, "params.npz": "1" * 64, "plan.json": "0" * 64}


def made(classes=(), sections=None) -> Manifest:
    """A manifest as deploy makes it and the package writer seals it."""
    return Manifest.new(
        model=MODEL,
        profile=PROFILE,
        inputs=[Tensor("data", (1, 3, 8, 8), "float32")],
        outputs=[Tensor("out", (1, 10), "float32")],
        classes=list(classes),
        sections=sections or {"preprocessing": PREPROCESSING},
        build=BUILD,
        versions=VERSIONS,
    ).sealed(FILES)


def test_the_manifest_is_written_as_packages_always_held_it():
    """Byte for byte the JSON of the dict deploy wrote before the manifest had an owner
    (classes from the processing sections replacing the source's in its place)."""
    sections = {"preprocessing": PREPROCESSING, "classes": ["cat", "dog"]}
    before = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model": MODEL,
        "profile": PROFILE,
        "inputs": [{"name": "data", "shape": [1, 3, 8, 8], "dtype": "float32"}],
        "outputs": [{"name": "out", "shape": [1, 10], "dtype": "float32"}],
        "classes": [],
        **sections,
        "versions": VERSIONS,
        "build": BUILD,
        "files": FILES,
    }
    assert made([], sections).to_json() == json.dumps(before, indent=2)
    assert list(before)[6:8] == ["classes", "preprocessing"]


def test_a_checked_manifest_reads_typed(tmp_path):
    manifest = Manifest.checked(json.loads(made(["cat", "dog"]).to_json()), tmp_path)
    assert manifest.inputs == (Tensor("data", (1, 3, 8, 8), "float32"),)
    assert manifest.input_shape == (1, 3, 8, 8)
    assert [t.name for t in manifest.outputs] == ["out"]
    assert manifest.kernels == {"cpu": "kernels/cpu.so"}
    assert manifest.loaded_files == ["plan.json", "params.npz", "kernels/cpu.so"]
    assert manifest.precision is Precision.FP32
    assert manifest.model_name == "tiny" and manifest.task == "classification"
    assert manifest.source == {"kind": "zoo", "name": "tiny"}
    assert (manifest.profile_name, manifest.runtime, manifest.gpu) == ("cpu", "cpu", {})
    assert manifest.classes == ["cat", "dog"] and manifest.launches == 3
    assert manifest.files == FILES
    # a package without a decoder section decodes as its task did (logits' top-k)
    assert manifest.processing(tmp_path).decoder.kind == "logits"


def test_a_build_without_precision_is_fp32_and_an_unknown_one_is_refused(tmp_path):
    raw = json.loads(made().to_json())
    del raw["build"]["precision"]  # packages made before it was recorded
    assert Manifest.checked(raw, tmp_path).precision is Precision.FP32
    raw["build"]["precision"] = "int4"
    with pytest.raises(PackageError, match=r"`build.precision` should be one of fp32, int8"):
        Manifest.checked(raw, tmp_path)


def test_code_that_read_the_manifest_as_a_dict_still_reads_it(tmp_path):
    """``model.manifest["build"]`` worked while the manifest was a plain dict: its
    sections still read by key, and nothing can be written through it."""
    manifest = Manifest.checked(json.loads(made(["cat"]).to_json()), tmp_path)
    assert manifest["build"]["precision"] == "fp32"
    assert manifest.get("classes") == ["cat"] and manifest.get("absent", 7) == 7
    assert "versions" in manifest and "absent" not in manifest
    with pytest.raises(TypeError):
        manifest["build"] = {}
