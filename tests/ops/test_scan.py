"""The three-stage scan against NumPy (and MXNet's cumsum), on the CPU and OpenCL."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tvm
from conftest import needs_pocl
from hypothesis import given, settings
from hypothesis import strategies as st
from matrix import each_once, examples

from edgecv.board.runtime.opencl_devices import opencl_devices
from edgecv.codegen.opencl import build_opencl
from edgecv.ops.scan import scan_cpu, scan_gpu, scan_reference
from edgecv.profiles import load_profile
from edgecv.testing import assert_close

HAS_INTEL = any(d.matches("intel(r) opencl") for d in opencl_devices())
needs_intel = pytest.mark.skipif(not HAS_INTEL, reason="no Intel OpenCL runtime here")


@functools.cache
def _opencl_backend_for(rows, n, dtype, exclusive, threads, subgroup=None, device="intel"):
    from edgecv.board.runtime.opencl import OpenCLBackend

    func = scan_gpu(rows, n, dtype, exclusive, threads, subgroup)
    target = load_profile("deeplens" if subgroup else "aisage").tvm_target()
    kernels = build_opencl(tvm.IRModule({"scan": func}), target, subgroup)
    assert not kernels.unsupported
    assert kernels.requires == (["cl_intel_subgroups"] if subgroup else [])
    return OpenCLBackend(device, kernels.source, kernels.launches, kernels.requires)


def run_opencl(
    x: np.ndarray, exclusive: bool, threads: int = 64, subgroup=None, device: str = "intel"
) -> np.ndarray:
    backend = _opencl_backend_for(*x.shape, str(x.dtype), exclusive, threads, subgroup, device)
    src = backend.view(backend.alloc(x.nbytes), x.shape, str(x.dtype))
    dst = backend.view(backend.alloc(x.nbytes), x.shape, str(x.dtype))
    backend.upload(src, x)
    backend.bind("scan", [src, dst])()
    backend.synchronize()
    return backend.download(dst)


def run_cpu(x: np.ndarray, exclusive: bool) -> np.ndarray:
    func = scan_cpu(*x.shape, str(x.dtype), exclusive).with_attr("global_symbol", "scan")
    lib = tvm.tirx.build(tvm.IRModule({"scan": func}), target=tvm.target.Target({"kind": "llvm"}))
    out = tvm.runtime.tensor(np.zeros_like(x))
    lib["scan"](tvm.runtime.tensor(x), out)
    return out.numpy()


def check(ours: np.ndarray, x: np.ndarray, exclusive: bool) -> None:
    ref = scan_reference(x, exclusive)
    if x.dtype == np.int32:
        np.testing.assert_array_equal(ours, ref)
    else:  # chunked sums associate differently: bound by the sum of magnitudes
        scale = float(np.abs(x).sum(axis=-1).max()) or 1.0
        assert_close(ours, ref, "scan", scale=scale)


EDGES = [(1, 1), (1, 2), (2, 63), (1, 64), (1, 65), (3, 1000), (1, 4097), (2, 70001)]


@pytest.mark.parametrize(
    ("shape", "exclusive", "dtype"),
    # each length once per device, each (exclusive, dtype) pair at least once; the whole
    # product with -m heavy (every pair is a program of its own)
    each_once(
        [(shape,) for shape in EDGES],
        [(False, "int32"), (True, "float32"), (True, "int32"), (False, "float32")],
    ),
)
@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param("opencl", marks=needs_intel),
        pytest.param("opencl-intel-subgroups", marks=needs_intel),
    ],
)
def test_scan_edge_lengths(shape, exclusive, dtype, device):
    rng = np.random.RandomState(sum(shape))
    x = (rng.randint(-9, 10, shape) if dtype == "int32" else rng.normal(size=shape)).astype(dtype)
    if device == "cpu":
        ours = run_cpu(x, exclusive)
    else:  # the subgroup variant: tiles of 16 with sub_group_scan, 256 work-items a row
        subgroup = 16 if device.endswith("subgroups") else None
        ours = run_opencl(x, exclusive, 256 if subgroup else 64, subgroup)
    check(ours, x, exclusive)


@needs_intel
@settings(max_examples=examples(25), deadline=None)
@given(
    n=st.integers(1, 3000),
    threads=st.sampled_from([1, 2, 16, 256]),
    exclusive=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_scan_random_lengths_and_work_group_sizes(n, threads, exclusive, seed):
    x = np.random.RandomState(seed).randint(-1000, 1000, (2, n)).astype(np.int32)
    check(run_opencl(x, exclusive, threads), x, exclusive)


@needs_intel
@settings(max_examples=examples(10), deadline=None)
@given(
    n=st.integers(1, 3000),
    threads=st.sampled_from([16, 64, 256]),
    exclusive=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_intel_subgroup_scan_random(n, threads, exclusive, seed):
    x = np.random.RandomState(seed).randint(-1000, 1000, (2, n)).astype(np.int32)
    check(run_opencl(x, exclusive, threads, subgroup=16), x, exclusive)


@needs_pocl()
@pytest.mark.parametrize(
    ("shape", "exclusive", "dtype"),
    [
        ((3, 1000), True, "int32"),
        ((2, 70001), False, "float32"),
        pytest.param((1, 1), False, "int32", marks=pytest.mark.heavy),
    ],
)  # PoCL compiles a program in seconds: a few shapes
def test_scan_on_pocl(shape, exclusive, dtype):
    """The same kernels on PoCL (no subgroups): work-items need not run in lockstep."""
    rng = np.random.RandomState(sum(shape) + 1)
    x = (rng.randint(-9, 10, shape) if dtype == "int32" else rng.normal(size=shape)).astype(dtype)
    check(run_opencl(x, exclusive, 64, device="pocl"), x, exclusive)


def test_inclusive_scan_matches_mxnet_cumsum():
    from edgecv._mxnet import import_mxnet

    mx = import_mxnet()
    x = np.random.RandomState(5).randint(-50, 50, (3, 777)).astype(np.int32)
    theirs = mx.np.cumsum(mx.np.array(x, dtype="int32"), axis=1).asnumpy()
    np.testing.assert_array_equal(run_cpu(x, False), theirs)
    if HAS_INTEL:
        np.testing.assert_array_equal(run_opencl(x, False), theirs)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="dtype float64"):
        scan_cpu(1, 4, "float64")
    with pytest.raises(ValueError, match="subgroup size 12 must be a power of two"):
        scan_gpu(1, 4, threads=64, subgroup=12)
    with pytest.raises(ValueError, match="power of two"):
        scan_gpu(1, 4, threads=48)
    with pytest.raises(ValueError, match="empty shape"):
        scan_gpu(1, 0)
