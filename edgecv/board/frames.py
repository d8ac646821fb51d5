"""Where frames come from: a camera, a video file or stream, a folder of images, or any
Python iterable of BGR images; and whether the source is *live* (a camera or a network
stream, whose frames go stale while they wait) or not (a file, whose every frame is
wanted, in order). :mod:`.video` plays a :class:`Source` through a model.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Union

import numpy as np

from .errors import EdgecvError
from .imaging import opencv

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp"}

SourceLike = Union[int, str, Path, Iterable[np.ndarray], "Source"]


class Source:
    """Frames of one source, read one after another by :meth:`frames`.

    Parameters
    ----------
    frames : callable
        Called once per playing; returns an iterator of HxWx3 uint8 BGR images.
    name : str
        What the source is, for lines and errors ("video clip.mp4", "camera 0").
    live : bool
        True for a camera or a stream: a frame that waits goes stale, and the newest one
        wins. False for files and folders: every frame is processed, in order.
    """

    def __init__(self, frames, name: str, live: bool):
        self._frames, self.name, self.live = frames, name, live

    def frames(self) -> Iterator[np.ndarray]:
        return iter(self._frames())

    def __repr__(self) -> str:
        return f"Source({self.name!r}, live={self.live})"


def open_source(source: SourceLike, live: bool | None = None) -> Source:
    """``source`` as a :class:`Source`.

    Parameters
    ----------
    source : int, str, Path, iterable of images or Source
        A camera index (int); a folder of .jpg/.png/.bmp images (played in name order);
        a video file; a stream URL (``rtsp://...``, anything with ``://``) OpenCV opens;
        or an iterable of HxWx3 uint8 BGR images (a generator, a list).
    live : bool, optional
        Whether frames go stale while they wait (see :class:`Source`); by default
        cameras and URLs are live, files, folders and iterables are not.
    """
    if isinstance(source, Source):
        return source if live is None else Source(source._frames, source.name, live)
    if isinstance(source, bool):
        raise EdgecvError(f"source {source!r}: give a camera index, a path or frames")
    if isinstance(source, int):
        name = f"camera {source}"
        return Source(lambda: _capture(source, name), name, True if live is None else live)
    if isinstance(source, (str, Path)):
        text = str(source)
        if "://" in text:
            return Source(lambda: _capture(text, text), text, True if live is None else live)
        path = Path(text)
        if path.is_dir():
            return Source(lambda: folder_frames(path), f"images {path}", bool(live))
        name = f"video {path}"
        return Source(lambda: _capture(str(path), name, path), name, bool(live))
    if isinstance(source, Iterable):
        return Source(lambda: source, "frames", bool(live))
    raise EdgecvError(
        f"source of type {type(source).__name__}: give a camera index, a video file, a "
        "folder of images, a stream URL or an iterable of BGR images"
    )


def folder_frames(folder: Path) -> Iterator[np.ndarray]:
    """The images of ``folder``, in name order, as BGR arrays."""
    cv2 = opencv()
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise EdgecvError(f"{folder}: no .jpg/.png/.bmp images in that folder")
    for file in files:
        image = cv2.imread(str(file), cv2.IMREAD_COLOR)
        if image is None:
            raise EdgecvError(f"cannot read image {file}: not an image OpenCV can decode")
        yield image


def _capture(what: Any, name: str, path: Path | None = None) -> Iterator[np.ndarray]:
    """Frames of an OpenCV capture (a camera index, a file, a URL) until it ends."""
    cv2 = opencv()
    if path is not None and not path.is_file():
        raise EdgecvError(f"{name} does not exist; give a video file OpenCV can read")
    capture = cv2.VideoCapture(what)
    try:
        if not capture.isOpened():
            raise EdgecvError(
                f"cannot open {name} (no such camera, or not a video OpenCV can read)"
            )
        while True:
            ok, frame = capture.read()
            if not ok:
                return
            yield frame
    finally:
        capture.release()
