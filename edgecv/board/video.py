"""A source's frames through a model at the speed of the model: ``edgecv.video``.

Four stages, each in a thread of its own, joined by bounded queues::

    capture/decode -> [frames] -> preprocess + infer (``streams`` calls in flight)
                   -> [futures, in frame order] -> postprocess/annotate -> [results] -> you

so the source decodes the next frames while the model runs, and with ``streams`` > 1
several inferences (each in an execution context of the model's own) run at once. The
postprocess stage takes the inferences' futures in the order the frames came, so
results come out in frame order whatever finished first.

Files, folders and Python iterables are not *live*: the capture stage waits for room
in its queue, and every frame is processed, in order. A live source (a camera, a
stream) never waits: a frame that finds the queue full replaces the one waiting there
(the newest frame wins), and a frame that waited more than ``budget_s`` before an
inference could take it is dropped too; both are counted (:attr:`VideoStats.dropped`).

``pipelined=False`` is the loop the demo ran before: decode, preprocess, infer and
postprocess one frame after another, in the caller's thread, for comparison.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .frames import Source, SourceLike, open_source

# Seconds a live frame may wait for an inference before it is dropped as stale
BUDGET_S = 0.1
# Latencies kept for the percentiles: the latest frames' (a camera plays for hours)
LATENCIES_KEPT = 10000
# How often a stage that waits looks whether the pipeline was closed
POLL_S = 0.05
# Seconds close() waits for a source's read to return (a source is user code)
SOURCE_JOIN_S = 5.0


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


@dataclass
class _Frame:
    index: int
    frame: np.ndarray
    start: float  # when its decode began
    decode_s: float


@dataclass
class _End:
    """The last item through the queues: the source ended, or ``error`` stopped it."""

    error: BaseException | None = None


class Video:
    """A source played through a model; iterate it for :class:`Result` objects, in frame
    order. Made by :func:`video`, which documents the parameters. Closing it (leaving
    a ``with`` block, breaking out of a loop over it, Ctrl-C, the source failing) stops
    and joins its threads; an error of the source or the model is raised by the loop."""

    def __init__(
        self,
        model,
        source: Source,
        streams: int,
        budget_s: float | None,
        threshold: float | None,
        k: int,
        annotate: Callable[[Result], np.ndarray] | None,
        max_frames: int,
        pipelined: bool,
    ):
        self.model, self.source, self.streams = model, source, streams
        self.budget_s, self.threshold, self.k = budget_s, threshold, k
        self.annotate, self.max_frames, self.pipelined = annotate, max_frames, pipelined
        self.stats = VideoStats()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pool: ThreadPoolExecutor | None = None
        self._started = False

    def __enter__(self) -> Video:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __iter__(self) -> Iterator[Result]:
        if self._started:
            raise RuntimeError("a Video plays once; call edgecv.video(...) again")
        self._started = True
        return self._sequential() if not self.pipelined else self._pipelined()

    def close(self) -> None:
        """Stop the stages and join their threads (an inference under way ends first)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(SOURCE_JOIN_S if thread.name.endswith("capture") else None)
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    # the loop of one thread: today's demo

    def _sequential(self) -> Iterator[Result]:
        frames = self.source.frames()
        index = 0
        try:
            while not self._stop.is_set() and not (self.max_frames and index >= self.max_frames):
                start = time.perf_counter()
                self.stats.begin(start)
                frame = next(frames, None)
                if frame is None:
                    return
                item = _Frame(index, frame, start, time.perf_counter() - start)
                outputs, pre, infer = self._infer(item)
                yield self._postprocess(item, outputs, pre, infer)
                index += 1
        finally:
            getattr(frames, "close", lambda: None)()
            self.close()

    # the pipeline: a thread per stage

    def _pipelined(self) -> Iterator[Result]:
        live = self.source.live
        captured: queue.Queue = queue.Queue(maxsize=1 if live else self.streams + 1)
        inflight: queue.Queue = queue.Queue()  # at most `streams`: the slots bound it
        done: queue.Queue = queue.Queue(maxsize=self.streams + 1)
        slots = threading.Semaphore(self.streams)
        self._pool = ThreadPoolExecutor(self.streams, thread_name_prefix="edgecv-video-infer")
        stages = [
            ("capture", self._capture_stage, (captured,)),
            ("dispatch", self._dispatch_stage, (captured, inflight, slots)),
            ("postprocess", self._postprocess_stage, (inflight, done, slots)),
        ]
        for name, target, queues in stages:
            thread = threading.Thread(
                target=target, args=queues, name=f"edgecv-video-{name}", daemon=True
            )
            self._threads.append(thread)
            thread.start()
        try:
            while True:
                item = self._get(done, self._threads[-1])
                if item is None or isinstance(item, _End):
                    if item is not None and item.error is not None:
                        raise item.error
                    return
                yield item
        finally:
            self.close()

    def _capture_stage(self, captured: queue.Queue) -> None:
        frames, end = None, _End()
        try:
            frames = self.source.frames()
            index = 0
            while not self._stop.is_set() and not (self.max_frames and index >= self.max_frames):
                start = time.perf_counter()
                self.stats.begin(start)
                frame = next(frames, None)
                if frame is None:
                    break
                item = _Frame(index, frame, start, time.perf_counter() - start)
                if self.source.live:
                    self._put_newest(captured, item)
                else:
                    self._put(captured, item)
                index += 1
        except BaseException as err:  # raised by the consumer's loop
            end = _End(err)
        finally:
            getattr(frames, "close", lambda: None)()
            self._put(captured, end)

    def _put_newest(self, captured: queue.Queue, item: _Frame) -> None:
        """A live frame into the queue without waiting: it replaces the one waiting."""
        while True:
            try:
                captured.put_nowait(item)
                return
            except queue.Full:
                try:
                    captured.get_nowait()
                    self.stats.drop()
                except queue.Empty:
                    pass

    def _dispatch_stage(self, captured, inflight, slots: threading.Semaphore) -> None:
        """Frames to inferences: a slot first (at most ``streams`` in flight), then the
        frame, so a live source's frame is the newest when an inference can take it."""
        assert self._pool is not None
        while True:
            while not slots.acquire(timeout=POLL_S):
                if self._stop.is_set():
                    return
            item = self._get(captured)
            if item is None:
                return
            if isinstance(item, _End):
                inflight.put(item)
                return
            waited = time.perf_counter() - item.start - item.decode_s
            if self.source.live and self.budget_s is not None and waited > self.budget_s:
                self.stats.drop()
                slots.release()
                continue
            try:
                future = self._pool.submit(self._infer, item)
            except RuntimeError:  # the pool was shut down: closing
                return
            inflight.put((item, future))

    def _postprocess_stage(self, inflight, done, slots: threading.Semaphore) -> None:
        while True:
            entry = self._get(inflight)
            if entry is None:
                return
            if isinstance(entry, _End):
                self._put(done, entry)
                return
            item, future = entry
            try:
                outputs, pre, infer = future.result()  # an inference always ends
                slots.release()  # the next inference starts while this frame is drawn
                result = self._postprocess(item, outputs, pre, infer)
            except BaseException as err:
                self._put(done, _End(err))
                return
            self._put(done, result)

    # one frame's work, the same in both loops

    def _infer(self, item: _Frame) -> tuple[list, float, float]:
        start = time.perf_counter()
        x = self.model.preprocess(item.frame)
        ran = time.perf_counter()
        outputs = self.model.run(x)
        return outputs, ran - start, time.perf_counter() - ran

    def _postprocess(self, item: _Frame, outputs: list, pre: float, infer: float) -> Result:
        start = time.perf_counter()
        found = self.model.decode(outputs, item.frame.shape[:2], self.threshold, self.k)
        times = StageTimes(item.decode_s, pre, infer)
        result = Result(item.index, item.frame, outputs, found, times)
        if self.annotate is not None:
            result.shown = self.annotate(result)
        end = time.perf_counter()
        times.postprocess, result.latency_s = end - start, end - item.start
        self.stats.add(result)
        return result

    # waiting that a close() ends

    def _get(self, q: queue.Queue, producer: threading.Thread | None = None):
        """The next item, or None once closed (or ``producer`` died without an end)."""
        while True:
            try:
                return q.get(timeout=POLL_S)
            except queue.Empty:
                if self._stop.is_set() or (producer is not None and not producer.is_alive()):
                    return None if q.empty() else q.get_nowait()

    def _put(self, q: queue.Queue, item) -> None:
        while not self._stop.is_set():
            try:
                q.put(item, timeout=POLL_S)
                return
            except queue.Full:
                continue


