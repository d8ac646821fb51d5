"""``edgecv demo PACKAGE``: a package on live frames (cameras, video files or folders of
images) with boxes, class names, scores, an FPS overlay and the stage times; a line of
stage times per frame, a summary per source. ``--headless -o OUT.mp4`` writes the
annotated video instead of opening a window. Each source plays through the pipeline of
:mod:`edgecv.board.video` (``--sequential``: one frame after another); several play at
once, each with ``--streams`` streams of the model.
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .board.arguments import pin_argument
from .board.errors import EdgecvError
from .board.frames import Source, open_source
from .board.imaging import Detection, draw, draw_label, opencv
from .board.outputs import check_output_folder
from .board.video import Video, video
from .board.video_results import Result


def annotate(model, frame: np.ndarray, result, fps: float | None, stats: str = "") -> np.ndarray:
    """The frame with ``model.predict``'s result drawn (boxes or the top class), under
    the frame rate and the pipeline's ``stats`` (drawn first: boxes go over them)."""
    kind = model.processing.decoder.kind
    frame = draw_stats(frame.copy(), stats) if stats else frame
    if kind == "tensor":  # no decoder to draw from: the frame rate alone
        return draw(frame, [], fps)
    if kind not in ("logits", "probabilities"):
        return draw(frame, result, fps)
    label, prob = result[0]
    shown = draw(frame, [], fps)
    draw_label(shown, f"{label} {prob:.2f}", (4, 26 + STATS_LINES * 14), scale=0.6)
    return shown


STATS_LINES = 2  # of the overlay under the frame rate


def draw_stats(image: np.ndarray, stats: str) -> np.ndarray:
    """``stats`` (lines split at "; ") in small white text on black below the frame rate,
    in place."""
    for row, text in enumerate(stats.split("; ")[:STATS_LINES]):
        draw_label(image, text, (4, 26 + row * 14), (255, 255, 255), (0, 0, 0), scale=0.35)
    return image


def overlay_text(summary: dict) -> str:
    """The overlay's two lines: the stages' mean milliseconds; the latency and drops."""
    return (
        f"decode {summary['decode_ms']:.1f} pre {summary['preprocess_ms']:.1f} infer "
        f"{summary['infer_ms']:.1f} post {summary['postprocess_ms']:.1f} ms; latency p50 "
        f"{summary['p50_ms']:.1f} p99 {summary['p99_ms']:.1f} ms, {summary['dropped']} dropped"
    )


def what_was_found(model, result) -> str:
    """A frame's result in a word or two: its detections' count, its top class."""
    kind = model.processing.decoder.kind
    if kind == "tensor":
        return "outputs"
    if kind in ("logits", "probabilities"):
        return str(result[0][0])
    return f"{len(result)} detections"


def fit(frame: np.ndarray, result, size: tuple[int, int]) -> tuple[np.ndarray, list]:
    """``frame`` scaled to fit ``size`` (width, height) with its aspect kept, on black,
    and ``result``'s boxes moved with it (a classifier's classes are kept)."""
    cv2 = opencv()
    h, w = frame.shape[:2]
    width, height = size
    if (w, h) == (width, height):
        return frame, result
    scale = min(width / w, height / h)
    new_w, new_h = max(1, round(w * scale)), max(1, round(h * scale))
    canvas = np.zeros((height, width, 3), frame.dtype)
    top, left = (height - new_h) // 2, (width - new_w) // 2
    canvas[top : top + new_h, left : left + new_w] = cv2.resize(
        frame, (new_w, new_h), interpolation=cv2.INTER_AREA
    )
    offset = (left, top, left, top)
    moved = [
        Detection(
            d.label, d.score, tuple(v * scale + o for v, o in zip(d.box, offset, strict=True))
        )
        if isinstance(d, Detection)
        else d
        for d in result
    ]
    return canvas, moved


class VideoOut:
    """An mp4 writer opened on the first frame, whose size is the video's. Frames of
    another size (a folder of photos) must be fitted to :attr:`size` before they are
    annotated: OpenCV's writer drops them without a word, and text drawn first would
    shrink with a large photo."""

    def __init__(self, path: str, fps: float):
        self.path, self.fps, self.writer = path, fps, None
        self.size: tuple[int, int] | None = None

    def write(self, frame: np.ndarray) -> None:
        height, width = frame.shape[:2]
        if self.writer is None:
            self.size = (width, height)
            cv2 = opencv()
            fourcc = cv2.VideoWriter_fourcc(*"mp4v")
            self.writer = cv2.VideoWriter(self.path, fourcc, self.fps, self.size)
            if not self.writer.isOpened():
                raise EdgecvError(f"cannot write video {self.path}: OpenCV has no mp4 writer")
        assert (width, height) == self.size, "fit() frames to the video's size first"
        self.writer.write(frame)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.release()


