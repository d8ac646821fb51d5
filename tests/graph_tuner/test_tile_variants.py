"""The knobs of edgecv's GPU convolution rules (dlight's ``tunable``): every tile a tuner
may pick computes what the default computes, and the default comes first."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from test_opencl import device_or_skip
from test_packed_rule import _conv_kernel, _conv_module, _run
from test_winograd import unpack, winograd_case

from edgecv.board.runtime.opencl import OpenCLBackend
from edgecv.codegen.opencl import build_opencl
from edgecv.profiles import load_profile
from edgecv.schedules.gpu import PackedConv2D, Winograd
from edgecv.testing import assert_close

PROFILE = load_profile("deeplens")
TARGET = PROFILE.tvm_target()


def packed_conv(channels, outputs, size, kernel, stride, groups):
    """A packed (16c) conv + bias + residual + ReLU kernel, its inputs, and its output
    computed by the unscheduled kernel on the CPU."""
    func = _conv_kernel(_conv_module(channels, outputs, size, kernel, stride, groups, 16, True))
    rng = np.random.default_rng(0)
    inputs = [
        rng.standard_normal([int(d) for d in p.shape]).astype("float32") for p in func.params[:-1]
    ]
    return func, inputs, _run(func, tvm.target.Target("llvm"), inputs)


def winograd_conv():
    """A Winograd F(2x2, 3x3) kernel in 16c on a 13x13 map (tiles predicated at the
    edge), its inputs, and its output computed by NumPy (packed). One input channel
    block (the products' reduction, unrolled in every tile), two output blocks (the
    channel knob has two values to try)."""
    func, inputs, shape, expected = winograd_case(2, 1, 16, 32, 13, 13, 1, False, block=16)
    return func, inputs, expected, shape


def variants(rule, func):
    with TARGET:
        found = rule.apply(func, TARGET, True)
        default = rule.apply(func, TARGET, False)
    return found, default


def run_all(schedules, inputs, shape) -> list[np.ndarray]:
    """Each schedule's output on Intel's runtime, all built as one OpenCL program."""
    mod = tvm.IRModule(
        {
            f"v{i}": sch.mod["main"].with_attr("global_symbol", f"v{i}")
            for i, sch in enumerate(schedules)
        }
    )
    kernels = build_opencl(mod, TARGET, PROFILE.intel_subgroup_size)
    assert not kernels.unsupported, kernels.unsupported
    backend = OpenCLBackend("intel", kernels.source, kernels.launches, kernels.requires)
    outputs = []
    for i in range(len(schedules)):
        tensors = []
        for array in [*inputs, np.zeros(shape, np.float32)]:
            tensor = backend.view(backend.alloc(array.nbytes), array.shape, str(array.dtype))
            backend.upload(tensor, array)
            tensors.append(tensor)
        backend.bind(f"v{i}", tensors)()
        backend.synchronize()
        outputs.append(backend.download(tensors[-1]))
    return outputs


@pytest.mark.parametrize(
    "case",
    [
        # the tiles of a stride-1 conv on the 8-wide map, without the 144-term unrolled
        # reduction of a 3x3 (its Intel compiles of every tile were 95 s of the suite)
        (16, 32, 8, 1, 1, 1),
        (32, 32, 9, 3, 2, 32),
        # a stem: a plain input of 3 channels, strided, a padded window, a prime width
        (3, 32, 13, 3, 2, 1),
        # the same tiles over a 3x3 reduction: the 1x1 case covers every tile of a
        # stride-1 conv, stem-3x3-prime-width a padded reduction over the window
        pytest.param((16, 32, 8, 3, 1, 1), marks=pytest.mark.heavy),
        # the stem's tiles over a 7x7 window (147 unrolled terms a tile): the same
        # schedules as stem-3x3-prime-width's, each Intel compile several times longer
        pytest.param((3, 32, 13, 7, 2, 1), marks=pytest.mark.heavy),
    ],
    ids=["1x1", "depthwise-strided", "stem-3x3-prime-width", "3x3", "stem-7x7-prime-width"],
)
def test_every_packed_conv_tile_computes_the_kernel(case):
    device_or_skip("intel(r) opencl")
    func, inputs, expected = packed_conv(*case)
    found, default = variants(PackedConv2D(), func)
    assert isinstance(found, list) and len(found) >= 3, "the rule offers no tiles"
    assert tvm_ffi.structural_equal(found[0].mod, default.mod), "the default is not first"
    keys = {tvm_ffi.structural_hash(sch.mod) for sch in found}
    assert len(keys) == len(found), "a tile offered twice"
    for n, got in enumerate(run_all(found, inputs, expected.shape)):
        assert_close(got, expected, name=f"tile variant {n} of {len(found)}")


def test_every_winograd_product_tile_computes_the_convolution():
    device_or_skip("intel(r) opencl")
    func, inputs, expected, shape = winograd_conv()
    found, default = variants(Winograd(), func)
    assert isinstance(found, list) and len(found) >= 3, "the rule offers no tiles"
    assert tvm_ffi.structural_equal(found[0].mod, default.mod), "the default is not first"
    for n, got in enumerate(run_all(found, inputs, shape)):
        assert_close(unpack(got), expected, name=f"Winograd tile variant {n} of {len(found)}")


def test_a_tile_fitted_as_one_tried_before_is_not_scheduled_again():
    """Tiles are upper bounds fitted to the kernel's extents: the rule schedules each
    fitted tile once (not every one of its 48 tiles) and offers what scheduling every
    tile offers, in the same order."""
    from edgecv.schedules.gpu.conv2d_packed import TILES, Tile

    func = _conv_kernel(_conv_module(16, 32, 8, 1, 1, 1, 16, True))
    tried = []

    class Counting(PackedConv2D):
        def _tiled(self, func, target, tile):
            tried.append(tile)
            return super()._tiled(func, target, tile)

    with TARGET:
        found = Counting().apply(func, TARGET, True)
        every = [PackedConv2D()._tiled(func, TARGET, tile) for tile in [Tile(), *TILES]]
        fit = PackedConv2D()._fitter(func, TARGET)
    offered = [tvm_ffi.structural_hash(sch.mod) for sch in found]
    assert offered == list(dict.fromkeys(tvm_ffi.structural_hash(s.mod) for s in every))
    assert len(tried) == len({fit(tile) for tile in [Tile(), *TILES]}) < len(TILES) // 2
