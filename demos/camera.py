"""Camera demo: run a deployed detector or classifier on live frames, draw boxes and FPS.

    python demos/camera.py PACKAGE                  # camera 0
    python demos/camera.py PACKAGE --source clip.mp4
    python demos/camera.py PACKAGE --source frames/ --out annotated/   # image folder, headless

With no camera (a server, CI), give a video file or a folder of images; with
``--out`` the annotated frames are written there instead of shown in a window.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np

import edgecv
from edgecv.errors import EdgecvError
from edgecv.imaging import draw

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp"}


def frames(source: str) -> Iterator[tuple[str, np.ndarray]]:
    """Frames from a camera index, a video file or a folder of images."""
    path = Path(source)
    if path.is_dir():
        for file in sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES):
            image = cv2.imread(str(file))
            if image is not None:
                yield file.name, image
        return
    capture = cv2.VideoCapture(int(source) if source.isdigit() else source)
    if not capture.isOpened():
        raise EdgecvError(f"cannot open video source {source!r}: no camera there, or no such file")
    index = 0
    while True:
        ok, frame = capture.read()
        if not ok:
            break
        yield f"frame{index:05d}.jpg", frame
        index += 1
    capture.release()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package")
    parser.add_argument("--source", default="0", help="camera index, video file or image folder")
    parser.add_argument("--out", help="write annotated frames to this folder (no window)")
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--max-frames", type=int, default=0, help="stop after N frames (0: all)")
    args = parser.parse_args()
    try:
        model = edgecv.load(args.package)
        out = Path(args.out) if args.out else None
        if out:
            out.mkdir(parents=True, exist_ok=True)
        fps = None
        for count, (name, frame) in enumerate(frames(args.source), start=1):
            start = time.perf_counter()
            result = model.predict(frame, threshold=args.threshold)
            elapsed = time.perf_counter() - start
            fps = 1.0 / elapsed if fps is None else 0.9 * fps + 0.1 / elapsed
            if model.task == "classification":
                label, prob = result[0]
                shown = draw(frame, [], fps)
                cv2.putText(
                    shown,
                    f"{label} {prob:.2f}",
                    (8, 44),
                    cv2.FONT_HERSHEY_SIMPLEX,
                    0.6,
                    (0, 200, 255),
                    2,
                    cv2.LINE_AA,
                )
            else:
                shown = draw(frame, result, fps)
            print(
                f"{name}: {len(result) if model.task != 'classification' else result[0][0]} "
                f"({elapsed * 1e3:.1f} ms)",
                flush=True,
            )
            if out:
                cv2.imwrite(str(out / name), shown)
            else:
                cv2.imshow("edgecv", shown)
                if cv2.waitKey(1) & 0xFF == ord("q"):
                    break
            if args.max_frames and count >= args.max_frames:
                break
    except EdgecvError as err:
        print(f"camera demo: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