class AddSource(argparse.Action):
    """Collects ``--camera``/``--video``/``--images`` in command-line order, each may be
    given several times: ``args.sources`` is a list of (kind, value)."""

    def __call__(self, parser, namespace, values, option_string=None):
        sources = list(getattr(namespace, "sources", None) or [])
        sources.append((self.const, values))
        namespace.sources = sources


def source_name(kind: str, value) -> str:
    return f"camera {value}" if kind == "camera" else f"{kind} {value}"


def output_paths(output: str | None, count: int) -> list[str | None]:
    """Where each source's annotated video goes: ``-o OUT.mp4`` itself for one source,
    ``OUT-1.mp4``, ``OUT-2.mp4``, ... for several (in the order given)."""
    if output is None:
        return [None] * count
    if count == 1:
        return [output]
    path = Path(output)
    return [str(path.with_name(f"{path.stem}-{i}{path.suffix}")) for i in range(1, count + 1)]


class Player:
    """One source played through the shared model by :func:`edgecv.board.video.video`
    (decode, inference and drawing in stages of their own, ``--streams`` inferences in
    flight; ``--sequential``: one frame after another): its video writer, its lines.
    Several play at once, each consumed by a thread of its own, each with its own
    streams of the model."""

    def __init__(self, index: int, kind: str, value, output: str | None, args, many: bool):
        self.index, self.kind, self.value = index, kind, value
        self.name = source_name(kind, value)
        self.out = VideoOut(output, args.fps) if output else None
        self.output = output
        self.args = args
        self.prefix = f"source {index} " if many else ""
        self.count = 0
        self.error: BaseException | None = None
        self.fps: float | None = None  # smoothed, of the results as they come
        self.previous: float | None = None
        self.summary = ""
        # what the main thread waits on: a Thread.join() that Ctrl-C interrupts can leave
        # the thread marked as ended (seen on CPython 3.11), and the next join returns at
        # once while it still writes its video
        self.finished = threading.Event()

    def source(self) -> Source:
        if self.kind == "video" and not Path(self.value).is_file():
            raise EdgecvError(f"--video {self.value} does not exist")
        if self.kind == "images" and not Path(self.value).is_dir():
            raise EdgecvError(f"--images {self.value}: no .jpg/.png/.bmp images in that folder")
        return open_source(self.value if self.kind != "camera" else int(self.value))

    def annotate(self, model, playing: Video, r: Result) -> np.ndarray:
        """Run by the pipeline's postprocess stage, in frame order: the frame fitted
        into the video's size, its boxes, the frame rate and the stage times drawn."""
        now = time.perf_counter()
        if self.previous is None:  # the first frame: the rate of its stages alone
            first = r.times.decode + r.times.preprocess + r.times.infer
            self.fps = 1.0 / max(first, 1e-6)
        else:
            assert self.fps is not None
            self.fps = 0.9 * self.fps + 0.1 / max(now - self.previous, 1e-6)
        self.previous = now
        frame, found = r.frame, r.result
        if self.out is not None:
            if self.out.size is None:  # the first frame's size is the video's
                self.out.size = (frame.shape[1], frame.shape[0])
            frame, found = fit(frame, found, self.out.size)
        return annotate(model, frame, found, self.fps, overlay_text(playing.stats.summary()))

    def play(self, model, show: Callable[[Player, np.ndarray], None], stop: threading.Event):
        """Every frame: predict, annotate, print the stage times, write and/or show it."""
        args = self.args
        try:
            playing = video(
                model,
                self.source(),
                args.streams,
                threshold=args.threshold,
                annotate=lambda r: self.annotate(model, playing, r),
                max_frames=args.max_frames,
                pipelined=not args.sequential,
            )
            with playing:
                for r in playing:
                    self.count += 1
                    self.report(model, r, playing.stats.dropped)
                    assert r.shown is not None
                    if self.out is not None:
                        self.out.write(r.shown)
                    show(self, r.shown)
                    if stop.is_set():
                        break
            self.summary = f"{self.prefix}{self.name}: {playing.stats.line()}"
        except BaseException as err:  # re-raised by cmd_demo, in the main thread
            self.error = err
            stop.set()
        finally:
            if self.out is not None:
                self.out.close()
            self.finished.set()

    def report(self, model, r: Result, dropped: int) -> None:
        t = r.times
        line = (
            f"{self.prefix}frame {r.index + 1}: {t.infer * 1e3:.1f} ms  "
            f"{what_was_found(model, r.result)}  (decode {t.decode * 1e3:.1f}, preprocess "
            f"{t.preprocess * 1e3:.1f}, postprocess {t.postprocess * 1e3:.1f} ms; latency "
            f"{r.latency_s * 1e3:.1f} ms; {dropped} dropped)\n"
        )
        sys.stdout.write(line)  # one write: print writes the text and its end apart
        sys.stdout.flush()


