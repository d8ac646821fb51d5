"""Winograd convolution F(m x m, 3 x 3) in the packed layout: what a stride-1 3x3
``conv2d`` in ``NCHW[x]c`` may legalize to instead of the direct ``conv2d_NCHWc``.

Per output tile of ``m x m`` pixels the input tile of ``a x a`` (``a = m + 2``) is
transformed (``V = B^T d B``), multiplied elementwise with the transformed weights
(``U = G g G^T``, computed here with NumPy: the weights are constants) and transformed
back (``Y = A^T M A``). The elementwise product summed over input channels is ``a * a``
independent matrix products, which is where the time goes; they do
``m * m * 9 / (a * a)`` of the direct convolution's multiply-adds: 4x fewer for
``m = 4``, 2.25x for ``m = 2``.

The loop nests of the kernel, named for the CPU rule that schedules them
(:mod:`edgecv.schedules.cpu.winograd`):

- ``winograd_input_rows`` ``[a, C/ib, N*TH, TW, a, ib]`` and ``winograd_input``
  ``[a*a, C/ib, N*TH, TW, ib]``: the transformed input tiles, one axis of the tile at a
  time (``2 a^3`` terms a tile instead of ``a^4``);
- ``winograd_gemm`` ``[a*a, O/ob, N*TH, TW, ob]``: per ``a*a`` position, tiles x input
  channels times input x output channels, in the shape of a 1x1 ``conv2d_NCHWc``;
- ``winograd_output_cols`` ``[O/ob, N*TH, TW, a, m, ob]`` and ``winograd_output``
  ``[N, O/ob, OH, OW, ob]``: the output transform likewise, then the output, where the
  fused epilogue (bias, activation, residual add) follows.

The transforms are written out as sums of the nonzero terms of ``B`` and ``A``, one
expression per position, chosen by ``Select`` on the position: once the rule unrolls the
positions, each ``Select`` folds to its one sum, and no multiply by 0 or 1 is left.
The matrices come from TVM's Cook-Toom construction with its error-minimizing
interpolation points (``topi.nn.winograd_util``).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te, tirx, topi

INPUT_ROWS = "winograd_input_rows"
INPUT = "winograd_input"
GEMM = "winograd_gemm"
OUTPUT_COLS = "winograd_output_cols"
OUTPUT = "winograd_output"


# The output tile sides offered: F(2x2, 3x3) and F(4x4, 3x3). Larger tiles lose float32
# accuracy fast (Barabasz et al.'s error estimates grow ~3x per step past F(4, 3)).
SIDES = (2, 4)


def _shape(expr: relax.Expr) -> tuple[int, ...]:
    return tuple(int(d) for d in expr.ty.shape.values)


def signature(call: relax.Call) -> tuple:
    """A conv2d call's identity in any layout: data in NCHW, weights in OIHW, padding
    (the graph tuner chooses per convolution before packing, legalization finds the
    choice after)."""
    data, weight = _shape(call.args[0]), _shape(call.args[1])
    if len(data) == 5:
        data = (data[0], data[1] * data[4], data[2], data[3])
    if len(weight) == 6:
        weight = (weight[0] * weight[5], weight[1] * weight[4], weight[2], weight[3])
    return (data, weight, tuple(int(p) for p in call.attrs.padding))


def eligible(call: relax.Call, weight: relax.Expr | None = None) -> bool:
    """Whether Winograd can run this conv2d: 3x3, stride 1, no dilation, groups 1,
    float32, weights known at build time (they are transformed then: ``weight``, the
    weights' value where ``call`` names them by a variable); the packed layout is
    checked by the caller."""
    attrs = call.attrs
    return (
        int(attrs.groups) == 1
        and [int(s) for s in attrs.strides] == [1, 1]
        and [int(d) for d in attrs.dilation] == [1, 1]
        and signature(call)[1][2:] == (3, 3)
        and str(call.args[0].ty.dtype) == "float32"
        and isinstance(call.args[1] if weight is None else weight, tvm.ir.expr.Constant)
    )


def matrices(m: int, r: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A ``[a, m]``, B ``[a, a]``, G ``[a, r]``) of F(m, r), in float64."""
    from tvm.topi.nn.winograd_util import _cook_toom_convolution, _interpolation_points

    points = _interpolation_points(m + r - 1)
    a, b, g = _cook_toom_convolution(points, m, r)
    return np.asarray(a, np.float64), np.asarray(b, np.float64), np.asarray(g, np.float64)


def transform_weights(weight: np.ndarray, m: int) -> np.ndarray:
    """Packed 3x3 weights ``[O/ob, C/ib, 3, 3, ib, ob]`` -> ``U`` as the GEMM reads it,
    ``[a*a, O/ob, C/ib, ib, ob]`` (float32)."""
    if weight.ndim != 6 or weight.shape[2:4] != (3, 3):
        raise ValueError(f"Winograd needs packed 3x3 weights, got shape {weight.shape}")
    _, _, g = matrices(m)
    u = np.einsum("ak,ocklij,bl->abocij", g, weight.astype(np.float64), g)
    alpha = g.shape[0]
    return np.ascontiguousarray(u.reshape(alpha * alpha, *u.shape[2:]), dtype=np.float32)


def _terms(row: np.ndarray, pick) -> tirx.PrimExpr:
    """``sum(row[k] * pick(k))`` over the nonzero ``row[k]``, without multiplying by 1."""
    total = None
    for k, coef in enumerate(row):
        if coef == 0:
            continue
        value = pick(k)
        if coef == -1:
            value = -value
        elif coef != 1:
            value = value * tirx.const(float(coef), "float32")
        total = value if total is None else total + value
    return total if total is not None else tirx.const(0.0, "float32")


def _by_position(index: tirx.PrimExpr, count: int, expr_of) -> tirx.PrimExpr:
    """``expr_of(p)`` for the position ``p == index`` (a chain of Selects that folds
    once ``index`` is a constant)."""
    expr = expr_of(count - 1)
    for p in range(count - 2, -1, -1):
        expr = tirx.Select(index == p, expr_of(p), expr)
    return expr


def winograd_conv2d_nchwc(data: te.Tensor, u: te.Tensor, padding, m: int, out_dtype: str):
    """Stride-1 3x3 convolution of packed ``data`` ``[N, C/ib, H, W, ib]`` with the
    transformed weights ``u`` (:func:`transform_weights`); output ``[N, O/ob, OH, OW, ob]``."""
    n, chunks, height, width, block = (int(d) for d in data.shape)
    positions, out_chunks, _, _, out_block = (int(d) for d in u.shape)
    a_mat, b_mat, _ = matrices(m)
    alpha = m + 2
    top, left, bottom, right = padding
    oh, ow = height + top + bottom - 2, width + left + right - 2
    th, tw = -(-oh // m), -(-ow // m)
    # the input padded to whole tiles (the last tile reads past the conv's own padding)
    padded = topi.nn.pad(
        data,
        [0, 0, top, left, 0],
        [0, 0, th * m + 2 - height - top, tw * m + 2 - width - left, 0],
        name="data_pad",
    )
    # V = B^T d B in two halves, each a sum over one axis of the tile:
    # rows[e, j] = sum_i bt[e, i] d[i, j], then V[e, v] = sum_j bt[v, j] rows[e, j]
    bt = b_mat.T

    def input_rows(e, c, row, col, j, lane):
        b, y = row // th, row % th
        return _by_position(
            e,
            alpha,
            lambda pe: _terms(bt[pe], lambda i: padded[b, c, y * m + i, col * m + j, lane]),
        )

    rows = te.compute(
        (alpha, chunks, n * th, tw, alpha, block), input_rows, name=INPUT_ROWS, tag=INPUT_ROWS
    )

    def input_tile(t, c, row, col, lane):
        e = t // alpha
        return _by_position(
            t % alpha, alpha, lambda pv: _terms(bt[pv], lambda j: rows[e, c, row, col, j, lane])
        )

    v = te.compute((positions, chunks, n * th, tw, block), input_tile, name=INPUT, tag=INPUT)
    rco = te.reduce_axis((0, chunks), name="rco")
    rci = te.reduce_axis((0, block), name="rci")
    gemm = te.compute(
        (positions, out_chunks, n * th, tw, out_block),
        lambda t, o, row, col, lane: te.sum(
            v[t, rco, row, col, rci].astype(out_dtype) * u[t, o, rco, rci, lane].astype(out_dtype),
            axis=[rco, rci],
        ),
        name=GEMM,
        tag=GEMM,
    )
    # Y = A^T M A likewise: cols[e, j] = sum_v M[e, v] at[j, v], Y[i, j] = sum_e at[i, e] cols[e, j]
    at = a_mat.T

    def output_cols(o, row, col, e, j, lane):
        return _by_position(
            j, m, lambda pj: _terms(at[pj], lambda w: gemm[e * alpha + w, o, row, col, lane])
        )

    cols = te.compute(
        (out_chunks, n * th, tw, alpha, m, out_block),
        output_cols,
        name=OUTPUT_COLS,
        tag=OUTPUT_COLS,
    )

    def output_pixel(b, o, y, x, lane):
        row, col = b * th + y // m, x // m
        return _by_position(
            y % m, m, lambda pi: _terms(at[pi], lambda e: cols[o, row, col, e, x % m, lane])
        )

    return te.compute((n, out_chunks, oh, ow, out_block), output_pixel, name=OUTPUT, tag=OUTPUT)
