"""Converters for neural-network layers: convolution, normalization, pooling, activations."""

from __future__ import annotations

import numpy as np
from tvm import relax

from ..attrs import Attrs
from ..context import Context
from .registry import converts

R = relax.op


def _spatial(attrs: Attrs, name: str, ndim: int, default: int) -> tuple[int, ...]:
    # MXNet writes "()" for "use the default" in exported graphs.
    value = attrs.ints(name, ())
    if not value:
        return (default,) * ndim
    if len(value) != ndim:
        raise attrs._fail(name, f"{ndim} values (one per spatial axis)", value)
    return value


def _channel_vector(ctx: Context, vec: relax.Expr, ndim: int, axis: int = 1) -> relax.Expr:
    """Reshape a per-channel vector so it broadcasts along ``axis`` of an ndim tensor."""
    shape = [1] * ndim
    shape[axis] = ctx.shape(vec)[0]
    return R.reshape(vec, shape)


@converts("Convolution")
def convolution(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    kernel = attrs.ints("kernel")
    nd = len(kernel)
    if nd not in (1, 2):
        raise ctx.error(f"only 1-D and 2-D convolutions are supported, found kernel {kernel}")
    layout = attrs.str("layout", "NCW" if nd == 1 else "NCHW")
    if layout not in ("NCW", "NCHW"):
        raise ctx.error(f"layout `{layout}` is not supported; export the model with NCHW layout")
    stride = _spatial(attrs, "stride", nd, 1)
    dilate = _spatial(attrs, "dilate", nd, 1)
    pad = _spatial(attrs, "pad", nd, 0)
    groups = attrs.int("num_group", 1)
    num_filter = attrs.int("num_filter")
    no_bias = attrs.bool("no_bias", False)
    data, weight = inputs[0], inputs[1]
    in_channels = ctx.shape(data)[1]
    expected = (num_filter, in_channels // groups, *kernel)
    if ctx.shape(weight) != expected:
        raise ctx.error(
            f"weight has shape {ctx.shape(weight)}, expected {expected} for {in_channels} input "
            f"channels; do the params belong to this graph?"
        )
    if nd == 1:
        out = R.nn.conv1d(data, weight, stride, pad, dilate, groups)
    else:
        out = R.nn.conv2d(data, weight, stride, pad, dilate, groups)
    if not no_bias:
        out = R.add(out, _channel_vector(ctx, inputs[2], nd + 2))
    return out


@converts("Deconvolution")
def deconvolution(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    kernel = attrs.ints("kernel")
    if len(kernel) != 2:
        raise ctx.error(f"only 2-D deconvolution is supported, found kernel {kernel}")
    if attrs.ints("target_shape", ()):
        raise ctx.error("`target_shape` is not supported; give `pad` and `adj` instead")
    stride = _spatial(attrs, "stride", 2, 1)
    dilate = _spatial(attrs, "dilate", 2, 1)
    pad = _spatial(attrs, "pad", 2, 0)
    adj = _spatial(attrs, "adj", 2, 0)
    groups = attrs.int("num_group", 1)
    no_bias = attrs.bool("no_bias", True)
    out = R.nn.conv2d_transpose(
        inputs[0], inputs[1], stride, pad, adj, dilate, groups, kernel_layout="IOHW"
    )
    if not no_bias:
        out = R.add(out, _channel_vector(ctx, inputs[2], 4))
    return out


@converts("BatchNorm", "_contrib_SyncBatchNorm")
def batch_norm(ctx: Context, inputs: list, attrs: Attrs) -> list:
    data, gamma, beta, mean, var = inputs
    eps = attrs.float("eps", 1e-3)
    fix_gamma = attrs.bool("fix_gamma", True)
    axis = ctx.normalize_axis(attrs.int("axis", 1), len(ctx.shape(data)))
    ndim = len(ctx.shape(data))
    values = [ctx.const_value(x) for x in (gamma, beta, mean, var)]
    if all(v is not None for v in values):
        # Inference BatchNorm is an affine map per channel: fold it to one scale and shift
        # so the fused kernel does one multiply-add instead of five ops.
        g, b, m, v = (x.astype(np.float64) for x in values)
        if fix_gamma:
            g = np.ones_like(g)
        scale = g / np.sqrt(v + eps)
        shift = b - m * scale
        dtype = ctx.dtype(data)
        scale_c = relax.const(scale.astype(dtype))
        shift_c = relax.const(shift.astype(dtype))
        out = R.add(
            R.multiply(data, _channel_vector(ctx, scale_c, ndim, axis)),
            _channel_vector(ctx, shift_c, ndim, axis),
        )
    else:
        if fix_gamma:
            gamma = R.ones_like(gamma)
        scale = R.divide(gamma, R.sqrt(R.add(var, relax.const(eps, ctx.dtype(var)))))
        out = R.add(
            R.multiply(
                R.subtract(data, _channel_vector(ctx, mean, ndim, axis)),
                _channel_vector(ctx, scale, ndim, axis),
            ),
            _channel_vector(ctx, beta, ndim, axis),
        )
    return [out, mean, var]


@converts("Pooling")
def pooling(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    data = inputs[0]
    if len(ctx.shape(data)) != 4:
        raise ctx.error(f"only 2-D pooling (NCHW input) is supported, input is {ctx.shape(data)}")
    pool_type = attrs.str("pool_type", "max", choices=("max", "avg", "sum"))
    if attrs.str("layout", "NCHW") != "NCHW":
        raise ctx.error(f"layout `{attrs.str('layout')}` is not supported; use NCHW")
    if attrs.bool("global_pool", False):
        if pool_type == "max":
            return R.max(data, axis=[2, 3], keepdims=True)
        reduced = R.sum if pool_type == "sum" else R.mean
        return reduced(data, axis=[2, 3], keepdims=True)
    kernel = attrs.ints("kernel")
    stride = _spatial(attrs, "stride", 2, 1)
    pad = _spatial(attrs, "pad", 2, 0)
    convention = attrs.str("pooling_convention", "valid", choices=("valid", "full"))
    ceil_mode = convention == "full"
    if pool_type == "max":
        return R.nn.max_pool2d(data, kernel, stride, pad, ceil_mode=ceil_mode)
    count_include_pad = attrs.bool("count_include_pad", True)
    out = R.nn.avg_pool2d(
        data, kernel, stride, pad, ceil_mode=ceil_mode, count_include_pad=count_include_pad
    )
    if pool_type == "sum":
        out = R.multiply(out, relax.const(float(kernel[0] * kernel[1]), ctx.dtype(data)))
    return out


@converts("FullyConnected")
def fully_connected(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    data, weight = inputs[0], inputs[1]
    num_hidden = attrs.int("num_hidden")
    if attrs.bool("flatten", True) and len(ctx.shape(data)) != 2:
        data = R.reshape(data, (ctx.shape(data)[0], -1))
        data = ctx.emit(data)
    features = ctx.shape(data)[-1]
    if ctx.shape(weight) != (num_hidden, features):
        raise ctx.error(
            f"weight has shape {ctx.shape(weight)}, expected {(num_hidden, features)}; "
            "do the params belong to this graph, and is the input shape right?"
        )
    out = R.matmul(data, R.permute_dims(weight))
    if not attrs.bool("no_bias", False):
        out = R.add(out, inputs[2])
    return out


def _activation(ctx: Context, data: relax.Expr, act_type: str) -> relax.Expr:
    one = relax.const(1.0, ctx.dtype(data))
    if act_type == "relu":
        return R.nn.relu(data)
    if act_type == "sigmoid":
        return R.sigmoid(data)
    if act_type == "tanh":
        return R.tanh(data)
    if act_type == "softrelu":
        return R.nn.softplus(data)
    if act_type == "softsign":
        return R.divide(data, R.add(one, R.abs(data)))
    if act_type == "log_sigmoid":
        return R.log(R.sigmoid(data))
    if act_type == "mish":
        return R.multiply(data, R.tanh(R.nn.softplus(data)))
    raise ctx.error(
        f"act_type `{act_type}` is not supported; supported: relu, sigmoid, tanh, softrelu, "
        "softsign, log_sigmoid, mish"
    )


@converts("Activation")
def activation(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    return _activation(ctx, inputs[0], attrs.str("act_type"))


@converts("relu")
def relu(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    return R.nn.relu(inputs[0])


@converts("sigmoid")
def sigmoid(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    return R.sigmoid(inputs[0])


@converts("LeakyReLU")
def leaky_relu(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    data = inputs[0]
    dtype = ctx.dtype(data)
    act_type = attrs.str(
        "act_type", "leaky", choices=("leaky", "prelu", "elu", "selu", "gelu", "rrelu")
    )
    if act_type == "leaky":
        return R.nn.leakyrelu(data, attrs.float("slope", 0.25))
    if act_type == "rrelu":  # at inference RReLU uses the mean of its random slope range
        slope = (attrs.float("lower_bound", 0.125) + attrs.float("upper_bound", 0.334)) / 2
        return R.nn.leakyrelu(data, slope)
    if act_type == "prelu":
        ndim = len(ctx.shape(data))
        alpha = inputs[1]
        if ctx.shape(alpha) == (1,):
            alpha_b = alpha
        else:
            alpha_b = _channel_vector(ctx, alpha, ndim)
        return R.where(R.greater(data, relax.const(0.0, dtype)), data, R.multiply(data, alpha_b))
    if act_type == "elu":
        slope = relax.const(attrs.float("slope", 0.25), dtype)
        neg = R.multiply(slope, R.subtract(R.exp(data), relax.const(1.0, dtype)))
        return R.where(R.greater(data, relax.const(0.0, dtype)), data, neg)
    if act_type == "selu":
        return R.nn.selu(data)
    return R.nn.gelu(data)


def _softmax_axis(ctx: Context, data: relax.Expr, axis: int, temperature: float | None):
    if temperature not in (None, 1.0):
        data = R.divide(data, relax.const(temperature, ctx.dtype(data)))
    return data, axis


@converts("softmax")
def softmax(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    if attrs.bool("use_length", False):
        raise ctx.error("`use_length=True` is not supported")
    data, axis = _softmax_axis(
        ctx, inputs[0], attrs.int("axis", -1), attrs.float("temperature", None)
    )
    return R.nn.softmax(data, axis)


@converts("log_softmax")
def log_softmax(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    data, axis = _softmax_axis(
        ctx, inputs[0], attrs.int("axis", -1), attrs.float("temperature", None)
    )
    return R.nn.log_softmax(data, axis)


@converts("SoftmaxActivation")
def softmax_activation(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    data = inputs[0]
    if attrs.str("mode", "instance", choices=("instance", "channel")) == "channel":
        return R.nn.softmax(data, 1)
    shape = ctx.shape(data)
    flat = ctx.emit(R.reshape(data, (shape[0], -1)))
    return R.reshape(R.nn.softmax(flat, 1), shape)


@converts("SoftmaxOutput", "Softmax")
def softmax_output(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    # At inference SoftmaxOutput is a softmax; its label input is ignored.
    data = inputs[0]
    if attrs.bool("multi_output", False):
        return R.nn.softmax(data, 1)
    shape = ctx.shape(data)
    flat = ctx.emit(R.reshape(data, (shape[0], -1)))
    return R.reshape(R.nn.softmax(flat, 1), shape)


@converts("Dropout")
def dropout(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    return inputs[0]  # inference: identity


@converts("UpSampling")
def upsampling(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    if attrs.str("sample_type", "nearest") != "nearest":
        raise ctx.error("only sample_type='nearest' is supported (bilinear needs a weight input)")
    if len(inputs) != 1:
        raise ctx.error(f"only one input is supported, found {len(inputs)}")
    scale = attrs.int("scale")
    # Integer-scale nearest upsampling is exactly a repeat along H and W.
    out = ctx.emit(R.repeat(inputs[0], scale, axis=2))
    return R.repeat(out, scale, axis=3)


@converts("Pad", "pad")
def pad(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    mode = attrs.str("mode", "constant", choices=("constant", "edge", "reflect"))
    pad_width = attrs.ints("pad_width")
    ndim = len(ctx.shape(inputs[0]))
    if len(pad_width) != 2 * ndim:
        raise attrs._fail("pad_width", f"{2 * ndim} values (before/after per axis)", pad_width)
    value = attrs.float("constant_value", 0.0)
    # Relax names MXNet's "edge" mode "replicate".
    return R.nn.pad(inputs[0], list(pad_width), {"edge": "replicate"}.get(mode, mode), value)


@converts("L2Normalization")
def l2_normalization(ctx: Context, inputs: list, attrs: Attrs) -> relax.Expr:
    data = inputs[0]
    eps = relax.const(attrs.float("eps", 1e-10), ctx.dtype(data))
    mode = attrs.str("mode", "instance", choices=("instance", "channel", "spatial"))
    ndim = len(ctx.shape(data))
    axes = {"instance": list(range(1, ndim)), "channel": [1], "spatial": list(range(2, ndim))}
    norm = R.sqrt(R.add(R.sum(R.multiply(data, data), axis=axes[mode], keepdims=True), eps))
    return R.divide(data, norm)
