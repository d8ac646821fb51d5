"""``edgecv demo PACKAGE``: a package on live frames (cameras, video files or folders of
images) with boxes, class names, scores and an FPS overlay; per-frame latency printed.
``--headless -o OUT.mp4`` writes the annotated video instead of opening a window.
Several sources play at once, one thread and one stream of the model each.
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from .board.arguments import pin_argument
from .board.errors import EdgecvError
from .board.imaging import Detection, draw, draw_label, opencv
from .board.outputs import check_output_folder

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp"}


def frames(camera: int | None, video: str | None, images: str | None) -> Iterator[np.ndarray]:
    """BGR frames from a camera index, a video file or a folder of images (sorted)."""
    cv2 = opencv()
    if images is not None:
        folder = Path(images)
        files = (
            sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
            if (folder.is_dir())
            else []
        )
        if not files:
            raise EdgecvError(f"--images {folder}: no .jpg/.png/.bmp images in that folder")
        for file in files:
            image = cv2.imread(str(file), cv2.IMREAD_COLOR)
            if image is None:
                raise EdgecvError(f"cannot read image {file}")
            yield image
        return
    if video is not None and not Path(video).is_file():
        raise EdgecvError(f"--video {video} does not exist")
    capture = cv2.VideoCapture(video if video is not None else camera or 0)
    if not capture.isOpened():
        what = f"video {video}" if video is not None else f"camera {camera or 0}"
        raise EdgecvError(f"cannot open {what} (no such camera, or not a video OpenCV can read)")
    try:
        while True:
            ok, frame = capture.read()
            if not ok:
                return
            yield frame
    finally:
        capture.release()


def annotate(model, frame: np.ndarray, result, fps: float | None) -> tuple:
    """(the frame with ``model.predict``'s result drawn, a summary): boxes or the top
    class, under the frame rate."""
    kind = model.processing.decoder.kind
    if kind == "tensor":  # no decoder to draw from: the frame rate alone
        return draw(frame, [], fps), "outputs"
    if kind not in ("logits", "probabilities"):
        return draw(frame, result, fps), len(result)
    label, prob = result[0]
    shown = draw(frame, [], fps)
    draw_label(shown, f"{label} {prob:.2f}", (4, 34), scale=0.6)  # below the frame rate
    return shown, label


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
    """One source played through the shared model: its frames, its video writer, its
    smoothed frame rate. Several run at once, each in a thread of its own, each
    inference in an execution context of its own (the model is loaded with a stream
    per source)."""

    def __init__(self, index: int, kind: str, value, output: str | None, args, many: bool):
        self.index, self.kind, self.value = index, kind, value
        self.name = source_name(kind, value)
        self.out = VideoOut(output, args.fps) if output else None
        self.output = output
        self.args = args
        self.prefix = f"source {index} " if many else ""
        self.count = 0
        self.error: BaseException | None = None

    def frames(self) -> Iterator[np.ndarray]:
        return frames(
            self.value if self.kind == "camera" else None,
            self.value if self.kind == "video" else None,
            self.value if self.kind == "images" else None,
        )

    def play(self, model, show: Callable[[Player, np.ndarray], None], stop: threading.Event):
        """Every frame: predict, annotate, print the latency, write and/or show it."""
        fps = None
        try:
            for count, frame in enumerate(self.frames(), start=1):
                self.count = count
                start = time.perf_counter()
                result = model.predict(frame, threshold=self.args.threshold)
                elapsed = time.perf_counter() - start
                fps = 1.0 / elapsed if fps is None else 0.9 * fps + 0.1 / elapsed  # smoothed
                if self.out is not None and self.out.size is not None:
                    frame, result = fit(frame, result, self.out.size)
                shown, result = annotate(model, frame, result, fps)  # the first frame too
                what = f"{result} detections" if isinstance(result, int) else result
                line = f"{self.prefix}frame {count}: {elapsed * 1e3:.1f} ms  {what}\n"
                sys.stdout.write(line)  # one write: print writes the text and its end apart
                sys.stdout.flush()
                if self.out is not None:
                    self.out.write(shown)
                show(self, shown)
                if stop.is_set() or (self.args.max_frames and self.count >= self.args.max_frames):
                    break
        except BaseException as err:  # re-raised by cmd_demo, in the main thread
            self.error = err
            stop.set()
        finally:
            if self.out is not None:
                self.out.close()


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
    many = len(sources) > 1
    # a stream per source: their inferences run at once, each with its share of the cores
    model = load(args.package, on=args.on, streams=len(sources), sha256=args.sha256)
    model.require_one_input("demo")
    if many:
        names = ", ".join(f"{i}: {source_name(*s)}" for i, s in enumerate(sources, start=1))
        print(f"{len(sources)} sources, a stream each ({names})", flush=True)
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
        for thread in threads if args.headless else ():  # Ctrl-C interrupts a join
            thread.join()
        while any(t.is_alive() for t in threads):  # windows: drawn here as frames come
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
        for thread in threads:
            thread.join()
        if not args.headless:
            cv2.destroyAllWindows()
    for player in players:
        if player.error is not None:
            raise player.error
    for player in players:
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
    d.set_defaults(func=cmd_demo)
