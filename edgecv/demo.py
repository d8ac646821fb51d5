"""``edgecv demo PACKAGE``: a package on live frames (camera, video file or a folder of
images) with boxes, class names, scores and an FPS overlay; per-frame latency printed.
``--headless -o OUT.mp4`` writes the annotated video instead of opening a window.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np

from .errors import EdgecvError
from .imaging import draw
from .outputs import check_output_folder

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp"}


def frames(camera: int | None, video: str | None, images: str | None) -> Iterator[np.ndarray]:
    """BGR frames from a camera index, a video file or a folder of images (sorted)."""
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


def annotate(model, frame: np.ndarray, threshold: float, fps: float | None) -> tuple:
    """(the frame with the result drawn, a summary): boxes or the top class."""
    result = model.predict(frame, threshold=threshold)
    if model.task != "classification":
        return draw(frame, result, fps), len(result)
    label, prob = result[0]
    shown = draw(frame, [], fps)
    cv2.putText(shown, f"{label} {prob:.2f}", (8, 44), cv2.FONT_HERSHEY_SIMPLEX, 0.6,
                (0, 200, 255), 2, cv2.LINE_AA)  # fmt: skip
    return shown, label


class VideoOut:
    """An mp4 writer opened on the first frame (its size is the video's)."""

    def __init__(self, path: str, fps: float):
        self.path, self.fps, self.writer = path, fps, None

    def write(self, frame: np.ndarray) -> None:
        if self.writer is None:
            height, width = frame.shape[:2]
            fourcc = cv2.VideoWriter_fourcc(*"mp4v")
            self.writer = cv2.VideoWriter(self.path, fourcc, self.fps, (width, height))
            if not self.writer.isOpened():
                raise EdgecvError(f"cannot write video {self.path}: OpenCV has no mp4 writer")
        self.writer.write(frame)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.release()


def cmd_demo(args) -> int:
    from .model import load

    if args.headless and not args.output:
        raise EdgecvError("--headless needs -o OUT.mp4 (where the annotated video goes)")
    if args.output:
        if not args.output.endswith(".mp4"):
            raise EdgecvError(f"-o {args.output}: the demo writes .mp4 video")
        check_output_folder(args.output)
    model = load(args.package, on=args.on)
    out = VideoOut(args.output, args.fps) if args.output else None
    fps, count = None, 0
    try:
        for count, frame in enumerate(frames(args.camera, args.video, args.images), start=1):
            start = time.perf_counter()
            shown, result = annotate(model, frame, args.threshold, fps)
            elapsed = time.perf_counter() - start
            fps = 1.0 / elapsed if fps is None else 0.9 * fps + 0.1 / elapsed  # smoothed
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
