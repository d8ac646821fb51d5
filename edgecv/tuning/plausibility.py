"""Timings from RPC servers are checked before they can enter a tuning database.

A server (``edgecv rpc-server``) times candidates on its device and sends back seconds;
the tuner cannot watch the device, and a record's time decides what deploy replays and
what ``--ship`` ships. So every answer is held to what memory traffic and repetition
allow, and one that fails is a failed measurement with its reason, never a record:

- memory: a kernel writes each byte of its output at least once (Relax's kernels take
  their outputs last), so one run takes at least the output's bytes over
  :data:`MAX_BANDWIDTH`. Only the output counts: a slice reads a part of its input,
  so the input's bytes are no lower bound.
- repetition: the fastest run must be repeated, the second fastest within
  :data:`AGREEMENT` times it, and a server sends every run, at least two. Only the
  fastest two are compared: on a busy board other processes make any number of runs
  slower, by any amount, and never make one faster.

These catch the impossible, not a lie within physics: a server that sends slower or
merely optimistic times passes. What keeps such a server out is who can reach the
tracker and its port (docs/tuning.md#a-device-fleet).
"""

from __future__ import annotations

import math

import numpy as np

# Bytes per second no device edgecv tunes for writes faster: 15x the DRAM of the fastest
# board it deploys to (Jetson Orin Nano, 68 GB/s), and above what a tiny kernel's L1/L2
# writes reach once a call's own overhead (a microsecond) is counted.
MAX_BANDWIDTH = 1e12
AGREEMENT = 2.0  # the most the two fastest runs of one candidate may differ by


def output_bytes(arguments: list) -> int:
    """Bytes of a kernel's last argument (its output); ``arguments``: [[dtype, shape], ...]
    as :func:`~edgecv.tuning.runners.llvm.args_json` writes them."""
    dtype, shape = arguments[-1]
    try:
        itemsize = np.dtype(dtype).itemsize
    except TypeError:  # a dtype numpy lacks (float8 kinds): a byte, the lowest bound
        itemsize = 1
    return int(np.prod(shape, dtype=np.int64)) * itemsize


def implausible(samples, arguments: list, bandwidth: float = MAX_BANDWIDTH) -> str | None:
    """Why ``samples`` (a server's seconds, every run of one candidate) cannot be real
    for a kernel with ``arguments``, or None when they can (module docstring)."""
    if not isinstance(samples, list) or not all(_is_number(s) for s in samples):
        return f"the server's answer is not a list of seconds ({str(samples)[:80]!r})"
    if len(samples) < 2:
        return (
            f"the server sent {len(samples)} run(s) and at least 2 are needed to check "
            "that runs agree: update edgecv on the server to the tuner's version"
        )
    bad = [s for s in samples if not (math.isfinite(s) and s > 0)]
    if bad:
        return f"the server sent a time that is not a positive number of seconds ({bad[0]!r})"
    fastest, second = sorted(samples)[:2]
    size = output_bytes(arguments)
    floor = size / bandwidth
    if fastest < floor:
        return (
            f"{fastest * 1e9:.3g} ns is faster than writing its {size} output bytes at "
            f"{bandwidth / 1e12:g} TB/s allows ({floor * 1e9:.3g} ns)"
        )
    if second > AGREEMENT * fastest:
        return (
            f"its two fastest runs disagree by more than {AGREEMENT:g}x "
            f"({fastest:.3g} s and {second:.3g} s)"
        )
    return None


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
