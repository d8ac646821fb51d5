"""ONNX ``RoiAlign`` and ``CumSum`` onto edgecv's own tagged kernels.

``RoiAlign`` is :mod:`edgecv.ops.roi_align`, the MXNet importer's ``_contrib_ROIAlign``
kernel, tagged ``roi_align`` with the same attributes (plus ``mode``); ``CumSum`` is the
three-stage scan of :mod:`edgecv.ops.scan`, tagged ``scan``. A GPU build swaps in their
GPU versions (codegen.op_versions), so the fallback and the graph tuner see the same
operators whichever frontend ran.

The two definitions line up: ONNX's ``half_pixel`` is MXNet's ``aligned`` (corners
shifted by -0.5, no 1x1 floor on the size), ``output_half_pixel`` (and opset 10, which
has no such attribute) is MXNet's default, ``sampling_ratio`` 0 is the adaptive grid
of ``sample_ratio`` -1. What the kernels do not compute is refused with one error
naming the attribute, never computed some other way.
"""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax import op as R

from ...board.errors import ConversionError
from .vision import _constant, _shape, _tag

# ONNX's coordinate_transformation_mode -> the kernel's ``aligned``
_ALIGNED = {"half_pixel": True, "output_half_pixel": False}


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _roi_attrs(attrs: dict, opset: int) -> dict:
    """The kernel's attributes from the node's, or a ConversionError naming the one
    the kernel does not compute."""
    from ...ops import roi_align as roi_align_op  # the TIR ops import topi: load on first use

    mode = _text(attrs.get("mode", "avg"))
    if mode not in ("avg", "max"):
        raise ConversionError(f"RoiAlign's mode={mode!r} is not one ONNX defines (avg, max)")
    default = "half_pixel" if opset >= 16 else "output_half_pixel"
    transform = _text(attrs.get("coordinate_transformation_mode", default))
    if transform not in _ALIGNED:
        raise ConversionError(
            f"RoiAlign's coordinate_transformation_mode={transform!r} is not supported "
            f"(edgecv's ROIAlign computes {' and '.join(_ALIGNED)}: export with one of them)"
        )
    ratio = int(attrs.get("sampling_ratio", 0))
    scale = float(attrs.get("spatial_scale", 1.0))
    if ratio < 0:
        raise ConversionError(f"RoiAlign's sampling_ratio={ratio} must be 0 (adaptive) or more")
    if not scale > 0:
        raise ConversionError(f"RoiAlign's spatial_scale={scale} must be positive")
    size = (int(attrs.get("output_height", 1)), int(attrs.get("output_width", 1)))
    if min(size) < 1:
        raise ConversionError(f"RoiAlign's output_height, output_width {size} must be positive")
    return roi_align_op.roi_align_attrs(
        size, scale, ratio if ratio > 0 else -1, aligned=_ALIGNED[transform], mode=mode
    )


def RoiAlign(bb, inputs, attrs, opset):  # noqa: N802 (named after the ONNX op)
    """``RoiAlign`` (opsets 10, 16) as one ``roi_align`` kernel: the batch indices become
    the first column of its ``[batch_index, x1, y1, x2, y2]`` rows (exact in float32 up
    to 2**24 images)."""
    from ...ops import roi_align as roi_align_op

    data, rois, batch = inputs[:3]
    dtype = str(data.ty.dtype)
    if dtype != "float32" or str(rois.ty.dtype) != "float32":
        raise ConversionError(
            f"RoiAlign on {dtype} data and {rois.ty.dtype} rois is not supported "
            "(edgecv's ROIAlign takes float32: export the model in float32)"
        )
    data_shape, rois_shape, batch_shape = _shape(data), _shape(rois), _shape(batch)
    count = rois_shape[0]
    if len(data_shape) != 4 or rois_shape != [count, 4] or batch_shape != [count]:
        raise ConversionError(
            f"RoiAlign takes X [N, C, H, W], rois [R, 4] and batch_indices [R], found "
            f"{data_shape}, {rois_shape} and {batch_shape}"
        )
    kwargs = _roi_attrs(attrs, opset)
    index = R.astype(R.expand_dims(batch, -1), dtype)
    rows = bb.normalize(R.concat([index, rois], axis=1))
    out = bb.emit_te(roi_align_op.roi_align, data, rows, primfunc_name_hint="roi_align", **kwargs)
    shapes = {"data_shape": data_shape, "rois_shape": [count, 5]}
    _tag(bb, out, op="roi_align", dtype=dtype, **shapes, **kwargs)
    return out


def _topi_cumsum(bb, inputs, attrs, dtype: str) -> relax.Expr:
    from tvm import topi

    x = inputs[0]
    axis = int(_constant(inputs[1], "CumSum's axis"))
    exclusive = int(attrs.get("exclusive", 0)) == 1
    reverse = int(attrs.get("reverse", 0)) == 1
    if reverse:
        x = bb.normalize(R.flip(x, axis=axis))
    out = bb.emit_te(topi.cumsum, x, axis, dtype, exclusive, primfunc_name_hint="cumsum")
    return bb.normalize(R.flip(out, axis=axis)) if reverse else out


def CumSum(bb, inputs, attrs, opset):  # noqa: N802 (named after the ONNX op)
    """``CumSum`` (``axis`` a constant) as one ``scan`` of the axis moved last, rows of
    it flipped before and after for ``reverse``; ``exclusive`` is the scan's own."""
    from ...ops import scan as scan_op

    x = inputs[0]
    dtype = str(x.ty.dtype)
    if dtype not in scan_op.SUPPORTED_DTYPES:
        # int64 counts and positions (exporters write them around masks): TOPI's
        # sequential cumsum, untagged (a small integer scan, not worth a GPU kernel)
        return _topi_cumsum(bb, inputs, attrs, dtype)
    shape = _shape(x)
    axis = int(_constant(inputs[1], "CumSum's axis"))
    if not -len(shape) <= axis < len(shape):
        raise ConversionError(f"CumSum's axis={axis} is outside the input's {len(shape)} axes")
    axis = axis % len(shape)
    if min(shape) < 1:
        raise ConversionError(f"CumSum of an empty tensor {shape} is not supported")
    last = axis == len(shape) - 1
    perm = [a for a in range(len(shape)) if a != axis] + [axis]
    moved = x if last else bb.normalize(R.permute_dims(x, perm))
    lead = [shape[a] for a in perm[:-1]]
    n = shape[axis]
    rows = bb.normalize(R.reshape(moved, (int(np.prod(lead, dtype=np.int64)), n)))
    reverse = int(attrs.get("reverse", 0)) == 1
    exclusive = int(attrs.get("exclusive", 0)) == 1
    if reverse:
        rows = bb.normalize(R.flip(rows, axis=1))
    out = bb.emit_te(scan_op.scan, rows, exclusive=exclusive, primfunc_name_hint="scan")
    _tag(bb, out, op="scan", shape=_shape(rows), dtype=dtype, exclusive=exclusive)
    if reverse:
        out = bb.normalize(R.flip(out, axis=1))
    out = bb.normalize(R.reshape(out, (*lead, n)))
    return out if last else bb.normalize(R.permute_dims(out, [int(a) for a in np.argsort(perm)]))
