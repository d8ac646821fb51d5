"""Writing results the user asked for (images, arrays), checked before any work is done.

``cv2.imwrite`` returns False instead of raising when the folder is missing or the
extension is unknown, and ``np.savez`` raises deep inside zipfile: both become one
:class:`~edgecv.board.errors.EdgecvError` naming the path and what to do.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import durable
from .errors import EdgecvError, foreign_message
from .imaging import opencv


def check_output_folder(path: str | Path) -> None:
    """The folder that will hold ``path`` must exist (edgecv does not guess one)."""
    parent = Path(path).parent
    if not parent.is_dir():
        raise EdgecvError(f"cannot write {path}: folder {parent} does not exist; create it first")


def check_image_path(path: str | Path) -> None:
    """``path``'s folder exists and OpenCV can write its extension (.jpg, .png, ...)."""
    check_output_folder(path)
    if not Path(path).suffix or not opencv().haveImageWriter(str(path)):
        raise EdgecvError(
            f"cannot write image {path}: OpenCV has no writer for the extension "
            f"`{Path(path).suffix or '(none)'}`; use .jpg, .png or .bmp"
        )


def save_image(path: str | Path, image: np.ndarray) -> None:
    """Write an image, raising (not returning False) when it was not written."""
    check_image_path(path)
    cv2 = opencv()
    try:  # encoded first, then written whole: a kill never leaves half an image at `path`
        ok, encoded = cv2.imencode(Path(path).suffix, image)
    except cv2.error as err:
        raise EdgecvError(f"cannot write image {path}: {foreign_message(err)}") from None
    if not ok:
        raise EdgecvError(f"cannot write image {path}: OpenCV could not encode it")
    try:
        durable.write_bytes(Path(path), encoded.tobytes())
    except OSError as err:
        raise EdgecvError(f"cannot write image {path}: {err.strerror or err}") from None


def save_arrays(path: str | Path, arrays: dict[str, np.ndarray]) -> Path:
    """``np.savez`` to ``path`` (``.npz`` appended when missing, as NumPy does); returns
    the path written."""
    path = Path(path)
    written = path if path.suffix == ".npz" else path.with_name(path.name + ".npz")
    check_output_folder(written)
    try:  # written beside and renamed: a kill never leaves half an archive at `written`
        with durable.replacing(written) as temporary, open(temporary, "wb") as f:
            np.savez(f, **arrays)
    except OSError as err:
        raise EdgecvError(f"cannot write {written}: {err.strerror or err}") from None
    return written
