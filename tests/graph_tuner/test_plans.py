"""Every layout plan of a small model computes what NCHW and MXNet compute, and inserts
exactly the transforms the solver's graph predicts."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tvm
import tvm_ffi
from small_model import SHAPE, export_small_model
from tvm import relax

from edgecv.board.runtime.cpu import CPUBackend
from edgecv.board.runtime.executor import Executor
from edgecv.codegen.llvm import build_cpu
from edgecv.frontend.mxnet.importer import from_mxnet
from edgecv.frontend.mxnet.mxnet_graph import load_params, load_symbol
from edgecv.graph_tuner.activations import rewrite_activations
from edgecv.graph_tuner.apply import convert_layouts, inserted_transforms
from edgecv.graph_tuner.channel_padding import pad_output_channels, padded_channels
from edgecv.graph_tuner.extract import extract
from edgecv.graph_tuner.solver import evaluate, uniform_plans
from edgecv.graph_tuner.stage import conv_candidates
from edgecv.lowering import lower
from edgecv.testing import assert_close

TARGET = tvm.target.Target({"kind": "llvm"})


class Unit:
    """One second per transform, nothing per kernel: a plan's total counts transforms."""

    def kernel(self, node, layout):
        return 0.0

    def transform(self, shape, src, dst):
        return 1.0


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    from conftest import mxnet_forward

    symbol, params = export_small_model(tmp_path_factory.mktemp("small") / "small")
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    expected = mxnet_forward(symbol, params, x)[0]
    mod = from_mxnet(load_symbol(symbol), load_params(params), {"data": SHAPE}).mod
    prepared = relax.transform.FoldConstant()(rewrite_activations(mod))
    return mod, prepared, x, expected


def _run(mod, x):
    return _run_all([mod], x)[0]


def _run_all(mods, x, winograd=None):
    """Run each module (lowered with its ``winograd`` choices, when given); kernels the
    modules share (most, between plans) compile once."""
    choices = winograd or [None] * len(mods)
    lowered_all = [lower(mod, w) for mod, w in zip(mods, choices, strict=True)]
    unique: dict[int, str] = {}
    functions = {}
    for lowered in lowered_all:
        names = {}
        for gv, func in lowered.kernels.functions.items():
            bare = func.without_attr("global_symbol")
            key = tvm_ffi.structural_hash(bare)
            if key not in unique:
                unique[key] = f"k{len(unique)}"
                functions[unique[key]] = bare.with_attr("global_symbol", unique[key])
            names[gv.name_hint] = unique[key]
        for step in lowered.plan.steps:
            step.kernel = names[step.kernel]
    library = build_cpu(tvm.IRModule(functions), TARGET)
    return [
        Executor(lowered.plan, CPUBackend(library), lowered.constants).run([x])[0]
        for lowered in lowered_all
    ]


def _plans(graph):
    convs = graph.convs()
    for combo in itertools.product(*(graph.choices(i) for i in convs)):
        yield dict(zip(convs, combo, strict=True))


