"""``_contrib_ROIAlign``: bilinear average pooling of regions of a feature map.

MXNet 1.9.1 semantics (checked against its operator in tests/ops/test_roi_align.py).
``data`` is ``(N, C, H, W)``; ``rois`` is ``(R, 5)``, rows ``[batch_index, x1, y1, x2,
y2]`` in input-image coordinates. The output is ``(R, C_out, PH, PW)``. For one ROI:

* its corners are scaled by ``spatial_scale`` (and shifted by -0.5 when ``aligned``);
  unless ``aligned``, width and height are at least 1;
* each of the ``PH x PW`` bins is sampled on a ``gh x gw`` grid of points at the
  centres of equal sub-cells, ``gh = sample_ratio`` if it is positive, else
  ``ceil(roi_height / PH)`` (per ROI: the loop bounds depend on the data);
* a sample outside ``[-1, H] x [-1, W]`` counts as 0; otherwise it is clamped to the
  map and read bilinearly; the bin is the mean of its samples;
* ``mode="max"`` (ONNX's ``RoiAlign``, not MXNet's: checked against ONNX Runtime in
  tests/test_onnx_roi_cumsum.py) makes the bin the largest of its samples' four weighted
  corners ``w * pixel`` instead (ONNX Runtime's definition: not the largest bilinear
  value), a sample outside the map counting as 0;
* with ``position_sensitive`` the bin ``(ph, pw)`` of output channel ``c`` reads input
  channel ``(c * PH + ph) * PW + pw`` (``C_out = C / (PH * PW)``);
* a negative batch index gives a zero row.

One TIR body computes one output element; the CPU version runs the elements in a
parallel loop, the GPU version gives each its own work-item (ROIs vary in size, so
the work per element does too; neighbouring work-items read neighbouring pixels).
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import te, tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

__all__ = ["roi_align", "roi_align_gpu", "roi_align_reference", "roi_align_attrs"]


def roi_align_attrs(
    pooled_size,
    spatial_scale,
    sample_ratio=-1,
    position_sensitive=False,
    aligned=False,
    mode="avg",
) -> dict:
    """Checked, normalized attributes (``pooled_size`` as a pair of ints)."""
    if mode not in ("avg", "max"):
        raise ValueError(f"ROIAlign: mode must be avg or max, found {mode!r}")
    if isinstance(pooled_size, int):
        pooled_size = (pooled_size, pooled_size)
    pooled_size = tuple(int(p) for p in pooled_size)
    if len(pooled_size) == 1:  # MXNet accepts a single number for a square output
        pooled_size = pooled_size * 2
    if len(pooled_size) != 2 or min(pooled_size) < 1:
        raise ValueError(f"ROIAlign: pooled_size must be two positive ints, found {pooled_size}")
    if not spatial_scale > 0:
        raise ValueError(f"ROIAlign: spatial_scale must be positive, found {spatial_scale}")
    return {
        "pooled_size": pooled_size,
        "spatial_scale": float(spatial_scale),
        "sample_ratio": int(sample_ratio),
        "position_sensitive": bool(position_sensitive),
        "aligned": bool(aligned),
        "mode": mode,
    }


def _out_shape(data_shape, rois_shape, attrs: dict) -> tuple[int, int, int, int]:
    data_shape, rois_shape = tuple(data_shape), tuple(rois_shape)
    if len(data_shape) != 4:
        raise ValueError(f"ROIAlign: data must be (N, C, H, W), found shape {data_shape}")
    if len(rois_shape) != 2 or rois_shape[1] != 5:
        raise ValueError(
            f"ROIAlign: rois must be (R, 5) rows [batch_index, x1, y1, x2, y2], "
            f"found shape {rois_shape}"
        )
    ph, pw = attrs["pooled_size"]
    channels = int(data_shape[1])
    if attrs["position_sensitive"]:
        if channels % (ph * pw):
            raise ValueError(
                f"ROIAlign: position_sensitive needs channels divisible by "
                f"pooled_size {ph}x{pw}, found {channels} channels"
            )
        channels //= ph * pw
    return int(rois_shape[0]), channels, ph, pw


# -- NumPy reference -----------------------------------------------------------------


def roi_align_reference(
    data: np.ndarray,
    rois: np.ndarray,
    pooled_size,
    spatial_scale: float,
    sample_ratio: int = -1,
    position_sensitive: bool = False,
    aligned: bool = False,
    mode: str = "avg",
) -> np.ndarray:
    """The operator, written directly from its definition (float64 inside)."""
    attrs = roi_align_attrs(
        pooled_size, spatial_scale, sample_ratio, position_sensitive, aligned, mode
    )
    r_count, c_out, ph_n, pw_n = _out_shape(data.shape, rois.shape, attrs)
    _, _, height, width = data.shape
    out = np.zeros((r_count, c_out, ph_n, pw_n), np.float64)
    offset = 0.5 if aligned else 0.0
    for r in range(r_count):
        b = int(rois[r, 0])
        if b < 0:
            continue
        x1, y1, x2, y2 = (float(v) * spatial_scale - offset for v in rois[r, 1:5])
        rw, rh = x2 - x1, y2 - y1
        if not aligned:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / ph_n, rw / pw_n
        gh = sample_ratio if sample_ratio > 0 else math.ceil(rh / ph_n)
        gw = sample_ratio if sample_ratio > 0 else math.ceil(rw / pw_n)
        count = max(gh * gw, 1)
        for ph in range(ph_n):
            for pw in range(pw_n):
                acc = np.zeros(c_out)
                top = np.full(c_out, -np.inf) if gh * gw > 0 else np.zeros(c_out)
                for iy in range(gh):
                    y = y1 + ph * bh + (iy + 0.5) * bh / gh
                    for ix in range(gw):
                        x = x1 + pw * bw + (ix + 0.5) * bw / gw
                        if y < -1.0 or y > height or x < -1.0 or x > width:
                            top = np.maximum(top, 0.0)
                            continue
                        yy, xx = max(y, 0.0), max(x, 0.0)
                        y0, x0 = int(yy), int(xx)
                        if y0 >= height - 1:
                            y0 = y1_ = height - 1
                            yy = float(y0)
                        else:
                            y1_ = y0 + 1
                        if x0 >= width - 1:
                            x0 = x1_ = width - 1
                            xx = float(x0)
                        else:
                            x1_ = x0 + 1
                        ly, lx = yy - y0, xx - x0
                        hy, hx = 1.0 - ly, 1.0 - lx
                        if position_sensitive:
                            chans = (np.arange(c_out) * ph_n + ph) * pw_n + pw
                        else:
                            chans = np.arange(c_out)
                        m = data[b, chans].astype(np.float64)
                        corners = (
                            hy * hx * m[:, y0, x0],
                            hy * lx * m[:, y0, x1_],
                            ly * hx * m[:, y1_, x0],
                            ly * lx * m[:, y1_, x1_],
                        )
                        acc += sum(corners)
                        top = np.maximum(top, np.max(corners, axis=0))
                out[r, :, ph, pw] = top if mode == "max" else acc / count
    return out.astype(data.dtype)


# -- TIR -----------------------------------------------------------------------------


def _emit_element(data, rois, out, e, attrs: dict) -> None:
    """Statements computing output element ``e`` (flat index into ``out``)."""
    batch, channels, height, width = (int(s) for s in data.shape)
    r_count, c_out, ph_n, pw_n = (int(s) for s in out.shape)
    dtype = data.dtype
    f = lambda v: tirx.const(v, dtype)  # noqa: E731
    pw = e % pw_n
    ph = e // pw_n % ph_n
    c = e // (pw_n * ph_n) % c_out
    r = e // (pw_n * ph_n * c_out)
    chan = (c * ph_n + ph) * pw_n + pw if attrs["position_sensitive"] else c
    offset = f(0.5 if attrs["aligned"] else 0.0)
    scale = f(attrs["spatial_scale"])
    ratio = attrs["sample_ratio"]

    # geometry of this ROI: x1, y1, bin w, bin h (float); grid h, grid w (int)
    geo = T.buffer_proxy(T.alloc_buffer((4,), dtype, scope="local"))
    grid = T.buffer_proxy(T.alloc_buffer((2,), "int32", scope="local"))
    acc = T.buffer_proxy(T.alloc_buffer((1,), dtype, scope="local"))
    pos = T.buffer_proxy(T.alloc_buffer((2,), dtype, scope="local"))  # y, x of a sample
    acc[0] = f(0.0)
    b = tirx.Cast("int32", rois[r, 0])
    with T.If(b >= 0):
        with T.Then():
            if attrs["mode"] == "max":
                acc[0] = tirx.min_value(dtype)
            geo[0] = rois[r, 1] * scale - offset
            geo[1] = rois[r, 2] * scale - offset
            rw = rois[r, 3] * scale - offset - geo[0]
            rh = rois[r, 4] * scale - offset - geo[1]
            if not attrs["aligned"]:
                rw, rh = tirx.max(rw, f(1.0)), tirx.max(rh, f(1.0))
            geo[2] = rw / f(pw_n)
            geo[3] = rh / f(ph_n)
            if ratio > 0:
                grid[0] = ratio
                grid[1] = ratio
            else:
                grid[0] = tirx.Cast("int32", tirx.ceil(geo[3]))
                grid[1] = tirx.Cast("int32", tirx.ceil(geo[2]))
            with T.serial(0, grid[0]) as iy:
                with T.serial(0, grid[1]) as ix:
                    pos[0] = (
                        geo[1]
                        + tirx.Cast(dtype, ph) * geo[3]
                        + (tirx.Cast(dtype, iy) + f(0.5)) * geo[3] / tirx.Cast(dtype, grid[0])
                    )
                    pos[1] = (
                        geo[0]
                        + tirx.Cast(dtype, pw) * geo[2]
                        + (tirx.Cast(dtype, ix) + f(0.5)) * geo[2] / tirx.Cast(dtype, grid[1])
                    )
                    inside = tirx.all(
                        pos[0] >= f(-1.0),
                        pos[0] <= f(height),
                        pos[1] >= f(-1.0),
                        pos[1] <= f(width),
                    )
                    if attrs["mode"] == "max":  # a sample outside the map counts as 0
                        acc[0] = tirx.Select(inside, acc[0], tirx.max(acc[0], f(0.0)))
                    with T.If(inside):
                        with T.Then():
                            y = tirx.max(pos[0], f(0.0))
                            x = tirx.max(pos[1], f(0.0))
                            y0 = tirx.min(tirx.Cast("int32", y), height - 1)
                            x0 = tirx.min(tirx.Cast("int32", x), width - 1)
                            y1 = tirx.min(y0 + 1, height - 1)
                            x1 = tirx.min(x0 + 1, width - 1)
                            # at the last row/column the sample sits on it: weight 0 beyond
                            ly = tirx.Select(y0 >= height - 1, f(0.0), y - tirx.Cast(dtype, y0))
                            lx = tirx.Select(x0 >= width - 1, f(0.0), x - tirx.Cast(dtype, x0))
                            hy, hx = f(1.0) - ly, f(1.0) - lx
                            corners = (
                                hy * hx * data[b, chan, y0, x0],
                                hy * lx * data[b, chan, y0, x1],
                                ly * hx * data[b, chan, y1, x0],
                                ly * lx * data[b, chan, y1, x1],
                            )
                            if attrs["mode"] == "max":
                                acc[0] = tirx.max(acc[0], tirx.max(*corners[:2]))
                                acc[0] = tirx.max(acc[0], tirx.max(*corners[2:]))
                            else:
                                total = corners[0] + corners[1] + corners[2] + corners[3]
                                acc[0] = acc[0] + total
            count = tirx.max(grid[0] * grid[1], 1)
            if attrs["mode"] == "max":  # no sample (an empty aligned ROI): 0
                acc[0] = tirx.Select(grid[0] * grid[1] > 0, acc[0], f(0.0))
            else:
                acc[0] = acc[0] / tirx.Cast(dtype, count)
    out[r, c, ph, pw] = acc[0]


def _cpu_ir(data, rois, out, attrs: dict):
    total = int(np.prod([int(s) for s in out.shape]))
    with IRBuilder() as ib:
        data, rois, out = (T.buffer_proxy(x) for x in (data, rois, out))
        with T.parallel(0, total) as e:
            _emit_element(data, rois, out, e, attrs)
    return ib.get()


def roi_align(
    data: te.Tensor,
    rois: te.Tensor,
    pooled_size,
    spatial_scale: float,
    sample_ratio: int = -1,
    position_sensitive: bool = False,
    aligned: bool = False,
    mode: str = "avg",
) -> te.Tensor:
    """The operator as a TE extern for the CPU build (elements in a parallel loop)."""
    attrs = roi_align_attrs(
        pooled_size, spatial_scale, sample_ratio, position_sensitive, aligned, mode
    )
    shape = _out_shape([int(s) for s in data.shape], [int(s) for s in rois.shape], attrs)
    return te.extern(
        [shape],
        [data, rois],
        lambda ins, outs: _cpu_ir(ins[0], ins[1], outs[0], attrs),
        dtype=[data.dtype],
        in_buffers=[
            tvm.tirx.decl_buffer(data.shape, data.dtype, "data"),
            tvm.tirx.decl_buffer(rois.shape, rois.dtype, "rois"),
        ],
        out_buffers=[tvm.tirx.decl_buffer(shape, data.dtype, "out")],
        name="roi_align",
        tag="roi_align",
    )


def roi_align_gpu(
    data_shape, rois_shape, dtype: str = "float32", threads: int = 256, **attrs
) -> tirx.PrimFunc:
    """The operator as a scheduled GPU PrimFunc ``(data, rois, out)``: one work-item per
    output element, ``threads`` per work-group."""
    attrs = roi_align_attrs(**attrs)
    data_shape = tuple(int(s) for s in data_shape)
    rois_shape = tuple(int(s) for s in rois_shape)
    shape = _out_shape(data_shape, rois_shape, attrs)
    total = int(np.prod(shape))
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("roi_align")
            T.func_attr({"tirx.is_scheduled": True, "global_symbol": "roi_align"})
            data = T.buffer_proxy(T.match_buffer(T.arg("data", T.handle()), data_shape, dtype))
            rois = T.buffer_proxy(T.match_buffer(T.arg("rois", T.handle()), rois_shape, dtype))
            out = T.buffer_proxy(T.match_buffer(T.arg("out", T.handle()), shape, dtype))
            bx, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.x")
            with T.launch_thread(bx, max(1, -(-total // threads))):
                with T.launch_thread(tx, threads):
                    e = bx * threads + tx
                    with T.If(e < total):
                        with T.Then():
                            _emit_element(data, rois, out, e, attrs)
    return ib.get()
