"""The INT8 step for a model that carries its own quantization (an ONNX QDQ file:
:mod:`edgecv.frontend.onnx.qdq`): the file's scales are the calibration.

The frontend hands the float graph on and, per weighted operator the file quantized,
its weights (dequantized exactly) and its input's scale and dtype. Each site of
:func:`~edgecv.lowering.quantize_sites.find_sites` is matched to the file's operator
by those weights (equal bit for bit: the same constant), so no operator order is
assumed; a site the file left in float32 stays float32. Its input is quantized with the
file's scale (:class:`~edgecv.lowering.calibration.TensorQuant`), and the rewrite is
:func:`.int8.quantize_model`'s, on the same kernels. Where a kernel on the CPU's dot
product needs 7-bit data (AVX2's ``vpmaddubsw`` summing pairs in int16), that input's
step doubles (the file's range on 0..127), and its weights are requantized to 7 bits
per channel, as a calibrated build does; elsewhere the file's per-channel int8 weights
come back unchanged: each site's largest weight is the file's largest ``|q|`` (127, or
64 for ``reduce_range``), so ``max|w| / that`` of a channel is the file's scale
wherever each channel reaches it (per-channel weights; per-tensor ones get a finer
step per channel).
"""

from __future__ import annotations

import dataclasses

from ..board.errors import EdgecvError
from ..board.precision import Precision
from ..lowering.calibration import TensorQuant
from ..lowering.quantize import quantize
from ..lowering.quantize_sites import find_sites
from ..profiles import Profile
from . import int8

SOURCE = "the model file (QDQ)"


def with_model_scales(options, quantization: list[dict], profile: Profile):
    """``options`` for an INT8 build of a model carrying its own quantization, or one
    error line for a request that cannot use it."""
    if options.precision is Precision.FP16:
        raise EdgecvError(
            "the model is quantized (QDQ), so it deploys in int8; leave out --precision fp16"
        )
    if options.calibrate is not None:
        raise int8.CalibrationError(
            "the model is quantized (QDQ): its scales are its calibration; leave out "
            "--calibrate and --calibration-size"
        )
    if profile.runtime != "cpu":
        raise EdgecvError(
            f"the model is quantized (QDQ) and edgecv's INT8 kernels are CPU kernels; profile "
            f"`{profile.name}` runs on the {profile.runtime} backend: deploy it with --device "
            "cpu, or deploy the float model it was quantized from"
        )
    return dataclasses.replace(
        options, precision=Precision.INT8, model_quantization=list(quantization)
    )


def given_quants(
    found, entries: list[dict], dot, weight_max: dict[str, int]
) -> dict[str, TensorQuant]:
    """Each site input's quantization from the file's entry whose weights are the
    site's (see the module docstring); ``weight_max`` filled with each site's largest
    file weight by site name."""
    by_weight: dict[tuple, dict] = {}
    for entry in entries:
        by_weight.setdefault(_weight_key(entry["weight"]), entry)
    quants: dict[str, TensorQuant] = {}
    for site in found.sites:
        entry = by_weight.get(_weight_key(site.weight))
        if entry is None:
            continue
        quant = TensorQuant(entry["scale"], entry["dtype"], 255)
        weight_max[site.name] = entry["weight_max"]
        earlier = quants.setdefault(site.tensor, quant)
        if earlier != quant:
            raise EdgecvError(
                f"the model's operators reading one tensor quantize it with two scales "
                f"({earlier.scale:g} and {quant.scale:g}, at `{entry['node']}`); edgecv "
                "quantizes a tensor once: quantize the model with one scale per tensor"
            )
    if dot is not None and dot.data_max < 255:
        for key in int8._seven_bit_inputs(found, quants, dot):
            quants[key] = TensorQuant.of(quants[key].scale * 255, True, dot.data_max)
    return quants


def _weight_key(weight) -> tuple:
    return (weight.shape, weight.tobytes())


def quantize_given(mod, profile: Profile, options, progress, dot):
    """:func:`.int8.quantize_model` with the model's own scales: the quantized module,
    the manifest's ``build.quantization`` facts, and no calibration file."""
    found = find_sites(mod)
    file_max: dict[str, int] = {}
    quants = given_quants(found, options.model_quantization, dot, file_max)
    if not quants:
        raise EdgecvError(
            "the model is quantized (QDQ) but none of its convolutions or dense layers "
            "reads a quantized input edgecv recognizes; deploy the float model with "
            "--precision int8 --calibrate instead"
        )
    if dot is None:
        int8._warn_without_dot_product(profile)
    limit = int8._weight_limits(dot)  # 7 bits where AVX2's kernel needs them
    quantized, records = quantize(
        mod,
        quants,
        lambda site, quant: min(limit(site, quant), file_max.get(site.name, 127)),
        arithmetic=int8._arithmetic(dot),
        dense_as_conv=dot is not None,
        residual_adds=True,
        shift_signed=lambda site, quant: int8._shifted(site, quant, dot),
    )
    facts = int8._facts("model file", dot, found, records, {})
    facts["calibration"] = {"source": SOURCE, "operators": len(options.model_quantization)}
    counts = facts["quantized"]
    progress(
        f"quantized {', '.join(f'{n} {op}' for op, n in sorted(counts.items()))} to int8 "
        f"with the scales of {SOURCE}"
    )
    return quantized, facts, {}


__all__ = ["SOURCE", "given_quants", "quantize_given", "with_model_scales"]
