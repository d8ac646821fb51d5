"""A source's frames through a model at the speed of the model: ``edgecv.video``.

Four stages, each in threads of its own, joined by bounded queues::

    capture/decode -> [frames] -> preprocess -> [tensors] -> infer (``streams`` calls in
    flight, a pool's threads) -> [futures, in frame order] -> postprocess/annotate
    -> [results] -> you

so the source decodes and preprocesses the next frames while the model runs, and with
``streams`` > 1 several inferences (each in an execution context of the model's own)
run at once. The
postprocess stage takes the inferences' futures in the order the frames came, so
results come out in frame order whatever finished first.

Files, folders and Python iterables are not *live*: the capture stage waits for room
in its queue, and every frame is processed, in order. A live source (a camera, a
stream) never waits: a frame that finds the queue full replaces the one waiting there
(the newest frame wins), and a frame that waited more than ``budget_s`` before an
inference could take it is dropped too; both are counted (:attr:`VideoStats.dropped`).

Each frame's :class:`~.video_results.Result` and the play's
:class:`~.video_results.VideoStats` are in :mod:`.video_results`.
``pipelined=False`` is the loop the demo ran before: decode, preprocess, infer and
postprocess one frame after another, in the caller's thread, for comparison.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from .errors import EdgecvError
from .frames import Source, SourceLike, open_source
from .video_results import Result, StageTimes, VideoStats

# Seconds a live frame may wait for an inference before it is dropped as stale
BUDGET_S = 0.1
# How often a stage that waits looks whether the pipeline was closed
POLL_S = 0.05
# Seconds close() waits for a source's read to return (a source is user code)
SOURCE_JOIN_S = 5.0


@dataclass
class _Frame:
    index: int
    frame: np.ndarray
    start: float  # when its decode began
    decode_s: float
    tensor: np.ndarray | None = None  # the model's input, once preprocessed
    preprocess_s: float = 0.0


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
                item = self._preprocess(_Frame(index, frame, start, time.perf_counter() - start))
                outputs, infer = self._infer(item)
                result = self._postprocess(item, outputs, infer)
                self.stats.add(result)
                yield result
                index += 1
        finally:
            getattr(frames, "close", lambda: None)()
            self.close()

    # the pipeline: a thread per stage

    def _pipelined(self) -> Iterator[Result]:
        live = self.source.live
        captured: queue.Queue = queue.Queue(maxsize=1 if live else self.streams)
        prepared: queue.Queue = queue.Queue(maxsize=1 if live else self.streams)
        inflight: queue.Queue = queue.Queue()  # at most `streams`: the slots bound it
        done: queue.Queue = queue.Queue(maxsize=self.streams + 1)
        slots = threading.Semaphore(self.streams)
        self._pool = ThreadPoolExecutor(self.streams, thread_name_prefix="edgecv-video-infer")
        stages = [
            ("capture", self._capture_stage, (captured,)),
            ("preprocess", self._preprocess_stage, (captured, prepared)),
            ("dispatch", self._dispatch_stage, (prepared, inflight, slots)),
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
                self.stats.add(item)  # counted as it is handed over
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

    def _put_newest(self, q: queue.Queue, item: _Frame) -> None:
        """A live frame into ``q`` without waiting: it replaces the one waiting (each
        queue has one producer)."""
        while True:
            try:
                q.put_nowait(item)
                return
            except queue.Full:
                try:
                    q.get_nowait()
                    self.stats.drop()
                except queue.Empty:
                    pass

    def _preprocess_stage(self, captured: queue.Queue, prepared: queue.Queue) -> None:
        while True:
            item = self._get(captured)
            if item is None:
                return
            if not isinstance(item, _End):
                if self._stale(item):
                    continue
                try:
                    item = self._preprocess(item)
                except BaseException as err:
                    item = _End(err)
            if isinstance(item, _End):
                self._put(prepared, item)
                return
            if self.source.live:  # the newest frame wins here too
                self._put_newest(prepared, item)
            else:
                self._put(prepared, item)

    def _stale(self, item: _Frame) -> bool:
        """Whether a live frame waited past the budget since its decode (then counted)."""
        waited = time.perf_counter() - item.start - item.decode_s - item.preprocess_s
        if self.source.live and self.budget_s is not None and waited > self.budget_s:
            self.stats.drop()
            return True
        return False

    def _dispatch_stage(self, prepared, inflight, slots: threading.Semaphore) -> None:
        """Frames to inferences: a slot first (at most ``streams`` in flight), then the
        frame, so a live source's frame is the newest when an inference can take it."""
        assert self._pool is not None
        while True:
            while not slots.acquire(timeout=POLL_S):
                if self._stop.is_set():
                    return
            item = self._get(prepared)
            if item is None:
                return
            if isinstance(item, _End):
                inflight.put(item)
                return
            if self._stale(item):
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
                outputs, infer = future.result()  # an inference always ends
                slots.release()  # the next inference starts while this frame is drawn
                result = self._postprocess(item, outputs, infer)
            except BaseException as err:
                self._put(done, _End(err))
                return
            self._put(done, result)

    # one frame's work, the same in both loops

    def _preprocess(self, item: _Frame) -> _Frame:
        start = time.perf_counter()
        item.tensor = self.model.preprocess(item.frame)
        item.preprocess_s = time.perf_counter() - start
        return item

    def _infer(self, item: _Frame) -> tuple[list, float]:
        start = time.perf_counter()
        outputs = self.model.run(item.tensor)
        return outputs, time.perf_counter() - start

    def _postprocess(self, item: _Frame, outputs: list, infer: float) -> Result:
        start = time.perf_counter()
        found = self.model.decode(outputs, item.frame.shape[:2], self.threshold, self.k)
        times = StageTimes(item.decode_s, item.preprocess_s, infer)
        result = Result(item.index, item.frame, outputs, found, times)
        if self.annotate is not None:
            result.shown = self.annotate(result)
        end = time.perf_counter()
        times.postprocess, result.latency_s = end - start, end - item.start
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
    streams = model.streams if streams is None else streams
    if isinstance(streams, bool) or not isinstance(streams, int) or streams < 1:
        raise EdgecvError(f"streams={streams!r}: give how many inferences in flight, 1 or more")
    if budget_s is not None and budget_s < 0:
        raise EdgecvError(f"budget_s={budget_s}: give seconds, 0 or more, or None for no limit")
    opened = open_source(source, live)
    return Video(model, opened, streams, budget_s, threshold, k, annotate, max_frames, pipelined)
