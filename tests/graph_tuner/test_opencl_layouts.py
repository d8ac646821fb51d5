"""Packed layouts on OpenCL: the GPU packed conv rule, in a whole model, on Intel's
runtime (DeepLens: NCHW16c, a subgroup per channel block) and PoCL (aiSage: NCHW4c)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import mxnet_forward, pocl_unusable
from small_model import SHAPE, export_small_model
from test_opencl import device_or_skip

import edgecv
from edgecv.deploy import deploy
from edgecv.pipelines import BuildOptions
from edgecv.testing import assert_close

# rows of 11 (prime, wider than a work-item's tile of 8): the last tile predicated
PRIME = (1, 3, 11, 11)


def skip_without_pocl():
    """Skip, naming the reason, where PoCL cannot run here (``needs_pocl()`` is a mark,
    and called in a test's body it skipped nothing)."""
    reason = pocl_unusable()
    if reason is not None:
        pytest.skip(reason)


@pytest.mark.parametrize(
    ("profile", "on", "shape"),
    [
        # the same model at the size of the small model's other tests: the prime width
        # below packs the same convolutions with the same rule (predicated, too)
        pytest.param("deeplens", "intel", SHAPE, marks=pytest.mark.heavy, id="deeplens-intel"),
        pytest.param("deeplens", "intel", PRIME, id="deeplens-intel-prime-width"),
        pytest.param("aisage", "pocl", SHAPE, marks=pytest.mark.heavy),
    ],
)
def test_packed_model_on_opencl_matches_mxnet(profile, on, shape, tmp_path):
    if on == "pocl":
        skip_without_pocl()
    else:
        device_or_skip("intel(r) opencl")
    symbol, params = export_small_model(tmp_path / "small")
    path = deploy(
        str(symbol),
        tmp_path / "pkg",
        profile,
        params=str(params),
        input_shape=shape,
        host="native",
        options=BuildOptions(layout="packed"),
    )
    build = json.loads((path / "manifest.json").read_text())["build"]
    packed = [k for k in build["schedules"]["gpu"]["kernels"].values() if "NCHWc" in str(k["ops"])]
    assert packed and all(k["rule"] == "gpu.PackedConv2D" for k in packed), packed
    assert build["placement"]["launches"]["cpu"] == 0
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    got = edgecv.load(path, on=on).run(x)[0]
    assert_close(got, mxnet_forward(symbol, params, x)[0], name=f"packed on {profile}")


@pytest.mark.parametrize("memory_share", [None, 0.0], ids=["one-group", "a-kernel-per-group"])
def test_auto_on_opencl_measures_on_the_device_and_matches_mxnet(
    tmp_path, monkeypatch, memory_share
):
    """`auto` on Intel's runtime times every candidate kernel on the device (no fallback
    to NCHW: the meter's buffers live as long as its kernels, also when it times them a
    group at a time) and the plan it applies gives MXNet's numbers."""
    from edgecv.graph_tuner import measure

    device_or_skip("intel(r) opencl")
    if memory_share is not None:
        monkeypatch.setattr(measure, "MEMORY_SHARE", memory_share)
    symbol, params = export_small_model(tmp_path / "small")
    options = BuildOptions(layout="auto", layout_costs=tmp_path / "costs")
    path = deploy(
        str(symbol),
        tmp_path / "pkg",
        "deeplens",
        params=str(params),
        input_shape=PRIME,
        host="native",
        options=options,
    )
    layouts = json.loads((path / "manifest.json").read_text())["build"]["layouts"]
    assert "reason" not in layouts, layouts["reason"]
    assert layouts["costs"].get("measured", 0) > 0, layouts["costs"]
    for conv in layouts["convolutions"]:
        assert all(s is not None and s > 0 for s in conv["seconds"].values()), conv
    x = np.random.default_rng(3).standard_normal(PRIME).astype(np.float32)
    got = edgecv.load(path, on="intel").run(x)[0]
    assert_close(got, mxnet_forward(symbol, params, x)[0], name="auto on deeplens")


def test_layout_costs_are_measured_on_the_device_named():
    """`tune --device aisage --on pocl` times its kernels on PoCL: the layouts it tunes
    under must be costed there too, not on the first OpenCL device found (Intel's)."""
    from edgecv.graph_tuner.opencl_meter import opencl_meter
    from edgecv.profiles import load_profile

    skip_without_pocl()
    device_or_skip("intel(r) opencl")
    profile = load_profile("aisage")
    for query, name in (("pocl", "Portable Computing Language"), ("intel", "Intel(R) OpenCL")):
        meter, _ = opencl_meter(profile, BuildOptions(check_on=query), None)
        assert name in meter.device_key, (query, meter.device_key)
