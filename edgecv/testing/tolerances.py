"""The one tolerance table by dtype, and the asserts that read it (re-exported by
:mod:`edgecv.testing`): plain NumPy. A comparison that needs more room passes ``loosen``
and says why.

Floats compare with ``|a - b| <= atol * scale + rtol * |b|`` where ``scale`` is the
largest magnitude of the reference (at least 1): a network's outputs differ from the
reference's by accumulated rounding that grows with the size of its activations, not
per element. Integers (class ids, sort and NMS indices) must match exactly.
"""

from __future__ import annotations

import numpy as np

# dtype -> (rtol, atol relative to the reference's scale)
TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-5, 1e-5),
    "float16": (1e-3, 1e-3),
    "bfloat16": (1e-2, 1e-2),
}

# An INT8 package against the float32 package of the same weights (edgecv.lowering.quantize),
# on inputs inside its calibration range with min/max calibration (nothing clipped):
# atol per quantized layer on the longest path, relative to the output's scale (its
# largest magnitude), rtol 0. Why 2%: a layer rounds its input to steps of T/255 (uint8;
# T/127 int8) and its weights to steps of max|w|/63 per channel (7 bits where AVX2's
# vpmaddubsw multiplies them; max|w|/127 elsewhere). Rounding errors are independent and
# uniform over a step (std step/sqrt(12)), so in a dot product of K terms they grow like
# sqrt(K), as the output does: relative to the output's rms the error has std
# sqrt(0.45%^2 + 1.15%^2) ~ 1.25% (uint8 activations of rms ~ T/4 after a ReLU: 0.45%;
# Gaussian-like weights of rms ~ max/2.5 in 7 bits: 1.15%), ~0.4% of the output's largest
# magnitude (~3x its rms), and the largest of thousands of outputs lies ~4 std out: 1.7%.
# Layers in sequence carry and add their errors (in quadrature; linearly here, to be
# safe). Measured: 0.36% for 5 layers (tests/test_int8.py), far inside.
INT8_PER_LAYER: tuple[float, float] = (0.0, 2e-2)

# An INT8 package deployed from a QDQ file (edgecv.frontend.onnx.qdq) against ONNX
# Runtime running that file, its QDQ operators fused into its integer kernels: atol per
# quantized layer on the longest path, relative to the output's scale, rtol 0. Both
# compute on the file's integers (its scales, its weights); they differ only where one
# rounds a value the other does not: a quotient at half a step (edgecv divides by the
# scale, ONNX Runtime's kernels requantize with a float multiplier), int8's -128 (edgecv
# reads -127..127), a doubled step where AVX2's kernel reads 7-bit uint8 data, weights
# requantized to 7 bits per channel there. Each is at most one rounding step of the
# file's grid per layer, what INT8_PER_LAYER bounds against float32, so the same bound.
INT8_QDQ_PER_LAYER: tuple[float, float] = INT8_PER_LAYER


# A float16 package (edgecv.lowering.precision) against MXNet's float32 forward pass on
# the same weights: atol per float16 layer on the longest path, relative to the output's
# scale (its largest magnitude), rtol 0, times sqrt(K / 6 + 2) for the layer's largest
# reduction of K products (assert_close_fp16). Why: float16 rounds to u = 2^-11 relative.
# Rounding the weights and the stored activations adds errors of std u/sqrt(3) of a
# product each, independent, so sqrt(2) u/sqrt(3) of the output's rms over a dot product.
# Accumulating in float16 rounds every partial sum s_k (std u |s_k|/sqrt(3), with
# |s_k| ~ sqrt(k) times a product's rms): over K products sqrt(sum_k k u^2 / 3) = u K /
# sqrt(6) products' rms, u sqrt(K / 6) of the output's rms (sqrt(K) products'). Together
# u sqrt(K/6 + 2/3) of the rms; the output's largest magnitude is ~3x its rms and the
# largest of thousands of errors lies ~4 std out: 4/3 u sqrt(K/6 + 2/3) of the scale,
# bounded here by 4/3 u sqrt(K/6 + 2). Layers in sequence add their errors (linearly
# here, to be safe; in quadrature in fact).
FP16_PER_LAYER: tuple[float, float] = (0.0, 4 / 3 * 2.0**-11)


def assert_close_fp16(
    actual: np.ndarray, expected: np.ndarray, layers: int, reduction: int, name: str = "output"
) -> float:
    """Assert a float16 package's output matches MXNet's float32 one within
    :data:`FP16_PER_LAYER` times ``layers`` (float16 layers on the longest path) times
    ``sqrt(reduction / 6 + 2)`` (``reduction``: the most products one output of a layer
    sums); returns the error relative to the reference's scale, for the caller to report."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    scale = float(np.abs(expected).max(initial=0.0))
    assert scale > 0, f"{name}: the reference is 0 everywhere: the comparison would prove nothing"
    error = float(np.abs(actual.astype(np.float64) - expected).max()) / scale
    bound = FP16_PER_LAYER[1] * layers * float(np.sqrt(reduction / 6 + 2))
    assert error <= bound, f"{name}: fp16 error {error:.3%} of the output's scale > {bound:.3%}"
    return error


def assert_close_int8(
    actual: np.ndarray, expected: np.ndarray, layers: int, name: str = "output"
) -> float:
    """Assert an INT8 output matches its float32 reference within
    :data:`INT8_PER_LAYER` times ``layers`` (the quantized layers on the longest path);
    returns the error relative to the reference's scale, for the caller to report."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    scale = float(np.abs(expected).max(initial=0.0))
    assert scale > 0, f"{name}: the reference is 0 everywhere: the comparison would prove nothing"
    error = float(np.abs(actual.astype(np.float64) - expected).max()) / scale
    bound = INT8_PER_LAYER[1] * layers
    assert error <= bound, f"{name}: INT8 error {error:.2%} of the output's scale > {bound:.0%}"
    return error


def assert_close_int8_against_qdq(
    actual: np.ndarray, expected: np.ndarray, layers: int, name: str = "output"
) -> float:
    """Assert an INT8 package deployed from a QDQ file matches ONNX Runtime running the
    file within :data:`INT8_QDQ_PER_LAYER` times ``layers``; returns the error relative
    to the reference's scale."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    scale = float(np.abs(expected).max(initial=0.0))
    assert scale > 0, f"{name}: the reference is 0 everywhere: the comparison would prove nothing"
    error = float(np.abs(actual.astype(np.float64) - expected).max()) / scale
    bound = INT8_QDQ_PER_LAYER[1] * layers
    assert error <= bound, f"{name}: error {error:.2%} of the output's scale > {bound:.0%}"
    return error


def assert_close(
    actual: np.ndarray,
    expected: np.ndarray,
    name: str = "output",
    loosen: float = 1.0,
    scale: float | None = None,
) -> None:
    """Assert ``actual`` matches ``expected`` per :data:`TOLERANCES` (exact for integers).

    ``loosen`` multiplies both tolerances; a caller that passes more than 1 must say why.
    ``scale`` raises the magnitude ``atol`` is relative to, for values computed from
    larger ones (box corners from pixel-sized anchors, which cancel to near 0).
    """
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    if not np.issubdtype(expected.dtype, np.floating):
        np.testing.assert_array_equal(actual, expected, err_msg=name)
        return
    rtol, atol = TOLERANCES[str(expected.dtype)]
    scale = max(1.0, scale or 0.0, float(np.abs(expected).max(initial=0.0)))
    np.testing.assert_allclose(
        actual, expected, rtol=rtol * loosen, atol=atol * loosen * scale, err_msg=name
    )
