"""``edgecv demo PACKAGE``: a package on live frames (camera, video file or a folder of
images) with boxes, class names, scores and an FPS overlay; per-frame latency printed.
``--headless -o OUT.mp4`` writes the annotated video instead of opening a window.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .errors import EdgecvError
from .imaging import Detection, draw, draw_label, opencv
from .outputs import check_output_folder

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp"}


def frames(camera: int | None, video: str | None, images: str | None) -> Iterator[np.ndarray]:
    """BGR frames from a camera index, a video file or a folder of images (sorted)."""
    cv2 = opencv()
    if images is not None:
        folder = Path(images)
        files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES) if (
            folder.is_dir()
        ) else []  # fmt: skip
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
    if model.task != "classification":
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


def cmd_demo(args) -> int:
    from .model import load

    cv2 = opencv()

    if args.headless and not args.output:
        raise EdgecvError("--headless needs -o OUT.mp4 (where the annotated video goes)")
    if args.output:
        if not args.output.endswith(".mp4"):
            raise EdgecvError(f"-o {args.output}: the demo writes .mp4 video")
        check_output_folder(args.output)
    model = load(args.package, on=args.on)
    model.require_one_input("demo")
    out = VideoOut(args.output, args.fps) if args.output else None
    fps, count = None, 0
    try:
        for count, frame in enumerate(frames(args.camera, args.video, args.images), start=1):
            start = time.perf_counter()
            result = model.predict(frame, threshold=args.threshold)
            elapsed = time.perf_counter() - start
            fps = 1.0 / elapsed if fps is None else 0.9 * fps + 0.1 / elapsed  # smoothed
            if out is not None and out.size is not None:
                frame, result = fit(frame, result, out.size)
            shown, result = annotate(model, frame, result, fps)  # the first frame has it too
            what = f"{result} detections" if model.task != "classification" else result
            print(f"frame {count}: {elapsed * 1e3:.1f} ms  {what}", flush=True)
            if out is not None:
                out.write(shown)
            if not args.headless:
                cv2.imshow("edgecv demo (q quits)", shown)
                if cv2.waitKey(1) & 0xFF == ord("q"):
                    break
            if args.max_frames and count >= args.max_frames:
                break
    finally:
        if out is not None:
            out.close()
        if not args.headless:
            cv2.destroyAllWindows()
    if out is not None:
        print(f"wrote {args.output} ({count} frames)")
    return 0


def add_parser(sub, common) -> None:
    """Register ``demo`` on the CLI's subparsers."""
    d = sub.add_parser("demo", parents=[common], help="run a package on a camera/video/images")
    d.add_argument("package", help="package folder or .tar.gz")
    source = d.add_mutually_exclusive_group()
    source.add_argument("--camera", type=int, help="camera index (default 0)")
    source.add_argument("--video", help="a video file")
    source.add_argument("--images", help="a folder of images, shown in name order")
    d.add_argument("--headless", action="store_true", help="no window (needs -o)")
    d.add_argument("-o", "--output", help="write the annotated video here (.mp4)")
    d.add_argument("--fps", type=float, default=10.0, help="frame rate of the written video")
    d.add_argument("--threshold", type=float, default=0.5, help="detection score threshold")
    d.add_argument("--max-frames", type=int, default=0, help="stop after N frames (0: all)")
    d.add_argument("--on", help="OpenCL device: part of its platform/device name")
    d.set_defaults(func=cmd_demo)
