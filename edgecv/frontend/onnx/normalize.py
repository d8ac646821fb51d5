"""Relax rewrites of the forms TVM's ONNX converters write into those edgecv's pipeline
reads (the forms the MXNet converters emit), run once on the imported module."""

from __future__ import annotations

import tvm
from tvm import relax


def normalize(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` in the forms the pipeline expects: ``nn.batch_norm`` (a triple whose
    statistics outputs inference never reads) decomposed into the per-channel subtract,
    divide, multiply and add that fuse into the convolution before it, as the MXNet
    importer writes ``BatchNorm``; the triple's ``[0]`` read straight from its first
    field (the graph tuner would otherwise see a tuple item, which keeps NCHW) and the
    rest dropped."""
    return tvm.transform.Sequential(
        [
            relax.transform.DecomposeOpsForInference(),
            relax.transform.CanonicalizeBindings(),
            relax.transform.DeadCodeElimination(),
        ]
    )(mod)
