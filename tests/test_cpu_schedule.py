"""Default CPU schedules: scheduled kernels compute what the unscheduled ones compute.

Shapes are chosen to hit each tiling case: widths divisible by 16, by 14 and 7 (no
power-of-two vector fits), narrower than 4 (vectors span rows), odd channel counts,
strides, depthwise and grouped convolutions, dense layers and pooling.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

from edgecv.lowering import lower
from edgecv.schedules.cpu import schedule_cpu
from edgecv.testing import assert_close

TARGET = tvm.target.Target({"kind": "llvm"})


def conv_module(shape, out_channels, kernel, stride, groups, pool=None):
    rng = np.random.RandomState(0)
    bb = relax.BlockBuilder()
    x = relax.Var("data", relax.TensorType(shape, "float32"))
    w = rng.normal(size=(out_channels, shape[1] // groups, kernel, kernel)).astype(np.float32)
    scale = rng.uniform(0.5, 1.5, (1, out_channels, 1, 1)).astype(np.float32)
    with bb.function("main", [x]):
        with bb.dataflow():
            if pool:
                y = bb.emit(pool(x))
            else:
                y = bb.emit(
                    relax.op.nn.conv2d(x, relax.const(w), stride, kernel // 2, groups=groups)
                )
                y = bb.emit(relax.op.nn.relu(relax.op.multiply(y, relax.const(scale))))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def dense_module(batch, features, outputs):
    rng = np.random.RandomState(1)
    bb = relax.BlockBuilder()
    x = relax.Var("data", relax.TensorType((batch, features), "float32"))
    w = rng.normal(size=(features, outputs)).astype(np.float32)
    b = rng.normal(size=(outputs,)).astype(np.float32)
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.add(relax.op.matmul(x, relax.const(w)), relax.const(b)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def compare_kernels(mod) -> int:
    """Run every kernel scheduled and unscheduled on the same random arguments."""
    lowered = lower(mod)
    changed = 0
    rng = np.random.RandomState(2)
    for gv, func in lowered.kernels.functions.items():
        name = gv.name_hint
        scheduled = schedule_cpu(func.without_attr("global_symbol"), TARGET)
        changed += not tvm_ffi.structural_equal(scheduled, func.without_attr("global_symbol"))
        outputs = []
        step = next(s for s in lowered.plan.steps if s.kernel == name)
        buffers = [lowered.plan.buffers[a] for a in step.args]
        args_np = [rng.normal(size=b.shape).astype(b.dtype) for b in buffers]
        for variant in (func, scheduled.with_attr("global_symbol", name)):
            lib = tvm.tirx.build(tvm.IRModule({name: variant}), target=TARGET, pipeline=None)
            args = [tvm.runtime.tensor(a) for a in args_np]
            lib[name](*args)
            outputs.append(args[-1].numpy())
        assert_close(outputs[1], outputs[0], name)
    return changed


@pytest.mark.parametrize(
    ("shape", "out_channels", "kernel", "stride", "groups"),
    [
        ((1, 16, 32, 32), 24, 3, 1, 1),  # width / 16
        ((1, 8, 28, 28), 16, 1, 1, 1),  # width 28: 14 lanes
        ((1, 12, 14, 14), 20, 3, 2, 1),  # stride 2 -> 7x7 output: 7 lanes
        ((1, 32, 7, 7), 16, 1, 1, 1),  # 7 lanes, channels / 8
        ((1, 16, 3, 3), 8, 3, 1, 1),  # width < 4: vectors span rows
        ((2, 6, 10, 10), 10, 3, 1, 1),  # batch 2, channels not / 8
        ((1, 16, 15, 15), 16, 3, 1, 16),  # depthwise, odd width
        ((1, 8, 12, 12), 8, 3, 1, 2),  # grouped
        ((1, 8, 17, 17), 16, 5, 1, 1),  # 5x5 onto a prime width
        ((1, 3, 31, 31), 16, 7, 2, 1),  # 7x7 stride 2 onto 13 (prime) columns
        ((1, 8, 13, 13), 8, 5, 1, 8),  # 5x5 depthwise, prime width
        ((1, 8, 38, 38), 32, 3, 1, 1),  # width 38 = 2 x 19: 2-pixel tiles of a row
        ((1, 16, 13, 13), 255, 1, 1, 1),  # YOLOv3's head: 15-lane vectors
        ((1, 8, 10, 10), 84, 3, 1, 1),  # SSD's class head: 14-lane vectors
    ],
)
def test_convolution_schedules_match(shape, out_channels, kernel, stride, groups):
    assert compare_kernels(conv_module(shape, out_channels, kernel, stride, groups)) >= 1


def test_dense_schedule_matches():
    assert compare_kernels(dense_module(2, 64, 100)) >= 1


@pytest.mark.parametrize(
    "pool",
    [
        lambda x: relax.op.nn.max_pool2d(x, (3, 3), (2, 2), (1, 1)),
        lambda x: relax.op.nn.avg_pool2d(x, (2, 2), (2, 2)),
        lambda x: relax.op.mean(x, axis=[2, 3], keepdims=True),
        # darknet: an edge-mode pad, then a 2x2 stride-1 max pool (same size out)
        lambda x: relax.op.nn.max_pool2d(
            relax.op.nn.pad(x, (0, 0, 0, 0, 0, 1, 0, 1), pad_mode="replicate"), (2, 2), (1, 1)
        ),
        lambda x: relax.op.image.resize2d(x, (28, 28), method="nearest_neighbor"),
        # an asymmetric zero pad before a conv (TensorFlow's "same" at stride 2)
        lambda x: relax.op.nn.conv2d(
            relax.op.nn.pad(x, (0, 0, 0, 0, 0, 1, 0, 1)),
            relax.const(np.ones((8, 8, 3, 3), np.float32)),
            (2, 2),
        ),
    ],
)
def test_pooling_schedules_match(pool):
    compare_kernels(conv_module((1, 8, 14, 14), 8, 1, 1, 1, pool=pool))


def test_a_pixel_tile_holds_part_of_one_row_or_whole_rows():
    """Never part of a row and part of the next (the write-back would redo whole rows
    per tile): VGG's 38-wide maps get 2 pixels of a row, 3-wide maps whole rows."""
    from edgecv.schedules.cpu.conv2d import pixel_tile

    for max_pixels in (4, 8, 16):
        for height in range(1, 80):
            for width in range(1, 80):
                pixels, across = pixel_tile(height, width, max_pixels)
                assert 1 <= pixels <= max_pixels
                if across:
                    assert pixels % width == 0 and height % (pixels // width) == 0
                else:
                    assert width % pixels == 0
    assert pixel_tile(38, 38, 8) == (2, False)
    assert pixel_tile(6, 3, 8) == (6, True)


@pytest.mark.parametrize("out_channels", [84, 126, 255])
def test_detection_heads_take_the_conv_rule(out_channels):
    """SSD's and YOLOv3's heads (channels no power of two divides) are convolutions
    like the others: they went to the row and window rules at 4-26 GFLOP/s."""
    from edgecv.schedules.cpu import default_rules, safe_rule
    from edgecv.schedules.stage import ScheduleOrder

    target = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})
    mod = conv_module((1, 32, 10, 10), out_channels, 3, 1, 1)
    (conv,) = [f for gv, f in lower(mod).kernels.functions.items() if "conv2d" in gv.name_hint]
    order = ScheduleOrder(target, default_rules(target), safe_rule())
    with target:
        chosen = next(c for c in order.attempts(conv.without_attr("global_symbol")) if c.func)
    assert chosen.rule == "cpu.Conv2D"


def test_every_rule_declines_an_opaque_kernel_without_raising():
    """MultiBox's CPU kernel (an IR-builder op: a block writing through opaque buffer
    accesses) is no kernel of the reduction rules: each returns None, as a rule does
    for a kernel not its own, instead of failing on the missing write region (which the
    schedule stage reported as a warning on every SSD deploy)."""
    from tvm import te

    from edgecv.ops.multibox import multibox_detection
    from edgecv.schedules.cpu import default_rules

    cls = te.placeholder((1, 3, 40), "float32")
    loc = te.placeholder((1, 160), "float32")
    anchors = te.placeholder((1, 40, 4), "float32")
    func = te.create_prim_func([cls, loc, anchors, multibox_detection(cls, loc, anchors)])
    target = tvm.target.Target({"kind": "llvm"})
    declined = [
        type(r).__name__ for r in default_rules(target) if r.apply(func, target, False) is None
    ]
    assert {"PackedConv2D", "Conv2DInt8", "Conv2D", "Window", "Dense"} <= set(declined)
