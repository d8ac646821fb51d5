"""What a user calls to verify a deployed model, in one place: a whole model against its
independent reference (MXNet for an MXNet graph, ONNX Runtime for an ONNX file:
``compare``), detections row by row (``detections``), a registered operator against its
NumPy reference (``check_op``: ``op_check``), where a package first departs from MXNet
(``probe``), all within the one tolerance table by dtype (``tolerances``: the one place a
tolerance is loosened, with the reason).

    from edgecv.testing import assert_close, check_op, compare_with_onnxruntime
"""

from ..frontend.mxnet.mxnet_graph import with_defined_roi_align
from .compare import (
    compare_with_mxnet,
    compare_with_onnxruntime,
    detection_loosening,
    network_loosening,
    reference_drift,
    rounding_loosening,
)
from .detections import is_detection, match_detections
from .op_check import check_op
from .probe import DivergenceReport, StageDifference, probe_divergence
from .tolerances import (
    FP16_PER_LAYER,
    INT8_PER_LAYER,
    INT8_QDQ_PER_LAYER,
    TOLERANCES,
    assert_close,
    assert_close_fp16,
    assert_close_int8,
    assert_close_int8_against_qdq,
)

__all__ = [
    "FP16_PER_LAYER",
    "INT8_PER_LAYER",
    "INT8_QDQ_PER_LAYER",
    "TOLERANCES",
    "DivergenceReport",
    "StageDifference",
    "assert_close",
    "assert_close_fp16",
    "assert_close_int8",
    "assert_close_int8_against_qdq",
    "check_op",
    "compare_with_mxnet",
    "compare_with_onnxruntime",
    "detection_loosening",
    "is_detection",
    "match_detections",
    "network_loosening",
    "probe_divergence",
    "reference_drift",
    "rounding_loosening",
    "with_defined_roi_align",
]
