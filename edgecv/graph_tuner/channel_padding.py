"""Output channels padded to the packing's block, so the convolution can be packed.

A convolution packs only when its output channels divide into the block: SqueezeNet's
classifier (1000 channels, 13x13) and the detection heads (SSD's 84 and 126 channels,
YOLOv3's 255) stayed plain, where their vectors take a divisor of the channel count (10
lanes of 16 for 1000), far slower than OpenVINO's
(benchmarks/results/graph_tuner-2026-11-25-zen5-2core.md). Given zero weights up to
the next multiple of the block, the convolution computes its real channels as before
plus a few zeros, which a ``strided_slice`` right after it drops; the graph tuner then
weighs it in every layout like any other convolution (the slice keeps a plain layout,
so a packed plan pays one transform there).

Only convolutions whose padding adds at most :data:`MAX_GROWTH` of their work are
padded: 3 or 21 channels would more than double theirs.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

from .activations import with_main

# The largest share of extra output channels padding may add (84 -> 96 adds 14%).
MAX_GROWTH = 0.15


def padded_channels(channels: int, block: int) -> int | None:
    """The channel count ``channels`` is padded to for ``block``; None when it divides
    already, or padding would add more than :data:`MAX_GROWTH`."""
    padded = -(-channels // block) * block
    if padded == channels or padded > channels * (1 + MAX_GROWTH):
        return None
    return padded


def pad_output_channels(mod: tvm.IRModule, block: int) -> tvm.IRModule:
    """``mod`` with every plain float32 conv2d of ``main`` whose weights are a constant
    and whose output channels :func:`padded_channels` pads, computed on zero-padded
    weights and sliced back to its channels; everything else unchanged."""
    pattern = is_op("relax.nn.conv2d")(wildcard(), is_const())

    def rewrite(call: relax.Call, _matches) -> relax.Expr:
        attrs = call.attrs
        layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout))
        if layouts != ("NCHW", "OIHW", "NCHW") or int(attrs.groups) != 1:
            return call
        kernel = call.args[1].value.numpy()  # the pattern matched a constant
        if kernel.dtype != np.float32:
            return call
        channels = kernel.shape[0]
        padded = padded_channels(channels, block)
        if padded is None:
            return call
        zeros = np.zeros((padded - channels, *kernel.shape[1:]), kernel.dtype)
        wide = relax.op.nn.conv2d(
            call.args[0],
            relax.const(np.concatenate([kernel, zeros])),
            strides=attrs.strides,
            padding=attrs.padding,
            dilation=attrs.dilation,
            groups=1,
            data_layout="NCHW",
            kernel_layout="OIHW",
            out_layout="NCHW",
            out_dtype=attrs.out_dtype,
        )
        return relax.op.strided_slice(wide, axes=[1], begin=[0], end=[channels])

    return with_main(mod, rewrite_call(pattern, rewrite, mod["main"]))
