"""edgecv's own converters for the ONNX ops whose form from TVM's converter the pipeline
reads badly; each takes precedence over TVM's and may hand the node back to it.

A converter is a plain function named after the ONNX op: ``(bb, inputs, attrs, opset) ->
relax.Expr``, or None to let TVM's converter take the node. ``inputs`` are Relax
expressions (None for an omitted optional input), ``attrs`` the attributes as TVM's
importer parsed them. The exporters' detection patterns (NonMaxSuppression, TopK,
RoiAlign) onto edgecv's tagged vision operators belong here too.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax
from tvm.relax import op as R

from .torchvision_detection import Detections
from .torchvision_keypoints import HeatmapKeypoints
from .torchvision_levels import BatchedNMS, LevelCandidates
from .torchvision_masks import PasteMasks
from .torchvision_rcnn import FilteredNMS, LevelRoiAlign
from .ultralytics_nms import NMS as UltralyticsNMS
from .vision import NonMaxSuppression, TopK
from .vision_roi import CumSum, RoiAlign

Converter = Callable[..., relax.Expr | None]


def _scalar(expr) -> float | None | bool:
    """A constant bound's value (None for NaN, which ONNX reads as no bound), or False
    when the bound is computed at run time."""
    if expr is None:
        return None
    if not isinstance(expr, tvm.ir.expr.Constant) or expr.value.numpy().size != 1:
        return False
    value = float(expr.value.numpy().reshape(()))
    return None if math.isnan(value) else value


def Clip(bb, inputs, attrs, opset):  # noqa: N802 (named after the ONNX op)
    """``R.clip`` (or one ``R.maximum`` / ``R.minimum``) on constant bounds, as the MXNet
    importer writes ``clip``: the graph tuner keeps it in a packed layout
    (:mod:`edgecv.graph_tuner.activations`), where TVM's two ``topi`` kernels would force
    the tensor back to NCHW."""
    x = inputs[0]
    if opset < 11:
        lo, hi = attrs.get("min"), attrs.get("max")
    else:
        lo, hi = (_scalar(inputs[i] if len(inputs) > i else None) for i in (1, 2))
        if lo is False or hi is False:
            return None
    dtype = str(x.ty.dtype)
    if lo is not None and hi is not None:
        if np.dtype(dtype).kind == "f":
            return R.clip(x, float(lo), float(hi))
        return R.clip(x, int(lo), int(hi))
    out = x
    if lo is not None:
        out = bb.normalize(R.maximum(out, relax.const(lo, dtype)))
    if hi is not None:
        out = bb.normalize(R.minimum(out, relax.const(hi, dtype)))
    return out


def Split(bb, inputs, attrs, opset):  # noqa: N802 (named after the ONNX op)
    """A ``Split`` into one output is its input (torchvision's detectors unbind a batch of
    one image so): TVM's converter writes it as an ``R.split`` without sections whose
    result is a tensor, not a tuple, which the graph tuner's layout conversion rejects
    (the whole model then builds in NCHW). Other splits go to TVM's converter."""
    return inputs[0] if attrs["tvm_custom"]["num_outputs"] == 1 else None


CONVERTERS: dict[str, Converter] = {
    "BatchedNMS": BatchedNMS,  # torchvision_levels' node
    "Clip": Clip,
    "CumSum": CumSum,
    "Detections": Detections,  # torchvision_detection.rewrite's node
    "FilteredNMS": FilteredNMS,  # torchvision_rcnn's nodes
    "HeatmapKeypoints": HeatmapKeypoints,  # torchvision_keypoints' node
    "LevelCandidates": LevelCandidates,  # torchvision_levels' node
    "LevelRoiAlign": LevelRoiAlign,
    "NonMaxSuppression": NonMaxSuppression,
    "PasteMasks": PasteMasks,  # torchvision_masks' node
    "RoiAlign": RoiAlign,
    "Split": Split,
    "TopK": TopK,
    "UltralyticsNMS": UltralyticsNMS,  # ultralytics_nms.rewrite's node
}
