"""Writes a crash cannot half-do: a file replaced whole, a package folder swapped in with
the one it replaces recoverable, and the staging folders of killed processes cleaned.

A rename alone is not enough: after a power loss the new name may survive while the
bytes written before it do not (ext4 and XFS write data back later than the rename), so
every file is fsynced before it is renamed into place, and its folder after.

A package folder is written in a staging folder beside its destination, named
``.<destination>.edgecv-<pid>-<random>`` and holding :data:`STAGING_MARKER` (the pid,
host and destination) and ``package/``. The swap moves the package it replaces into the
staging folder (``previous/``) before moving the new one in, so a process killed
between the two renames leaves the old package inside a staging folder whose marker
says where it belongs: the next deploy beside it, or a load of the missing destination,
puts it back (:func:`clean_stale_staging`). edgecv deletes a staging folder only when
its marker is there and names a process of this host that is gone (or, the process
gone, the folder holds nothing but the marker it was writing).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

from . import progress

STAGING_MARKER = "edgecv-staging.json"
PACKAGE = "package"  # the new package, inside the staging folder
PREVIOUS = "previous"  # the package being replaced, while the swap runs
_STAGING_NAME = re.compile(r"^\.(?P<destination>.+)\.edgecv-(?P<pid>\d+)-[^.]+$")


def fsync_folder(folder: Path) -> None:
    """Make the names in ``folder`` (files created, renamed, removed) durable."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # a file system that cannot sync a folder syncs its names itself
        pass
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Make every file under ``root`` and the folders naming them durable."""
    for folder, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                os.fsync(f.fileno())
        fsync_folder(Path(folder))


@contextlib.contextmanager
def replacing(path: Path, mode: int = 0o666) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; when the block ends without an
    exception its file is fsynced and renamed over ``path``, else it is removed: a
    reader of ``path`` sees the old file or the whole new one, never a part. The file
    is created with ``mode`` less the umask, as ``open`` would create ``path``."""
    while True:
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode))
            break
        except FileExistsError:
            continue
    try:
        yield temporary
        with open(temporary, "rb") as f:
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)


def write_bytes(path: Path, data: bytes, mode: int = 0o666) -> None:
    """Replace ``path`` with ``data`` as :func:`replacing` does."""
    with replacing(path, mode) as temporary:
        temporary.write_bytes(data)


def make_staging(destination: Path) -> Path:
    """A new staging folder beside ``destination``, marked as this process's; the
    package's files go in its ``package/``."""
    staging = Path(
        tempfile.mkdtemp(
            prefix=f".{destination.name}.edgecv-{os.getpid()}-", dir=destination.parent
        )
    )
    marker = {
        "written_by": "edgecv",
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "destination": destination.name,
    }
    # synced: after a power loss between the swap's renames it says whose package
    # the staging folder holds
    write_bytes(staging / STAGING_MARKER, json.dumps(marker).encode())
    (staging / PACKAGE).mkdir()
    return staging


def swap_in(staging: Path, destination: Path) -> None:
    """Move ``staging/package`` to ``destination``, the package there first moved into
    ``staging/previous`` and deleted once the new one is in place."""
    fsync_tree(staging / PACKAGE)
    previous = staging / PREVIOUS
    if destination.exists():
        destination.rename(previous)
    try:
        (staging / PACKAGE).rename(destination)
    except BaseException:  # Ctrl-C or a failing rename: the old package goes back
        if previous.exists():
            previous.rename(destination)
        raise
    fsync_folder(destination.parent)
    remove_staging(staging)


def remove_staging(staging: Path) -> None:
    """Delete a staging folder, its marker last: a process killed while deleting it
    leaves a folder the next deploy still knows as edgecv's."""
    try:
        entries = list(os.scandir(staging))
    except OSError:
        return
    for entry in entries:
        if entry.name == STAGING_MARKER:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
    with contextlib.suppress(OSError):
        (staging / STAGING_MARKER).unlink(missing_ok=True)
        staging.rmdir()


def clean_stale_staging(parent: Path, destination: str | None = None) -> None:
    """Remove the staging folders in ``parent`` whose deploy was killed (of those for
    ``destination`` only, when given), first putting back a package a killed swap had
    moved aside where its destination is still empty; each restore is said in one line.
    A folder edgecv did not mark, or one of a live process, is left alone."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        found = _STAGING_NAME.match(name)
        if found is None or destination not in (None, found["destination"]):
            continue
        staging, pid = parent / name, int(found["pid"])
        marker = _marker(staging)
        if marker is None:  # killed before its marker was written: nothing else is in it
            if _only_marker_being_written(staging) and not _alive(pid):
                remove_staging(staging)
            continue
        if (marker["pid"], marker["destination"]) != (pid, found["destination"]):
            continue
        if marker["host"] != socket.gethostname() or _alive(pid):
            continue
        if _put_back(staging / PREVIOUS, parent / marker["destination"]):
            remove_staging(staging)


def _put_back(previous: Path, target: Path) -> bool:
    """Move a package a killed swap left in ``previous`` back to ``target`` if nothing
    took its place; False when it had to stay (and the user was told where it is)."""
    if not previous.is_dir() or target.exists() or target.is_symlink():
        return True
    try:
        previous.rename(target)
    except OSError as err:
        progress.say(
            f"a deploy was killed while replacing {target}; its previous package is at "
            f"{previous} and could not be moved back ({err.strerror}): move it there yourself"
        )
        return False
    fsync_folder(target.parent)
    progress.say(f"restored {target}, which a killed deploy had moved aside")
    return True


def _only_marker_being_written(staging: Path) -> bool:
    if staging.is_symlink() or not staging.is_dir():
        return False
    try:
        names = os.listdir(staging)
    except OSError:
        return False
    return all(n.startswith(f".{STAGING_MARKER}.") and n.endswith(".tmp") for n in names)


def _marker(staging: Path) -> dict | None:
    """The staging folder's marker, or None when it is not one edgecv wrote."""
    path = staging / STAGING_MARKER
    if staging.is_symlink() or not staging.is_dir() or path.is_symlink():
        return None
    try:
        marker = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("written_by") != "edgecv":
        return None
    if type(marker.get("pid")) is not int or not all(
        isinstance(marker.get(key), str) for key in ("host", "destination")
    ):
        return None
    return marker


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True
