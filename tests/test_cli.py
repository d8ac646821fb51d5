"""The CLI end to end: deploy a zoo model, run it on a real photo and on a raw tensor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import mxnet_forward, random_input
from helpers import cli_here

from edgecv import load as edgecv_load
from edgecv.cli import main
from edgecv.testing import assert_close


@pytest.fixture(scope="module")
def mobilenet_package(tmp_path_factory):
    """The package every test here reads. `--layout packed` packs every convolution
    without timing kernels to choose layouts (most of a deploy's time); `--layout auto`
    from the command line is tests/graph_tuner/test_cli_layout.py's."""
    out = tmp_path_factory.mktemp("cli") / "mobilenet-cpu"
    argv = ["deploy", "mobilenet", "--random-weights", "--device", "cpu", "--layout", "packed"]
    assert main([*argv, "-o", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def mobilenet_probabilities(exported):
    """MXNet's class probabilities for the package's network: the zoo model exported with
    the same seeded random weights `deploy --random-weights` gave it (the session's export,
    seed 0, which test_run_on_tensor_writes_outputs_matching_mxnet reads too)."""
    model = exported("mobilenet1.0")

    def probabilities(x: np.ndarray) -> np.ndarray:
        (logits,) = mxnet_forward(model.symbol_path, model.params_path, x)
        e = np.exp(logits[0] - logits[0].max())
        return e / e.sum()

    return probabilities


def assert_top_k_is_mxnets(
    printed: list[tuple[str, float]], probs: np.ndarray, classes, atol: float
) -> None:
    """The classes and probabilities a user sees are MXNet's top k for the same input,
    probabilities within ``atol``, classes wherever MXNet's own probabilities are not
    within ``atol`` of another's (random weights give near-uniform probabilities)."""
    order = np.argsort(-probs)[: len(printed)]
    np.testing.assert_allclose([p for _, p in printed], probs[order], atol=atol)
    for rank, (label, _) in enumerate(printed):
        tied = np.sum(np.abs(probs - probs[order[rank]]) <= atol) > 1
        if not tied:
            assert label == classes[order[rank]], (rank, label, classes[order[rank]])


def test_manifest_describes_the_model(mobilenet_package):
    manifest = json.loads((mobilenet_package / "manifest.json").read_text())
    assert manifest["model"]["name"] == "mobilenet1.0"
    assert manifest["model"]["weights"] == "random(seed=0)"
    assert manifest["profile"]["name"] == "cpu"
    assert manifest["inputs"] == [{"name": "data", "shape": [1, 3, 224, 224], "dtype": "float32"}]
    assert manifest["outputs"][0]["shape"] == [1, 1000]
    assert len(manifest["classes"]) == 1000 and manifest["classes"][0] == "tench"
    # the CPU kernels and TVM's runtime library they call back into (the board has no TVM)
    assert set(manifest["files"]) == {
        "plan.json",
        "params.npz",
        "kernels/cpu.so",
        "kernels/libtvm_runtime.so",
    }
    assert manifest["versions"]["tvm"].startswith("0.27")
    build = manifest["build"]
    assert build["intermediate_bytes"] <= 1.3 * build["live_bytes_lower_bound"]


def test_run_on_tensor_writes_outputs_matching_mxnet(mobilenet_package, exported, tmp_path, capsys):
    x = random_input((1, 3, 224, 224), seed=3)
    np.save(tmp_path / "x.npy", x)
    assert (
        main(
            [
                "run",
                str(mobilenet_package),
                "--input",
                str(tmp_path / "x.npy"),
                "--output",
                str(tmp_path / "y.npz"),
                "--repeat",
                "1",
            ]
        )
        == 0
    )
    assert "latency" in capsys.readouterr().out
    ours = np.load(tmp_path / "y.npz")
    assert ours.files == ["output0"]
    # The zoo export is deterministic for a seed, so the test session's export has the
    # same weights as the package.
    model = exported("mobilenet1.0")
    ref = mxnet_forward(model.symbol_path, model.params_path, x)[0]
    assert_close(ours["output0"], ref, "mobilenet1.0 via the CLI")


def test_run_on_sample_photo_prints_mxnets_top5(mobilenet_package, mobilenet_probabilities, capfd):
    # in this process: the next test runs the same command as a process of its own
    result = cli_here(capfd, "run", mobilenet_package, "--sample", "chelsea", "--repeat", "1")
    assert result.returncode == 0, result.stderr
    lines = [
        line
        for line in result.stdout.splitlines()
        if line.startswith("  ") and "latency" not in line
    ]
    assert len(lines) == 5
    printed = [(line.split(maxsplit=1)[1].strip(), float(line.split()[0])) for line in lines]
    from edgecv.commands.run import sample_photo

    model = edgecv_load(mobilenet_package)
    x = model.preprocess(sample_photo("chelsea"))
    # printed with 4 decimals (0.0015 each, for random weights): the values, not the order
    assert_top_k_is_mxnets(printed, mobilenet_probabilities(x), model.classes, atol=2e-4)


def test_the_sample_photo_is_never_written_to_a_shared_temp_folder(mobilenet_package, tmp_path):
    """``--sample`` once wrote ``<tmp>/edgecv-sample-NAME.jpg`` in place: a link another
    user planted there had its target overwritten, and two runs at once could read a
    half-written photo. The photo is now decoded in memory: the temp folder stays as it was."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("a file the user running edgecv owns")
    (shared / "edgecv-sample-chelsea.jpg").symlink_to(victim)
    env = {**os.environ, "TMPDIR": str(shared)}
    done = subprocess.run(
        [sys.executable, "-m", "edgecv.cli", "run", str(mobilenet_package)]
        + ["--sample", "chelsea", "--repeat", "1"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("chelsea (scikit-image's sample photo):"), done.stdout
    assert victim.read_text() == "a file the user running edgecv owns"
    assert sorted(p.name for p in shared.iterdir()) == ["edgecv-sample-chelsea.jpg"]


def test_profiles_lists_every_profile_with_its_backend_and_device(capsys):
    """One line per profile file shipped: its name, the runtime its packages use and the
    device it describes, as `deploy --device NAME` will use them."""
    from edgecv.profiles import load_profile

    assert main(["profiles"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line}
    shipped = Path(__file__).parent.parent / "device_profiles"
    names = sorted(f.stem for f in shipped.glob("*.json"))
    assert sorted(lines) == names
    for name in names:
        profile = load_profile(name)
        assert lines[name].split()[1] == profile.runtime, lines[name]
        assert profile.raw["description"] in lines[name], lines[name]


def test_camera_demo_script_calls_edgecv_demo(mobilenet_package, tmp_path):
    import cv2
    import skimage.data

    frames = tmp_path / "frames"
    frames.mkdir()
    cv2.imwrite(str(frames / "a.jpg"), skimage.data.astronaut()[:, :, ::-1])
    cv2.imwrite(str(frames / "b.jpg"), skimage.data.astronaut()[:, :, ::-1])
    out = tmp_path / "annotated.mp4"
    script = Path(__file__).parent.parent / "demos" / "camera.py"
    argv = [str(mobilenet_package), "--images", str(frames), "--headless", "-o", str(out)]
    result = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    capture = cv2.VideoCapture(str(out))
    assert int(capture.get(cv2.CAP_PROP_FRAME_COUNT)) == 2
    assert (capture.get(cv2.CAP_PROP_FRAME_HEIGHT), capture.get(cv2.CAP_PROP_FRAME_WIDTH)) == (
        512.0,
        512.0,
    )


def test_archived_package_loads(tmp_path):
    from test_bad_input import small_net, small_params

    from edgecv._mxnet import import_mxnet
    from edgecv.board.model import load

    mx = import_mxnet()
    prefix = tmp_path / "tiny"
    small_net().save(f"{prefix}-symbol.json")
    mx.nd.save(f"{prefix}-0000.params", {k: mx.nd.array(v) for k, v in small_params().items()})
    out = tmp_path / "pkg"
    argv = [
        "deploy",
        f"{prefix}-symbol.json",
        "--input-shape",
        "1,2,5,5",
        "--layout",
        "NCHW",  # no graph tuner: the archive is what this test reads
        "-o",
        str(out),
        "--archive",
    ]
    assert main(argv) == 0
    archive = tmp_path / "pkg.tar.gz"
    assert archive.is_file()
    import shutil

    shutil.rmtree(out)
    model = load(archive)
    x = np.random.RandomState(4).normal(size=(1, 2, 5, 5)).astype(np.float32)
    ref = mxnet_forward(f"{prefix}-symbol.json", f"{prefix}-0000.params", x)[0]
    assert_close(model.run(x)[0], ref, "archived package vs MXNet")


def test_public_load_api_predicts_mxnets_top_classes(mobilenet_package, mobilenet_probabilities):
    import skimage.data

    import edgecv

    model = edgecv.load(mobilenet_package)
    assert model.task == "classification" and model.input_shape == (1, 3, 224, 224)
    image = skimage.data.coffee()[:, :, ::-1].copy()
    top = model.predict(image, k=3)
    probs = mobilenet_probabilities(model.preprocess(image))
    assert_top_k_is_mxnets(top, probs, model.classes, atol=1e-6)  # 1.3e-5 apart here