def video(
    model,
    source: SourceLike,
    streams: int | None = None,
    *,
    live: bool | None = None,
    budget_s: float | None = BUDGET_S,
    threshold: float | None = None,
    k: int = 5,
    annotate: Callable[[Result], np.ndarray] | None = None,
    max_frames: int = 0,
    pipelined: bool = True,
) -> Video:
    """Play a camera, a video, a folder of images or any frames through a loaded model.

    Parameters
    ----------
    model : DeployedModel
        What ``edgecv.load`` returned.
    source : int, str, Path, iterable of images or Source
        A camera index, a video file, a folder of images (name order), a stream URL, or
        an iterable of HxWx3 uint8 BGR images (:func:`edgecv.board.frames.open_source`).
    streams : int, optional
        Inferences in flight at once (default: the model's ``streams``; more than the
        model's wait for one of its execution contexts).
    live : bool, optional
        Whether the source's frames go stale while they wait: the newest frame wins and
        the others are dropped (counted). Default: cameras and URLs are live, files,
        folders and iterables are not (every frame is processed, in order).
    budget_s : float or None
        Seconds a live frame may wait for an inference before it is dropped (None: no
        limit, only the newest-frame rule).
    threshold, k
        As for ``model.predict``: the lowest detection score kept, the classes kept.
    annotate : callable, optional
        Called with each :class:`Result` in the postprocess stage, in frame order; its
        return value (an image to show or write) is the result's ``shown``.
    max_frames : int
        Stop after this many frames of the source (0: all).
    pipelined : bool
        False runs one frame after another in the caller's thread (decode, preprocess,
        infer, postprocess), the loop to compare the pipeline with.

    Returns
    -------
    Video
        An iterable of :class:`Result` in frame order, and a context manager;
        ``.stats`` (:class:`VideoStats`) holds the stage times, the latency
        percentiles and the dropped count so far.

    Examples
    --------
    >>> model = edgecv.load("ssd_mobilenet-cpu", streams=2)
    >>> with edgecv.video(model, "clip.mp4") as frames:
    ...     for r in frames:
    ...         print(r.index, len(r.result), f"{r.latency_s * 1e3:.1f} ms")
    """
    from .errors import EdgecvError

    streams = model.streams if streams is None else streams
    if isinstance(streams, bool) or not isinstance(streams, int) or streams < 1:
        raise EdgecvError(f"streams={streams!r}: give how many inferences in flight, 1 or more")
    if budget_s is not None and budget_s < 0:
        raise EdgecvError(f"budget_s={budget_s}: give seconds, 0 or more, or None for no limit")
    opened = open_source(source, live)
    return Video(model, opened, streams, budget_s, threshold, k, annotate, max_frames, pipelined)
