"""Costs the graph tuner did not measure, predicted from those it did.

A first deploy on a machine kind with nothing cached measures within a time budget
(:func:`~.measure.measure_costs`): the convolutions that do the most work and the largest
transforms first, so what is left is the small work, where a wrong guess costs least.
Those costs are predicted here, from this model's own measurements on this device:

- a convolution candidate (layout, algorithm) whose sibling candidate of the same
  convolution was measured: the sibling's time times the median ratio between the two
  candidates over the convolutions of the same kind (depthwise, 1x1, other) where both
  were measured. The solver weighs a convolution's candidates against each other, and
  ratios carry what the rates of one layout on this device are;
- otherwise its multiply-adds at the median rate of its (layout, algorithm, kind)
  measured here, falling back to the (layout, algorithm), then to every measurement;
- a transform: its bytes at the median bandwidth of the measured transforms of the same
  direction (packing or unpacking), then of all transforms.

Predicted costs are never cached: a later deploy measures them (within its budget), so
the plan converges on the fully measured one.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from .extract import Extracted
from .graph import is_packed

# A transform's bandwidth when no transform was measured at all (bytes per second): only
# a budget spent before the first batch's transforms could leave that, which the batching
# of measure_costs does not.
FALLBACK_BANDWIDTH = 2e9


@dataclass(frozen=True)
class ConvWork:
    """What a convolution computes: ``kind`` (``depthwise``, ``1x1``, ``kxk``) and its
    multiply-adds."""

    kind: str
    macs: int


def conv_work(extracted: Extracted) -> dict[str, ConvWork]:
    """Per convolution node (by name), its kind and multiply-adds."""
    work = {}
    for index in extracted.graph.convs():
        call = extracted.calls[index]
        weight = [int(d) for d in call.args[1].ty.shape.values]
        node = extracted.graph.nodes[index]
        groups = int(call.attrs.groups)
        if groups > 1:
            kind = "depthwise"
        elif weight[2:] == [1, 1]:
            kind = "1x1"
        else:
            kind = "kxk"
        work[node.name] = ConvWork(kind, math.prod(node.shape) * math.prod(weight[1:]))
    return work


Candidate = tuple[str, str]  # (layout, algorithm)


def predict_convs(
    convs: list[tuple[str, str, str, str]], times: dict[str, float], work: dict[str, ConvWork]
) -> dict[str, float]:
    """Seconds for the kernel keys of ``convs`` ((name, layout, algorithm, key) each)
    missing from ``times`` (see the module docstring)."""
    known: dict[str, dict[Candidate, float]] = {}
    for name, layout, algorithm, key in convs:
        seconds = times.get(key)
        if seconds is not None and math.isfinite(seconds) and seconds > 0:
            known.setdefault(name, {})[(layout, algorithm)] = seconds
    predicted: dict[str, float] = {}
    for name, layout, algorithm, key in convs:
        if key in times or key in predicted:
            continue
        predicted[key] = _predict_conv(name, (layout, algorithm), known, work)
    return predicted


def _predict_conv(
    name: str, candidate: Candidate, known: dict[str, dict[Candidate, float]], work: dict
) -> float:
    kind = work[name].kind
    siblings = known.get(name, {})
    # from a sibling candidate, preferring plain direct (the one every convolution has)
    for sibling in sorted(siblings, key=lambda c: (is_packed(c[0]), c)):
        ratios = [
            other[candidate] / other[sibling]
            for other_name, other in known.items()
            if work[other_name].kind == kind and candidate in other and sibling in other
        ]
        if ratios:
            return siblings[sibling] * statistics.median(ratios)
    # from the rate of the candidate's kind of work measured here
    for same in (
        lambda n, c: c == candidate and work[n].kind == kind,
        lambda n, c: c == candidate,
        lambda n, c: True,
    ):
        rates = [
            work[n].macs / seconds
            for n, candidates in known.items()
            for c, seconds in candidates.items()
            if same(n, c)
        ]
        if rates:
            return work[name].macs / statistics.median(rates)
    return math.inf  # nothing measured at all: the solver avoids what it cannot weigh


def predict_transforms(
    transforms: dict[tuple[tuple[int, ...], str, str], str], times: dict[str, float]
) -> dict[str, float]:
    """Seconds for the transform keys of ``transforms`` ((shape, src, dst) -> key)
    missing from ``times``: bytes over the median bandwidth measured (module docstring)."""
    bandwidths: dict[bool, list[float]] = {True: [], False: []}
    for (shape, src, _dst), key in transforms.items():
        seconds = times.get(key)
        if seconds is not None and math.isfinite(seconds) and seconds > 0:
            bandwidths[is_packed(src)].append(_bytes(shape) / seconds)
    every = bandwidths[True] + bandwidths[False]
    predicted = {}
    for (shape, src, _dst), key in transforms.items():
        if key in times:
            continue
        same = bandwidths[is_packed(src)] or every
        bandwidth = statistics.median(same) if same else FALLBACK_BANDWIDTH
        predicted[key] = _bytes(shape) / bandwidth
    return predicted


def _bytes(shape: tuple[int, ...]) -> int:
    return 4 * math.prod(shape)
