"""Packed convolutions as TE computes: what ``relax.nn.conv2d`` in an ``NCHW[x]c``
layout legalizes to.

TVM's default legalization refuses layouts with a channel block, which the graph tuner
gives convolutions. The Relax passes (:func:`.relax_passes.fusion_passes`) pass
:func:`legalize_map` to ``LegalizeOps(customize_legalize_map=...)``; it turns a packed
``conv2d`` into one of two computes in the style of ``topi.nn.conv2d_NCHWc``:

- ``conv2d_NCHWc``: data ``[N, C/ib, H, W, ib]`` (or plain ``[N, C, H, W]`` for a first
  convolution whose channels do not divide into blocks), weights
  ``[O/ob, C/ib, KH, KW, ib, ob]`` (``OIHW{ib}i{ob}o``; ``[O/ob, C, KH, KW, ob]`` with
  plain data), output ``[N, O/ob, OH, OW, ob]``. Unlike topi's, the input channel is
  two reduction axes (block, then lane), so a schedule reads the input block by block
  without division in its indices.
- ``depthwise_conv2d_NCHWc``: data and output ``[N, C/b, H, W, b]``, weights
  ``[C/b, 1, KH, KW, 1, b]`` (``OIHW1i{b}o``).

The weights arrive in their packed layout as constants (``ConvertLayout`` inserts the
transform, ``FoldConstant`` applies it at build time): a packed convolution never
repacks its weights as it runs. Plain convolutions keep TVM's own legalization.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te, topi

from .winograd import eligible, transform_weights, winograd_conv2d_nchwc
from .winograd import signature as winograd_signature

CONV2D = "conv2d_NCHWc"
DEPTHWISE = "depthwise_conv2d_NCHWc"
WINOGRAD = "winograd_conv2d_NCHWc"
# Two steps of u8 x s8 pairs summed in int16 stay exact when data <= 127 and weights
# <= 63: 2 x (2 x 127 x 63) = 32,004 < 32,767.
PAIRS_WEIGHT_MAX = 63


def sums_in_pairs(kernel_h: int, kernel_w: int) -> bool:
    """Whether an INT8 convolution of this kernel size sums two steps in int16 where the
    CPU's dot product allows it (``int8_pairs``): the spatial ones, which gain from it,
    where a 1x1 gains little (benchmarks/results/int8_cpu-2026-11-27-zen3.md, section 3).
    The INT8 step gives exactly the tensors they read 7-bit data, so the 1x1s keep 8
    bits."""
    return kernel_h * kernel_w > 1


# not "conv2d_int8": op_name would read its 8 as a repeat number
CONV2D_INT8 = "conv2d_int8_NCHW"
CONV2D_INT8_PACKED = "conv2d_int8_NCHWc"


def fast_exp_for(target: tvm.target.Target) -> bool:
    """Whether a build for ``target`` computes sigmoid and SiLU with :func:`vector_exp`
    rather than TIR's ``exp``: on CPUs, where LLVM turns ``exp`` into one call of the C
    library's ``expf`` per lane (a vector loop of calls), while the polynomial
    vectorizes; a [16, 320, 320] sigmoid ran 5x faster so (a YOLOv8n has such an
    activation after each of its convolutions). GPUs keep their hardware ``exp``. One
    answer for the pipeline, the graph tuner and the tuning tasks."""
    return target.kind.name == "llvm"


def fast_sigmoid(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """``relax.sigmoid`` of float32 as ``1 / (1 + e^-x)`` by :func:`vector_exp`
    (:func:`fast_exp_for`); other dtypes as TVM legalizes them."""
    if str(call.args[0].ty.dtype) != "float32":
        return tvm.ir.Op.get("relax.sigmoid").get_attr("FLegalize")(bb, call)
    return bb.call_te(_elementwise(_sigmoid), call.args[0], primfunc_name_hint="tir_sigmoid")


def fast_silu(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """``relax.nn.silu`` of float32 as ``x * sigmoid(x)`` with :func:`fast_sigmoid`'s
    sigmoid; other dtypes as TVM legalizes them."""
    if str(call.args[0].ty.dtype) != "float32":
        return tvm.ir.Op.get("relax.nn.silu").get_attr("FLegalize")(bb, call)
    silu = _elementwise(lambda x: x * _sigmoid(x))
    return bb.call_te(silu, call.args[0], primfunc_name_hint="silu")


def _elementwise(f):
    """A TE compute of ``f`` applied to each element of a tensor, the element bound once
    (``let``): a schedule inlining the tensor's producers into this compute substitutes
    them once, however often ``f`` reads its argument (a fused concatenation and reshape
    repeated in each read of an ``exp``'s input made YOLOv8n's head kernel 5x slower)."""

    def compute(x: te.Tensor) -> te.Tensor:
        def element(*i):
            value = tvm.tirx.Var("v", "float32")
            return tvm.tirx.Let(value, x(*i), f(value))

        return te.compute(x.shape, element, name="activation", tag="elemwise")

    return compute


def _sigmoid(x):
    one = tvm.tirx.const(1.0, "float32")
    return one / (one + vector_exp(-x))


# e^r on |r| <= ln(2)/2 by its Taylor series to r^6 (the remainder r^7/7! e^r is under
# 1.7e-7 there, about an ulp); ln(2) in two parts, so n ln(2) of the range reduction is
# exact for every n of a float32 exponent (the high part has 9 significant bits)
_TAYLOR = [1.0, 1.0, 1 / 2, 1 / 6, 1 / 24, 1 / 120, 1 / 720]
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4
# e^87.3 is within float32's normal range and 2^n stays a normal number for |n| <= 126
_EXP_BOUND = 87.3


def vector_exp(v):
    """``e^v`` of a float32 TIR expression in plain arithmetic that LLVM vectorizes:
    ``v = n ln(2) + r`` with integer ``n`` and ``|r| <= ln(2)/2``, ``e^r`` by a
    polynomial, ``2^n`` by writing ``n + 127`` into the float's exponent bits. ``v`` is
    clamped to +-87.3 (``e^-87.3`` is 1.2e-38; sigmoid and SiLU saturate long before)."""
    f32 = "float32"
    const = lambda c: tvm.tirx.const(c, f32)  # noqa: E731
    v = tvm.tirx.max(tvm.tirx.min(v, const(_EXP_BOUND)), const(-_EXP_BOUND))
    n = tvm.tirx.floor(v * const(1.4426950408889634) + const(0.5))
    r = v - n * const(_LN2_HI) - n * const(_LN2_LO)
    poly = const(_TAYLOR[-1])
    for c in reversed(_TAYLOR[:-1]):
        poly = poly * r + const(c)
    bits = tvm.tirx.shift_left(n.astype("int32") + 127, tvm.tirx.const(23, "int32"))
    return poly * tvm.tirx.reinterpret(f32, bits)


def legalize_map(
    winograd: dict | None = None,
    int8_block: int | None = None,
    int8_pairs: bool = False,
    fast_exp: bool = False,
) -> dict:
    """The ``customize_legalize_map`` for ``LegalizeOps``: packed conv2d, and layout
    transforms of boolean tensors.

    ``winograd`` maps a convolution's :func:`~.winograd.signature` to the output tile
    side ``m`` it runs with in Winograd's algorithm (:mod:`.winograd`); a packed
    convolution not in it runs direct. ``int8_block``: the int32 lanes of the CPU's
    dot-product instruction (:mod:`edgecv.schedules.cpu.conv2d_int8`); uint8 x int8
    convolutions it applies to take their weights packed for it, at build time
    (:func:`conv2d_int8_packed`). ``int8_pairs``: the INT8 step promises 7-bit data
    (0..127) to every uint8 x int8 convolution :func:`sums_in_pairs` names; those in the
    packed layout with 7-bit weights take their weights in pairs of steps
    (:func:`conv2d_int8_nchwc`), which the CPU rule sums in int16
    (:mod:`edgecv.schedules.cpu.conv2d_int8`). ``fast_exp``: sigmoid and SiLU by
    :func:`fast_sigmoid` and :func:`fast_silu` (:func:`fast_exp_for`)."""
    chosen = dict(winograd or {})

    def conv2d(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        if int8_block:
            packed = legalize_conv2d_int8(bb, call, int8_block, int8_pairs)
            if packed is not None:
                return packed
        return legalize_conv2d(bb, call, chosen)

    legalized = {"relax.nn.conv2d": conv2d, "relax.layout_transform": legalize_layout_transform}
    if fast_exp:
        legalized.update({"relax.sigmoid": fast_sigmoid, "relax.nn.silu": fast_silu})
    return legalized


def legalize_layout_transform(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """TVM's legalization of ``layout_transform``, except for boolean tensors (a mask
    computed between packed convolutions, as monodepth2's decoder does): TVM pads every
    dtype without "int" in its name with float 0.0, which TIR refuses for a bool buffer
    ("fills padding with ... float32"). A bool tensor moves as int8 instead."""
    default = tvm.ir.Op.get("relax.layout_transform").get_attr("FLegalize")
    data = call.args[0]
    if str(data.ty.dtype) != "bool":
        return default(bb, call)
    as_int = bb.emit(bb.call_te(topi.cast, data, "int8", primfunc_name_hint="cast"))
    moved = default(bb, bb.normalize(relax.Call(call.op, [as_int], call.attrs)))
    return bb.call_te(topi.cast, bb.emit(moved), "bool", primfunc_name_hint="cast")


def legalize_conv2d(
    bb: relax.BlockBuilder, call: relax.Call, winograd: dict | None = None
) -> relax.Expr:
    """A ``relax.nn.conv2d`` call as a ``call_tir``: TVM's legalization for plain
    layouts, :func:`conv2d_nchwc` / :func:`depthwise_conv2d_nchwc` for packed ones, or
    Winograd's (:func:`.winograd.winograd_conv2d_nchwc`) for those in ``winograd``."""
    attrs = call.attrs
    layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout))
    if layouts == ("NCHW", "OIHW", "NCHW"):
        return _default_conv2d(bb, call)
    if not str(attrs.out_layout).startswith("NCHW") or len(layouts[2]) == 4:
        raise ValueError(f"edgecv cannot legalize conv2d with layouts {layouts}")
    out_dtype = str(attrs.out_dtype) if attrs.out_dtype is not None else ""
    args = dict(
        strides=[int(s) for s in attrs.strides],
        padding=[int(p) for p in attrs.padding],
        dilation=[int(d) for d in attrs.dilation],
        out_dtype=out_dtype
        if out_dtype not in ("", "void", "None")
        else str(call.args[0].ty.dtype),
    )
    weight = _bound_value(bb, call.args[1])
    packed = len(call.args[0].ty.shape) == 5
    side = None
    if winograd and packed and eligible(call, weight):
        side = winograd.get(winograd_signature(call))
    if side:
        weights = transform_weights(weight.value.numpy(), side)
        return bb.call_te(
            winograd_conv2d_nchwc,
            call.args[0],
            relax.const(weights),
            padding=args["padding"],
            m=side,
            out_dtype=args["out_dtype"],
            primfunc_name_hint=WINOGRAD,
        )
    if int(attrs.groups) == 1:
        return bb.call_te(
            conv2d_nchwc, call.args[0], call.args[1], **args, primfunc_name_hint=CONV2D
        )
    return bb.call_te(
        depthwise_conv2d_nchwc, call.args[0], call.args[1], **args, primfunc_name_hint=DEPTHWISE
    )


