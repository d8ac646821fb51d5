"""Parity with MXNet: edgecv's CPU path vs MXNet's own forward pass, same seeded weights.

Classifiers compare logits within the float32 tolerance. Detectors compare class ids
exactly and scores/boxes within tolerance, row by row in MXNet's output order; rows
whose MXNet scores tie (equal within tolerance) may come in either order, so such a
group is compared as a set (see ``edgecv.testing.match_detections``).
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from conftest import mxnet_forward, random_input

from edgecv.board.runtime.cpu import CPUBackend
from edgecv.board.runtime.executor import Executor
from edgecv.codegen.llvm import build_cpu
from edgecv.frontend.mxnet.importer import from_mxnet
from edgecv.frontend.mxnet.mxnet_graph import load_params, load_symbol
from edgecv.lowering import lower
from edgecv.testing import assert_close, match_detections, network_loosening

heavy = pytest.mark.heavy


def depth_loosening(exported) -> float:
    return network_loosening(exported.symbol_path)


def compile_cpu(exported) -> Executor:
    graph = load_symbol(exported.symbol_path)
    params = load_params(exported.params_path)
    imported = from_mxnet(graph, params, {"data": exported.input_shape})
    lowered = lower(imported.mod)
    library = build_cpu(lowered.kernels, tvm.target.Target({"kind": "llvm"}))
    return Executor(lowered.plan, CPUBackend(library), lowered.constants)


@pytest.mark.parametrize(
    "name",
    [
        "mobilenet1.0",
        pytest.param("resnet50_v1", marks=heavy),
        pytest.param("squeezenet1.0", marks=heavy),
    ],
)
def test_classifier_matches_mxnet(exported, name):
    model = exported(name)
    x = random_input(model.input_shape)
    ours = compile_cpu(model).run([x])
    ref = mxnet_forward(model.symbol_path, model.params_path, x)
    assert len(ours) == len(ref) == 1
    assert np.abs(ref[0]).max() > 1e-3, "reference output carries no signal; weights too small"
    assert_close(ours[0], ref[0], name, loosen=depth_loosening(model))
    # The top-5 ranking of the logits is what a user sees; it must agree too.
    assert list(np.argsort(-ours[0][0])[:5]) == list(np.argsort(-ref[0][0])[:5])


@pytest.mark.parametrize(
    "name",
    [
        "ssd_512_mobilenet1.0_voc",
        pytest.param("ssd_512_resnet50_v1_voc", marks=heavy),
        pytest.param("yolo3_mobilenet1.0_coco", marks=heavy),
        pytest.param("yolo3_darknet53_voc", marks=heavy),
    ],
)
def test_detector_matches_mxnet(exported, name):
    model = exported(name)
    x = random_input(model.input_shape)
    ours = compile_cpu(model).run([x])
    ref = mxnet_forward(model.symbol_path, model.params_path, x)
    assert [o.shape for o in ours] == [r.shape for r in ref]
    compared = match_detections(ours, ref, depth_loosening(model), max(model.input_shape[2:]))
    assert compared > 0, "no valid detections to compare: the test would prove nothing"