def test_every_plan_matches_nchw_and_mxnet(small):
    """Every plan in 8c (16); in 4c (32 plans, 40 s) all-plain, all-packed and one mixed;
    all of them built as one library with NCHW (the kernels they share compile once)."""
    mod, prepared, x, expected = small
    modules, named = [mod], ["NCHW"]
    for packing in ("NCHW8c", "NCHW4c"):
        extracted = extract(prepared, conv_candidates([packing]))
        graph = extracted.graph
        packable = [i for i in graph.convs() if len(graph.choices(i)) > 1]
        # a, b, dw, c and d pack in 4c; in 8c d (4 channels) stays plain
        names = [graph.nodes[i].name for i in packable]
        assert len(packable) == (5 if packing == "NCHW4c" else 4), names
        plans = list(_plans(graph))
        assert len(plans) == 2 ** len(packable)
        if packing == "NCHW4c":
            plans = [plans[0], plans[len(plans) // 3], plans[-1]]
        for layouts in plans:
            converted = convert_layouts(extracted, layouts)
            predicted = evaluate(graph, layouts, Unit()).total
            assert len(inserted_transforms(converted)) == predicted, layouts
            modules.append(converted)
            named.append(str({graph.nodes[i].name: lay for i, lay in layouts.items()}))
    nchw, *outputs = _run_all(modules, x)
    assert_close(nchw, expected, "NCHW vs MXNet")
    for name, ours in zip(named[1:], outputs, strict=True):
        assert_close(ours, nchw, f"{name} vs NCHW")
        assert_close(ours, expected, f"{name} vs MXNet")


def test_a_channel_sum_broadcast_against_its_input_keeps_that_input_plain(tmp_path):
    """SSD-VGG's L2 normalization divides a tensor by its sum over channels (kept as one
    channel): Relax cannot convert that divide with the tensor packed. The graph calls
    exactly those plans invalid; every other plan converts, inserts the transforms it
    predicts and computes what MXNet computes."""
    from conftest import mxnet_forward

    from edgecv._mxnet import import_mxnet

    mx = import_mxnet()
    S = mx.sym
    shape = (1, 8, 6, 6)
    first = S.Convolution(S.var("data"), kernel=(3, 3), pad=(1, 1), num_filter=16, name="a")
    normed = S.L2Normalization(first, mode="channel")
    net = S.Convolution(S.relu(normed), kernel=(1, 1), num_filter=16, name="b")
    arg_shapes, _, _ = net.infer_shape(data=shape)
    rng = np.random.RandomState(0)
    params = {}
    for name, arg_shape in zip(net.list_arguments(), arg_shapes, strict=True):
        if name != "data":
            params[name] = rng.normal(size=arg_shape).astype(np.float32)
    prefix = tmp_path / "l2"
    net.save(f"{prefix}-symbol.json")
    mx.nd.save(f"{prefix}-0000.params", {f"arg:{k}": mx.nd.array(v) for k, v in params.items()})
    x = rng.normal(size=shape).astype(np.float32)
    expected = mxnet_forward(f"{prefix}-symbol.json", f"{prefix}-0000.params", x)[0]
    mod = from_mxnet(load_symbol(f"{prefix}-symbol.json"), params, {"data": shape}).mod
    prepared = relax.transform.FoldConstant()(mod)
    extracted = extract(prepared, conv_candidates(["NCHW8c"]))
    graph = extracted.graph
    first_conv = graph.convs()[0]  # in binding order: a, then b
    valid = []
    for layouts in _plans(graph):
        named = {graph.nodes[i].name: lay for i, lay in layouts.items()}
        predicted = evaluate(graph, layouts, Unit()).total
        a_packed = layouts[first_conv] == "NCHW8c"
        assert (predicted == float("inf")) == a_packed, named
        if a_packed:
            with pytest.raises(Exception, match="broadcast"):
                convert_layouts(extracted, layouts)
        else:
            converted = convert_layouts(extracted, layouts)
            assert len(inserted_transforms(converted)) == predicted, named
            valid.append(converted)
    assert len(valid) == 2
    # the uniform packed plan (`--layout packed`, and the plan the costs are measured
    # in) packs what Relax can convert: b, not a
    second_conv = graph.convs()[1]
    assert uniform_plans(graph)["NCHW8c"] == {first_conv: "NCHW", second_conv: "NCHW8c"}
    for ours in _run_all(valid, x):
        assert_close(ours, expected, "plan vs MXNet")


def _export_symbol(net, shape, prefix):
    from edgecv._mxnet import import_mxnet

    mx = import_mxnet()
    arg_shapes, _, _ = net.infer_shape(data=shape)
    rng = np.random.RandomState(0)
    params = {
        name: rng.normal(scale=0.5, size=arg_shape).astype(np.float32)
        for name, arg_shape in zip(net.list_arguments(), arg_shapes, strict=True)
        if name != "data"
    }
    net.save(f"{prefix}-symbol.json")
    mx.nd.save(f"{prefix}-0000.params", {f"arg:{k}": mx.nd.array(v) for k, v in params.items()})
    return f"{prefix}-symbol.json", f"{prefix}-0000.params", params


def test_a_deconvolution_and_a_boolean_mask_between_packed_convolutions(tmp_path):
    """Pose and depth decoders: an ELU (a boolean mask picks the branch) and a
    Deconvolution between convolutions. Relax gave the Deconvolution its packed input's
    layout ("Layouts must have the same size") and TVM's legalization padded the boolean
    mask with float 0 (TIR refuses it): each made `--layout auto` fall back to NCHW for
    simple_pose and monodepth2. Every plan converts and computes what MXNet computes."""
    from edgecv._mxnet import import_mxnet

    S = import_mxnet().sym
    shape = (1, 8, 6, 6)
    a = S.Convolution(S.var("data"), kernel=(3, 3), pad=(1, 1), num_filter=16, name="a")
    c = S.Convolution(S.LeakyReLU(a, act_type="elu"), kernel=(1, 1), num_filter=16, name="c")
    up = S.Deconvolution(
        S.relu(c), kernel=(4, 4), stride=(2, 2), pad=(1, 1), num_filter=8, no_bias=True, name="up"
    )
    net = S.Convolution(S.LeakyReLU(up, act_type="elu"), kernel=(1, 1), num_filter=8, name="b")
    plans = _every_plan_against_mxnet(net, shape, tmp_path / "decoder")
    assert len(plans) == 8  # a, c and b, each plain or packed


def _every_plan_against_mxnet(net, shape, prefix, padded: bool = False) -> list:
    """Every NCHW/NCHW8c plan of the MXNet symbol ``net`` converted and run against
    MXNet's forward pass (``padded``: output channels padded to 8 first, as the graph
    tuner does); returns the plans."""
    from conftest import mxnet_forward

    symbol, params_path, params = _export_symbol(net, shape, prefix)
    x = np.random.RandomState(1).normal(size=shape).astype(np.float32)
    expected = mxnet_forward(symbol, params_path, x)[0]
    mod = rewrite_activations(from_mxnet(load_symbol(symbol), params, {"data": shape}).mod)
    prepared = relax.transform.FoldConstant()(pad_output_channels(mod, 8) if padded else mod)
    extracted = extract(prepared, conv_candidates(["NCHW8c"]))
    plans = list(_plans(extracted.graph))
    converted = [convert_layouts(extracted, layouts) for layouts in plans]
    for layouts, ours in zip(plans, _run_all(converted, x), strict=True):
        assert ours.shape == expected.shape
        assert_close(ours, expected, f"{layouts} vs MXNet")
    return plans


def test_a_squeeze_of_the_last_axis_after_packed_convolutions(tmp_path):
    """Mask R-CNN squeezes its box scores with `squeeze(axis=-1)`: Relax's layout
    conversion of a negative squeeze axis asks for an impossible allocation (bad_alloc),
    and `--layout auto` fell back to NCHW for every Mask R-CNN. The importer gives the
    axis as a positive number; every plan converts and computes what MXNet computes."""
    from edgecv._mxnet import import_mxnet

    S = import_mxnet().sym
    shape = (1, 8, 6, 6)
    a = S.Convolution(S.var("data"), kernel=(3, 3), pad=(1, 1), num_filter=16, name="a")
    b = S.Convolution(S.relu(a), kernel=(1, 1), num_filter=8, name="b")
    net = S.squeeze(S.slice_axis(b, axis=-1, begin=0, end=1), axis=-1)
    plans = _every_plan_against_mxnet(net, shape, tmp_path / "squeeze")
    assert len(plans) == 4  # a and b, each plain or packed


def test_output_channels_padded_to_the_block_pack_and_compute_the_same(tmp_path):
    """A convolution of 30 output channels (SqueezeNet's 1000-channel classifier, the
    detection heads' 84, 126 and 255) cannot pack in NCHW8c as it is; padded with zero
    weights to 32 and sliced back, it packs, and every plan computes what MXNet does.
    Padding that would add more than 15% of the work (3 -> 8 channels) is not done."""
    from edgecv._mxnet import import_mxnet

    S = import_mxnet().sym
    shape = (1, 8, 6, 6)
    a = S.Convolution(S.var("data"), kernel=(3, 3), pad=(1, 1), num_filter=16, name="a")
    b = S.Convolution(S.relu(a), kernel=(3, 3), pad=(1, 1), num_filter=30, name="b")
    net = S.Convolution(S.relu(b), kernel=(1, 1), num_filter=3, name="c")
    plans = _every_plan_against_mxnet(net, shape, tmp_path / "heads", padded=True)
    assert len(plans) == 4  # a and b, each plain or packed; c's 3 channels stay plain
    assert [padded_channels(n, 16) for n in (1000, 84, 126, 255, 21, 3, 32)] == [
        1008,
        96,
        128,
        256,
        None,
        None,
        None,
    ]
