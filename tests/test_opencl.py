"""Whole models on the OpenCL backend (TVM-generated OpenCL C run through pyopencl),
against MXNet's forward pass, on the pip-installed OpenCL devices."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import mxnet_forward, random_input
from test_parity import depth_loosening

from edgecv.build.opencl import build_opencl
from edgecv.build.pipeline import lower
from edgecv.frontend.importer import from_mxnet
from edgecv.frontend.mxnet_graph import load_params, load_symbol
from edgecv.profiles import load_profile
from edgecv.runtime.executor import Executor
from edgecv.runtime.opencl import OpenCLBackend
from edgecv.runtime.opencl_devices import opencl_devices
from edgecv.testing import assert_close

heavy = pytest.mark.heavy


def device_or_skip(query: str) -> str:
    if not any(d.matches(query) for d in opencl_devices()):
        pytest.skip(f"no OpenCL device matching {query!r} on this machine")
    return query


def run_opencl(exported, profile: str, device: str, x: np.ndarray) -> list[np.ndarray]:
    graph = load_symbol(exported.symbol_path)
    imported = from_mxnet(graph, load_params(exported.params_path), {"data": exported.input_shape})
    lowered = lower(imported.mod)
    kernels = build_opencl(lowered.kernels, load_profile(profile).tvm_target())
    assert not kernels.unsupported
    backend = OpenCLBackend(device, kernels.source, kernels.launches)
    return Executor(lowered.plan, backend, lowered.constants).run([x])


@pytest.mark.parametrize(
    ("name", "profile"),
    [
        ("squeezenet1.0", "deeplens"),
        ("squeezenet1.0", "aisage"),
        pytest.param("mobilenet1.0", "deeplens", marks=heavy),
        pytest.param("mobilenet1.0", "aisage", marks=heavy),
        pytest.param("resnet50_v1", "deeplens", marks=heavy),
        pytest.param("resnet50_v1", "aisage", marks=heavy),
    ],
)
def test_classifier_on_intel_opencl_matches_mxnet(exported, name, profile):
    model = exported(name)
    x = random_input(model.input_shape, seed=1)
    ours = run_opencl(model, profile, device_or_skip("intel(r) opencl"), x)
    ref = mxnet_forward(model.symbol_path, model.params_path, x)
    assert_close(ours[0], ref[0], f"{name} on {profile}", loosen=depth_loosening(model))


def test_deploy_and_run_opencl_package(tmp_path, capsys):
    from test_bad_input import small_net, small_params

    from edgecv._mxnet import import_mxnet
    from edgecv.cli import main
    from edgecv.model import load

    device_or_skip("intel(r) opencl")
    mx = import_mxnet()
    prefix = tmp_path / "tiny"
    small_net().save(f"{prefix}-symbol.json")
    params = small_params()
    mx.nd.save(f"{prefix}-0000.params", {k: mx.nd.array(v) for k, v in params.items()})
    out = tmp_path / "pkg"
    argv = ["deploy", f"{prefix}-symbol.json", "--device", "deeplens", "--input-shape",
            "1,2,5,5", "-o", str(out)]  # fmt: skip
    assert main(argv) == 0
    model = load(out, on="intel")
    x = np.random.RandomState(0).normal(size=(1, 2, 5, 5)).astype(np.float32)
    ref = mxnet_forward(prefix.with_name("tiny-symbol.json"), f"{prefix}-0000.params", x)
    assert_close(model.run(x)[0], ref[0])
    assert (
        main(["run", str(out), "--on", "no-such-device", "--input", str(tmp_path / "x.npy")]) == 2
    )
    assert "no OpenCL device matches" in capsys.readouterr().err


def test_first_device_that_builds_is_used():
    """A package that names no device tries every device until one compiles it.

    PoCL's LLVM may not know the host CPU (it fails every build on AMD Zen 5); the
    program must then land on the next device, and asking for PoCL alone must fail
    with a message naming the device and its compiler log.
    """
    from edgecv.errors import EdgecvError

    device_or_skip("intel(r) opencl")
    source = "__kernel void f(__global float* y) { y[get_global_id(0)] += 1.0f; }"
    backend = OpenCLBackend("", source, {})
    y = backend.view(backend.alloc(16), (4,), "float32")
    backend.upload(y, np.zeros(4, np.float32))
    kernel = backend.cl.Kernel(backend.program, "f")
    kernel.set_arg(0, y.buffer)
    backend.cl.enqueue_nd_range_kernel(backend.queue, kernel, (4,), None)
    np.testing.assert_array_equal(backend.download(y), np.ones(4, np.float32))
    if any(d.matches("pocl") for d in opencl_devices()):
        try:
            OpenCLBackend("pocl", source, {})
        except EdgecvError as err:
            assert "pthread" in str(err) and "build" in str(err)