def legalize_conv2d_int8(bb: relax.BlockBuilder, call: relax.Call, block: int, pairs: bool = False):
    """A ``uint8 x int8 -> int32`` NCHW conv2d (groups 1, ``block`` | output channels,
    4 | input channels) with constant weights as :func:`conv2d_int8_packed` (or, packed
    data, :func:`conv2d_int8_nchwc`), its weights packed now; None for any other
    convolution. ``pairs``: data promised within 0..127; a packed convolution whose
    weights are within 7 bits and whose data blocks hold whole 8s takes them packed in
    pairs of steps, ``[O/L, C/8, KH, KW, 2, L, 4]``."""
    attrs = call.attrs
    data, weight_expr = call.args
    layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout))
    if int(attrs.groups) != 1 or str(data.ty.dtype) != "uint8" or str(call.ty.dtype) != "int32":
        return None
    weight = _bound_value(bb, weight_expr)
    if not isinstance(weight, tvm.ir.expr.Constant) or str(weight.ty.dtype) != "int8":
        return None
    w = _plain_weights(weight.value.numpy(), layouts)
    if w is None:
        return None
    out_channels, in_channels, kh, kw = w.shape
    packed_data = len(data.ty.shape) == 5
    if out_channels % block or in_channels % 4:
        return None
    if packed_data and (int(data.ty.shape[4]) % 4 or layouts[2] != f"NCHW{block}c"):
        return None
    pairs = (
        pairs
        and sums_in_pairs(kh, kw)
        and packed_data
        and int(data.ty.shape[4]) % 8 == 0
        and int(np.abs(w.astype(np.int32)).max(initial=0)) <= PAIRS_WEIGHT_MAX
    )
    if pairs:  # [O/L, I/8, KH, KW, 2, L, 4]: the two steps summed in int16 side by side
        packed = w.reshape(out_channels // block, block, in_channels // 8, 2, 4, kh, kw)
        packed = np.ascontiguousarray(packed.transpose(0, 2, 5, 6, 3, 1, 4))
    else:  # [O/L, I/4, KH, KW, L, 4]: the L x 4 bytes one instruction reads
        packed = w.reshape(out_channels // block, block, in_channels // 4, 4, kh, kw)
        packed = np.ascontiguousarray(packed.transpose(0, 2, 4, 5, 1, 3))
    return bb.call_te(
        conv2d_int8_nchwc if packed_data else conv2d_int8_packed,
        data,
        relax.const(packed),
        strides=[int(v) for v in attrs.strides],
        padding=[int(v) for v in attrs.padding],
        dilation=[int(v) for v in attrs.dilation],
        primfunc_name_hint=CONV2D_INT8_PACKED if packed_data else CONV2D_INT8,
    )


def _plain_weights(w: np.ndarray, layouts: tuple[str, str, str]) -> np.ndarray | None:
    """OIHW weights from the ``kernel_layout`` the graph tuner gave them (OIHW, or
    ``OIHW{ib}i{ob}o`` for packed data), None for another layout."""
    data_layout, kernel_layout, _ = layouts
    if data_layout == "NCHW" and kernel_layout == "OIHW":
        return w
    if w.ndim != 6 or not kernel_layout.startswith("OIHW") or not data_layout.startswith("NCHW"):
        return None
    out_chunks, in_chunks, kh, kw, ib, ob = w.shape
    if kernel_layout != f"OIHW{ib}i{ob}o" or data_layout != f"NCHW{ib}c":
        return None
    return w.transpose(0, 5, 1, 4, 2, 3).reshape(out_chunks * ob, in_chunks * ib, kh, kw)


def conv2d_int8_packed(data, kernel, strides, padding, dilation) -> te.Tensor:
    """NCHW conv2d of uint8 data and int8 weights packed ``[O/L, I/4, KH, KW, L, 4]``,
    summed in int32: the reduction axes as TVM's own NCHW conv2d has them (input channel,
    kernel row, kernel column), so the CPU rule finds the same loop nest."""
    out_blocks, _, kh, kw, block, _ = (int(d) for d in kernel.shape)
    n, channels, height, width = (int(d) for d in data.shape)
    (sh, sw), (dh, dw) = strides, dilation
    oh, ow, ry, rx = _window(height, width, kh, kw, strides, padding, dilation)
    padded = _pad(data, padding, False)
    rc = te.reduce_axis((0, channels), name="rc")
    return te.compute(
        (n, out_blocks * block, oh, ow),
        lambda b, co, y, x: te.sum(
            padded[b, rc, y * sh + ry * dh, x * sw + rx * dw].astype("int32")
            * kernel[co // block, rc // 4, ry, rx, co % block, rc % 4].astype("int32"),
            axis=[rc, ry, rx],
        ),
        name=CONV2D_INT8,
        tag=CONV2D_INT8,
    )


def conv2d_int8_nchwc(data, kernel, strides, padding, dilation) -> te.Tensor:
    """conv2d of uint8 data ``[N, C/ib, H, W, ib]`` (``NCHW{ib}c``) and int8 weights
    packed ``[O/L, C/4, KH, KW, L, 4]``, summed in int32 into ``[N, O/L, OH, OW, L]``.
    The input channel is three reduction axes (block, quad within the block, lane of
    the quad): the four bytes one dot-product step reads are contiguous in the data.
    Weights packed in pairs of steps, ``[O/L, C/8, KH, KW, 2, L, 4]``
    (:func:`legalize_conv2d_int8`), make it four: block, pair, step of the pair, lane."""
    pairs = len(kernel.shape) == 7
    out_blocks, kh, kw, block = (int(kernel.shape[i]) for i in (0, 2, 3, -2))
    n, chunks, height, width, in_block = (int(d) for d in data.shape)
    (sh, sw), (dh, dw) = strides, dilation
    oh, ow, ry, rx = _window(height, width, kh, kw, strides, padding, dilation)
    padded = _pad(data, padding, True)
    quads = in_block // 4
    rco = te.reduce_axis((0, chunks), name="rco")
    rc4 = te.reduce_axis((0, 4), name="rc4")
    if pairs:
        rcp = te.reduce_axis((0, quads // 2), name="rcp")
        rq = te.reduce_axis((0, 2), name="rq")
        steps, quad = [rcp, rq], rcp * 2 + rq

        def weight(co, ry, rx, c):
            return kernel[co, rco * (quads // 2) + rcp, ry, rx, rq, c, rc4]

    else:
        rcq = te.reduce_axis((0, quads), name="rcq")
        steps, quad = [rcq], rcq

        def weight(co, ry, rx, c):
            return kernel[co, rco * quads + rcq, ry, rx, c, rc4]

    return te.compute(
        (n, out_blocks, oh, ow, block),
        lambda b, co, y, x, c: te.sum(
            padded[b, rco, y * sh + ry * dh, x * sw + rx * dw, quad * 4 + rc4].astype("int32")
            * weight(co, ry, rx, c).astype("int32"),
            axis=[rco, ry, rx, *steps, rc4],
        ),
        name=CONV2D_INT8_PACKED,
        tag=CONV2D_INT8_PACKED,
    )


def _bound_value(bb: relax.BlockBuilder, expr: relax.Expr) -> relax.Expr:
    """What a variable is bound to, through chains of variables (the packed weights are
    a constant bound to a variable once the graph tuner folded their transform)."""
    while isinstance(expr, relax.Var):
        bound = bb.lookup_binding(expr)
        if bound is None:
            break
        expr = bound
    return expr


def _default_conv2d(bb, call):
    from tvm.relax.transform.legalize_ops.nn import _nn_conv2d

    return _nn_conv2d(bb, call)


def _pad(data: te.Tensor, padding, packed: bool) -> te.Tensor:
    top, left, bottom, right = padding
    if not any(padding):
        return data
    before = [0, 0, top, left] + ([0] if packed else [])
    after = [0, 0, bottom, right] + ([0] if packed else [])
    return topi.nn.pad(data, before, after, name="data_pad")


def _window(height: int, width: int, kh: int, kw: int, strides, padding, dilation):
    """Output rows and columns of a ``kh`` x ``kw`` window sliding over ``height`` x
    ``width`` (padding top, left, bottom, right), and its row and column reduction
    axes."""

    def out_size(size: int, kernel: int, stride: int, dilation: int, pad: int) -> int:
        return (size + pad - (kernel - 1) * dilation - 1) // stride + 1

    oh = out_size(height, kh, strides[0], dilation[0], padding[0] + padding[2])
    ow = out_size(width, kw, strides[1], dilation[1], padding[1] + padding[3])
    return oh, ow, te.reduce_axis((0, kh), name="ry"), te.reduce_axis((0, kw), name="rx")


def conv2d_nchwc(data, kernel, strides, padding, dilation, out_dtype) -> te.Tensor:
    """Direct convolution, groups 1, output channels in blocks (see the module docstring)."""
    packed = len(data.shape) == 5
    height, width = int(data.shape[2]), int(data.shape[3])
    if packed:
        chunks, kh, kw, block, out_block = (int(d) for d in kernel.shape[1:])
    else:
        channels, kh, kw, out_block = (int(d) for d in kernel.shape[1:])
    out_chunks = int(kernel.shape[0])
    (sh, sw), (dh, dw) = strides, dilation
    oh, ow, ry, rx = _window(height, width, kh, kw, strides, padding, dilation)
    padded = _pad(data, padding, packed)
    shape = (int(data.shape[0]), out_chunks, oh, ow, out_block)
    if packed:
        rco = te.reduce_axis((0, chunks), name="rco")
        rci = te.reduce_axis((0, block), name="rci")
        return te.compute(
            shape,
            lambda n, co, y, x, c: te.sum(
                padded[n, rco, y * sh + ry * dh, x * sw + rx * dw, rci].astype(out_dtype)
                * kernel[co, rco, ry, rx, rci, c].astype(out_dtype),
                axis=[rco, ry, rx, rci],
            ),
            name=CONV2D,
            tag=CONV2D,
        )
    rc = te.reduce_axis((0, channels), name="rc")
    return te.compute(
        shape,
        lambda n, co, y, x, c: te.sum(
            padded[n, rc, y * sh + ry * dh, x * sw + rx * dw].astype(out_dtype)
            * kernel[co, rc, ry, rx, c].astype(out_dtype),
            axis=[rc, ry, rx],
        ),
        name=CONV2D,
        tag=CONV2D,
    )


def depthwise_conv2d_nchwc(data, kernel, strides, padding, dilation, out_dtype) -> te.Tensor:
    """Depthwise convolution, channels in blocks (see the module docstring)."""
    if len(data.shape) != 5 or int(kernel.shape[1]) != 1 or int(kernel.shape[4]) != 1:
        raise ValueError(
            f"packed depthwise conv2d needs NCHW[x]c data and OIHW1i[x]o weights, got "
            f"{list(data.shape)} and {list(kernel.shape)}"
        )
    n, chunks, height, width, block = (int(d) for d in data.shape)
    kh, kw = int(kernel.shape[2]), int(kernel.shape[3])
    (sh, sw), (dh, dw) = strides, dilation
    oh, ow, ry, rx = _window(height, width, kh, kw, strides, padding, dilation)
    padded = _pad(data, padding, True)
    return te.compute(
        (n, chunks, oh, ow, block),
        lambda b, c, y, x, lane: te.sum(
            padded[b, c, y * sh + ry * dh, x * sw + rx * dw, lane].astype(out_dtype)
            * kernel[c, 0, ry, rx, 0, lane].astype(out_dtype),
            axis=[ry, rx],
        ),
        name=DEPTHWISE,
        tag=DEPTHWISE,
    )