def cmd_demo(args) -> int:
    from .board.model import load

    cv2 = opencv()

    if args.headless and not args.output:
        raise EdgecvError("--headless needs -o OUT.mp4 (where the annotated video goes)")
    sources = getattr(args, "sources", None) or [("camera", 0)]
    outputs = output_paths(args.output, len(sources))
    if args.output:
        if not args.output.endswith(".mp4"):
            raise EdgecvError(f"-o {args.output}: the demo writes .mp4 video")
        check_output_folder(args.output)
    if args.streams < 1:
        raise EdgecvError(f"--streams {args.streams}: give inferences in flight per source, 1+")
    many = len(sources) > 1
    # streams per source: their inferences run at once, each with its share of the cores
    streams = len(sources) * args.streams
    model = load(args.package, on=args.on, streams=streams, sha256=args.sha256)
    model.require_one_input("demo")
    if many:
        names = ", ".join(f"{i}: {source_name(*s)}" for i, s in enumerate(sources, start=1))
        each = "a stream" if args.streams == 1 else f"{args.streams} streams"
        print(f"{len(sources)} sources, {each} each ({names})", flush=True)
    players = [
        Player(i, kind, value, out, args, many)
        for i, ((kind, value), out) in enumerate(zip(sources, outputs, strict=True), start=1)
    ]
    stop = threading.Event()
    shown: queue.SimpleQueue = queue.SimpleQueue()  # windows are drawn by the main thread

    def show(player: Player, frame: np.ndarray) -> None:
        if not args.headless:
            shown.put((player, frame))

    threads = [
        threading.Thread(target=p.play, args=(model, show, stop), daemon=True) for p in players
    ]
    for thread in threads:
        thread.start()
    try:
        for player in players if args.headless else ():  # Ctrl-C interrupts a wait
            player.finished.wait()
        while not all(p.finished.is_set() for p in players):  # windows: drawn as they come
            try:
                player, frame = shown.get(timeout=0.05)
            except queue.Empty:
                continue
            cv2.imshow(f"edgecv demo {player.index}: {player.name} (q quits)", frame)
            if cv2.waitKey(1) & 0xFF == ord("q"):
                stop.set()
    except KeyboardInterrupt:
        stop.set()
    finally:
        for player, thread in zip(players, threads, strict=True):
            player.finished.wait()
            thread.join()
        if not args.headless:
            cv2.destroyAllWindows()
    for player in players:
        if player.error is not None:
            raise player.error
    for player in players:
        print(player.summary)
        if player.out is not None:
            print(f"wrote {player.output} ({player.count} frames)")
    return 0


def add_parser(sub, common) -> None:
    """Register ``demo`` on the CLI's subparsers."""
    d = sub.add_parser(
        "demo",
        parents=[common],
        help="run a package on cameras/videos/images",
        description="Sources may be repeated and mixed (--video a.mp4 --camera 0): each "
        "plays in a thread of its own through one loaded model with a stream per source.",
    )
    d.add_argument("package", help="package folder or .tar.gz")
    pin_argument(d)
    add = {"action": AddSource, "dest": "sources"}
    d.add_argument("--camera", type=int, const="camera", help="camera index (default 0)", **add)
    d.add_argument("--video", const="video", help="a video file", **add)
    d.add_argument(
        "--images", const="images", help="a folder of images, shown in name order", **add
    )
    d.add_argument("--headless", action="store_true", help="no window (needs -o)")
    d.add_argument(
        "-o",
        "--output",
        help="write the annotated video here (.mp4); with several sources OUT-1.mp4, "
        "OUT-2.mp4, ... in the order given",
    )
    d.add_argument("--fps", type=float, default=10.0, help="frame rate of the written video")
    d.add_argument(
        "--threshold",
        type=float,
        help="detection score threshold (default 0.5; the decoder's 0.25 for Ultralytics)",
    )
    d.add_argument("--max-frames", type=int, default=0, help="stop after N frames of each source")
    d.add_argument("--on", help="OpenCL device: part of its platform/device name")
    d.add_argument(
        "--streams",
        type=int,
        default=1,
        help="inferences in flight per source (the model is loaded with this many a source)",
    )
    d.add_argument(
        "--sequential",
        action="store_true",
        help="decode, infer and draw one frame after another (the loop before pipelining)",
    )
    d.set_defaults(func=cmd_demo)
