"""What :func:`edgecv.board.video.video` yields and counts: a :class:`Result` per frame
(its outputs, its detections, its stage times, its latency) and the :class:`VideoStats`
of a whole play (frames/s, drops, each stage's mean, the latency's percentiles).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Latencies kept for the percentiles: the latest frames' (a camera plays for hours)
LATENCIES_KEPT = 10000


@dataclass
class StageTimes:
    """Seconds one frame spent in each stage."""

    decode: float = 0.0
    preprocess: float = 0.0
    infer: float = 0.0
    postprocess: float = 0.0


@dataclass
class Result:
    """One frame through the model.

    Attributes
    ----------
    index : int
        The frame's position in its source, from 0 (a live source's dropped frames
        leave gaps).
    frame : numpy.ndarray
        The frame as decoded (HxWx3 uint8 BGR).
    outputs : list of numpy.ndarray
        The model's raw outputs, as ``model.run`` returns them.
    result : list
        What ``model.predict`` returns for the frame: detections or top-k classes.
    times : StageTimes
        Seconds in each stage.
    latency_s : float
        Seconds from the start of the frame's decode to the end of its postprocess.
    shown : numpy.ndarray or None
        What ``annotate`` returned for it.
    """

    index: int
    frame: np.ndarray
    outputs: list
    result: Any
    times: StageTimes
    latency_s: float = 0.0
    shown: np.ndarray | None = None


@dataclass
class VideoStats:
    """What a pipeline did so far; thread-safe. :meth:`summary` for the numbers."""

    frames: int = 0
    dropped: int = 0
    totals: StageTimes = field(default_factory=StageTimes)
    latencies: deque = field(default_factory=lambda: deque(maxlen=LATENCIES_KEPT))
    started: float | None = None
    last: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def begin(self, when: float) -> None:
        with self._lock:
            if self.started is None:
                self.started = when

    def drop(self) -> None:
        with self._lock:
            self.dropped += 1

    def add(self, result: Result) -> None:
        with self._lock:
            self.frames += 1
            for name in ("decode", "preprocess", "infer", "postprocess"):
                total = getattr(self.totals, name) + getattr(result.times, name)
                setattr(self.totals, name, total)
            self.latencies.append(result.latency_s)
            self.last = time.perf_counter()

    def summary(self) -> dict:
        """Frames, dropped, frames/s (over the wall time from the first decode to the
        latest result), each stage's mean and the latency's p50/p90/p99, in ms."""
        with self._lock:
            frames, latencies = self.frames, np.asarray(self.latencies)
            wall = (self.last - self.started) if frames and self.started else 0.0
            means = {
                f"{name}_ms": getattr(self.totals, name) / max(frames, 1) * 1e3
                for name in ("decode", "preprocess", "infer", "postprocess")
            }
            out = {"frames": frames, "dropped": self.dropped}
        out["fps"] = frames / wall if wall > 0 else 0.0
        out.update(means)
        for q in (50, 90, 99):
            out[f"p{q}_ms"] = float(np.percentile(latencies, q)) * 1e3 if frames else 0.0
        return out

    def line(self) -> str:
        """The summary as one line, for the console and the overlay."""
        s = self.summary()
        return (
            f"{s['frames']} frames, {s['fps']:.1f} frames/s, {s['dropped']} dropped; stages "
            f"(ms): decode {s['decode_ms']:.1f}, preprocess {s['preprocess_ms']:.1f}, infer "
            f"{s['infer_ms']:.1f}, postprocess {s['postprocess_ms']:.1f}; latency (ms): p50 "
            f"{s['p50_ms']:.1f}, p90 {s['p90_ms']:.1f}, p99 {s['p99_ms']:.1f}"
        )
