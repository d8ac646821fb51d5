"""Models outside the zoo, of the kinds users bring (tests/user_models.py), deployed for
`cpu` (native target), `deeplens` (Intel's OpenCL runtime) and `aisage` (PoCL), each
compared with MXNet's forward pass on the same weights; and which rules scheduled them.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import mxnet_forward, needs_pocl
from test_opencl import device_or_skip
from user_models import efficient_lite, tiny_yolo

import edgecv
from edgecv.deploy import deploy
from edgecv.pipelines import BuildOptions
from edgecv.profiles import load_profile
from edgecv.schedules.device_class import tuning_folders
from edgecv.testing import assert_close

MODELS = {"tiny_yolo": tiny_yolo, "efficient_lite": efficient_lite}
# launches written over their input (edgecv.lowering.in_place): EfficientNet-Lite's three
# residual blocks add their shortcut where it dies; darknet has no residual add
IN_PLACE = {"tiny_yolo": 0, "efficient_lite": 3}
_EXPORTED: dict = {}


def exported(name, tmp_path_factory):
    if name not in _EXPORTED:
        _EXPORTED[name] = MODELS[name](tmp_path_factory.mktemp(name) / name)
    return _EXPORTED[name]


def check(name, profile, on, tmp_path, tmp_path_factory):
    symbol, params, shape = exported(name, tmp_path_factory)
    host = "native" if profile == "aisage" else None  # its fallback kernels run here
    # the GPU profiles build in NCHW: the graph tuner's measuring on an OpenCL device is
    # tests/graph_tuner/test_opencl_layouts.py's; here the rules and answers are checked.
    # The cpu deploys pack every convolution that packs (the layout transforms around
    # the pads, pools, upsampling and concatenation as a chosen plan has them) without
    # timing layouts first: choosing on measured costs is tests/test_zoo_families.py's
    # and tests/graph_tuner's
    options = BuildOptions(layout="NCHW")
    if profile == "cpu":
        tuning = tuning_folders(load_profile(profile), None)  # the databases deploy() reads
        options = BuildOptions(tuning=tuning, layout="packed")
    path = deploy(
        str(symbol),
        tmp_path / "pkg",
        profile,
        params=str(params),
        input_shape=shape,
        host=host,
        options=options,
    )
    x = np.random.RandomState(4).normal(size=shape).astype(np.float32)
    reference = mxnet_forward(symbol, params, x)
    outputs = edgecv.load(path, on=on).run(x)
    for got, want in zip(outputs, reference, strict=True):
        assert_close(got, want, name=f"{name} on {profile}")
    return json.loads((path / "manifest.json").read_text())["build"]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_user_model_on_the_cpu_profile_matches_mxnet(name, tmp_path, tmp_path_factory):
    build = check(name, "cpu", None, tmp_path, tmp_path_factory)
    rules = build["schedules"]["cpu"]["rules"]
    # every convolution gets a conv rule, packed where its channels pack, NCHW elsewhere
    convs = rules.get("cpu.Conv2D", 0) + rules.get("cpu.PackedConv2D", 0)
    assert convs >= 3 and "cpu.SafeParallel" not in rules, rules
    assert build["launches_in_place"] == IN_PLACE[name]


# tiny_yolo for deeplens: a second model on Intel's runtime (its pooling kernel's rule);
# it runs on the emulated board's PoCL in tests/emulation and with -m heavy
@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.heavy) if n == "tiny_yolo" else n for n in sorted(MODELS)],
)
def test_user_model_on_intel_opencl_matches_mxnet(name, tmp_path, tmp_path_factory):
    device_or_skip("intel(r) opencl")
    build = check(name, "deeplens", "intel", tmp_path, tmp_path_factory)
    kernels = build["schedules"]["gpu"]["kernels"]
    # the explicit pad after a conv (EfficientNet) stays a nest of its own and the conv
    # keeps its rule; darknet's edge pad + 2x2/1 pool is a pooling kernel; the topk
    # behind the class ids runs edgecv's GPU sort
    for kernel in kernels.values():
        if any(op.startswith("conv2d") for op in kernel["ops"]):
            rules = ("gpu.Conv2D", "gpu.DepthwiseConv2D", "gpu.PackedConv2D")
            assert kernel["rule"] in rules, kernel
        if "pool2d" in " ".join(kernel["ops"]):
            assert kernel["rule"] == "gpu.Pool", kernel
        if "row_argsort" in kernel["ops"]:
            assert kernel["rule"] == "as-written", kernel
    assert build["placement"]["launches"]["cpu"] == 0
    assert build["launches_in_place"] == IN_PLACE[name]


@needs_pocl()
def test_efficient_lite_on_pocl_matches_mxnet(tmp_path, tmp_path_factory):
    build = check("efficient_lite", "aisage", "pocl", tmp_path, tmp_path_factory)
    assert build["placement"]["launches"]["cpu"] == 0


@pytest.mark.heavy
@needs_pocl()
def test_tiny_yolo_on_pocl_matches_mxnet(tmp_path, tmp_path_factory):
    check("tiny_yolo", "aisage", "pocl", tmp_path, tmp_path_factory)
