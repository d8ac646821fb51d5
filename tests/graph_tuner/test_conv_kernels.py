"""The graph tuner finds the fused kernel of every convolution it weighs
(:func:`edgecv.graph_tuner.costs.conv_kernels`), including kernels whose output is not the
convolution's: a squeeze-and-excitation's last 1x1 convolution fused with the broadcast
multiply it scales the feature map by (MobileNetV3, GluonCV's and torchvision's), and a
convolution whose padded output channels a slice drops (:mod:`.channel_padding`)."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

from edgecv.graph_tuner.activations import rewrite_activations
from edgecv.graph_tuner.channel_padding import pad_output_channels
from edgecv.graph_tuner.costs import conv_kernels
from edgecv.graph_tuner.extract import extract
from edgecv.graph_tuner.stage import conv_candidates

R = relax.op


def _weight(rng, *shape) -> relax.Constant:
    return relax.const(rng.standard_normal(shape).astype("float32"))


def squeeze_excitation(channels: int = 16, hidden: int = 8, out: int = 72) -> relax.Function:
    """conv -> SE (mean, 1x1 conv, relu, 1x1 conv, hard-sigmoid, multiply) -> conv to
    ``out`` channels (72: padded to 80 for blocks of 16)."""
    rng = np.random.RandomState(0)
    x = relax.Var("x", relax.TensorType((1, 3, 16, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(R.nn.conv2d(x, _weight(rng, channels, 3, 3, 3), padding=1))
            s = bb.emit(R.mean(y, axis=[2, 3], keepdims=True))
            s = bb.emit(R.nn.relu(R.nn.conv2d(s, _weight(rng, hidden, channels, 1, 1))))
            s = bb.emit(R.nn.conv2d(s, _weight(rng, channels, hidden, 1, 1)))
            s = bb.emit(R.divide(R.clip(R.add(s, relax.const(3.0)), 0, 6), relax.const(6.0)))
            y = bb.emit(R.multiply(y, s))
            z = bb.emit(R.nn.conv2d(y, _weight(rng, out, channels, 1, 1)))
            result = bb.emit_output(z)
        bb.emit_func_output(result)
    return bb.get()


@pytest.mark.parametrize("layout", ["NCHW", "NCHW8c"])
def test_every_convolution_has_its_kernel(layout):
    mod = squeeze_excitation()
    prepared = relax.transform.FoldConstant()(pad_output_channels(rewrite_activations(mod), 16))
    extracted = extract(prepared, conv_candidates(["NCHW8c"], None))
    graph = extracted.graph
    names = {graph.nodes[i].name for i in graph.convs()}
    # the layout's candidates: the SE's first 1x1 conv (8 -> 8 hidden) packs too
    wanted = {n for n in names if layout == "NCHW" or n in _packable(graph)}
    found = conv_kernels(extracted, layout)
    assert set(found) == wanted, (sorted(found), sorted(wanted))


def _packable(graph) -> set[str]:
    return {graph.nodes[i].name for i in graph.convs() if "NCHW8c" in graph.nodes[i].candidates}
