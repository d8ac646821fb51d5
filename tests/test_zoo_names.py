"""Every GluonCV image model resolves by name; multi-input and deferred-init nets export."""

from __future__ import annotations

import numpy as np
import pytest

from edgecv._mxnet import import_mxnet
from edgecv.board.errors import ModelNotFoundError
from edgecv.frontend.mxnet import zoo
from edgecv.frontend.mxnet.importer import from_mxnet
from edgecv.frontend.mxnet.mxnet_graph import load_params, load_symbol


def test_removed_numpy_aliases_are_restored_for_gluoncv():
    import_mxnet()
    assert np.float is float and np.int is int and np.bool is bool


@pytest.mark.parametrize(
    ("name", "family", "shapes"),
    [
        ("faster_rcnn_resnet50_v1b_voc", "rcnn", {"data": (1, 3, 512, 512)}),
        ("center_net_resnet18_v1b_dcnv2_voc", "centernet", {"data": (1, 3, 512, 512)}),
        ("simple_pose_resnet18_v1b", "pose", {"data": (1, 3, 256, 192)}),
        ("cifar_resnet20_v1", "classification", {"data": (1, 3, 32, 32)}),
        (
            "siamrpn_alexnet_v2_otb15",
            "other",
            {"template": (1, 3, 127, 127), "search": (1, 3, 287, 287)},
        ),
        ("mobilenet1.0_int8", "int8", {"data": (1, 3, 224, 224)}),
    ],
)
def test_every_family_resolves(name, family, shapes):
    model = zoo.resolve(name)
    assert (model.family, model.input_shapes) == (family, shapes)


def test_video_models_are_refused_as_out_of_scope():
    with pytest.raises(ModelNotFoundError, match="video/action recognition .* out of scope"):
        zoo.resolve("i3d_resnet50_v1_kinetics400")


@pytest.mark.parametrize(
    ("name", "inputs"),
    [
        # two inputs: the exported graph names them data0, data1
        ("siamrpn_alexnet_v2_otb15", {"data0": (1, 3, 127, 127), "data1": (1, 3, 287, 287)}),
        # "Deferred initialization failed" unless one imperative forward comes first
        ("monodepth2_resnet18_posenet_kitti_mono_640x192", {"data": (1, 6, 192, 640)}),
    ],
)
def test_multi_input_and_deferred_init_models_export_and_import(name, inputs, tmp_path):
    exported = zoo.export(name, tmp_path, pretrained=False, calibrate=False)
    assert exported.input_shapes == inputs
    graph = load_symbol(exported.symbol_path)
    imported = from_mxnet(graph, load_params(exported.params_path), exported.input_shapes)
    assert imported.input_names == list(inputs)


def test_a_classifier_that_raises_warning_on_unknown_keywords_builds():
    """darknet53 rejects `pretrained_base` by raising `Warning`, not TypeError."""
    net = zoo.build_net(zoo.resolve("darknet53"))
    assert type(net).__name__ == "DarknetV3"
