"""The deploy package: a folder with a manifest, the plan, the params and the kernels.

Layout::

    manifest.json        model, profile, inputs/outputs, preprocessing, classes,
                         versions, build facts, sha256 of every other file
    plan.json            the static execution plan
    params.npz           constant tensors by name
    kernels/cpu.so       kernels per device (one file per backend)

Writing goes to a temporary sibling folder renamed into place at the end, so a
failed deploy never leaves a half-written package. Reading checks the format
version, the edgecv version and every checksum before anything is executed.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from ._version import __version__
from .errors import PackageError

FORMAT = "edgecv-package"
FORMAT_VERSION = 2  # 2: plans place steps and buffers on devices (CPU fallback)
MANIFEST = "manifest.json"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def package_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest of the edgecv package folder at ``path``, or None when it is not one."""
    try:
        manifest = json.loads((Path(path) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("format") == FORMAT else None


def check_destination(destination: str | Path, force: bool = False) -> None:
    """Refuse to write a package where it would replace something that is not one.

    Nothing there: fine. An edgecv package (a folder whose manifest says so): replaced
    only with ``force``. Anything else (a file, a folder of the user's): refused, force
    or not, because edgecv never deletes what it did not write.
    """
    path = Path(destination)
    if not path.exists() and not path.is_symlink():
        return
    if path.is_symlink() or not path.is_dir():
        raise PackageError(
            f"{path} exists and is not an edgecv package folder (it is a "
            f"{'link' if path.is_symlink() else 'file'}); edgecv will not replace it: "
            "choose another -o"
        )
    manifest = package_manifest(path)
    if manifest is None:
        raise PackageError(
            f"{path} exists and is not an edgecv package (no edgecv {MANIFEST} in it); "
            "edgecv will not delete or write into it: choose another -o"
        )
    if not force:
        model = manifest.get("model", {}).get("name", "?")
        profile = manifest.get("profile", {}).get("name", "?")
        raise PackageError(
            f"{path} already holds an edgecv package ({model} for {profile}); "
            "pass --force to replace it, or choose another -o"
        )


class PackageWriter:
    """Collects a package's files in a temporary folder; :meth:`commit` moves it in place.

    Parameters
    ----------
    destination : path
        The package folder to create.
    force : bool
        Replace an existing edgecv package there. Anything else there is never touched
        (see :func:`check_destination`), checked both now and at commit.
    """

    def __init__(self, destination: str | Path, force: bool = False):
        self.destination = Path(destination)
        self.force = force
        check_destination(self.destination, force)
        self.destination.parent.mkdir(parents=True, exist_ok=True)
        self.root = Path(
            tempfile.mkdtemp(prefix=f".{self.destination.name}.", dir=self.destination.parent)
        )

    def path(self, relative: str) -> Path:
        full = self.root / relative
        full.parent.mkdir(parents=True, exist_ok=True)
        return full

    def write_text(self, relative: str, text: str) -> None:
        self.path(relative).write_text(text)

    def write_arrays(self, relative: str, arrays: dict[str, np.ndarray]) -> None:
        with open(self.path(relative), "wb") as f:
            np.savez(f, **arrays)

    def commit(self, manifest: dict[str, Any]) -> Path:
        files = sorted(p for p in self.root.rglob("*") if p.is_file())
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            **manifest,
            "files": {str(p.relative_to(self.root)): sha256(p) for p in files},
        }
        (self.root / MANIFEST).write_text(json.dumps(manifest, indent=2))
        # Checked again: something may have appeared there while the model compiled.
        check_destination(self.destination, self.force)
        if self.destination.exists():
            # Move the old package aside first, so a failure in between loses neither.
            old = Path(
                tempfile.mkdtemp(prefix=f".{self.destination.name}.old.", dir=self.root.parent)
            )
            old.rmdir()
            self.destination.rename(old)
            self.root.rename(self.destination)
            shutil.rmtree(old)
        else:
            self.root.rename(self.destination)
        return self.destination

    def abort(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _archive_members(tar: tarfile.TarFile, folder: str, archive_path: Path) -> None:
    """Every member must lie inside ``folder/``: no absolute paths, no ``..``, no link
    pointing out of it, nothing but files, folders and links."""

    def refuse(member: tarfile.TarInfo, why: str) -> PackageError:
        return PackageError(
            f"{archive_path} is not a safe package archive: member `{member.name}` {why}; "
            "nothing was extracted"
        )

    for member in tar.getmembers():
        parts = PurePosixPath(member.name).parts
        if member.name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", member.name):
            raise refuse(member, "has an absolute path")
        if ".." in parts:
            raise refuse(member, "climbs out with `..`")
        if not parts or parts[0] != folder:
            raise refuse(member, f"lies outside the package folder `{folder}/`")
        if member.issym() or member.islnk():
            base = PurePosixPath(*parts[:-1]) if member.issym() else PurePosixPath()
            target = PurePosixPath(member.linkname)
            if target.is_absolute() or not _inside(base / target, folder):
                raise refuse(member, f"is a link pointing outside it (to `{member.linkname}`)")
        elif not (member.isfile() or member.isdir()):
            raise refuse(member, "is a device, pipe or other special file")


def _inside(path: PurePosixPath, folder: str) -> bool:
    depth = []
    for part in path.parts:
        if part == "..":
            if not depth:
                return False
            depth.pop()
        elif part != ".":
            depth.append(part)
    return bool(depth) and depth[0] == folder


def unpack_if_archive(path: Path) -> Path:
    """A ``.tar.gz`` package is extracted next to itself (once) and its folder returned.

    Extraction goes to a temporary sibling, then is renamed into place, and only when
    every member lies inside the package folder. A folder already there is used when it
    is the same package (same manifest) and refused otherwise: it is never overwritten.
    """
    if not (path.is_file() and path.name.endswith((".tar.gz", ".tgz"))):
        return path
    target = path.with_name(path.name.removesuffix(".tar.gz").removesuffix(".tgz"))
    try:
        with tarfile.open(path) as tar:
            _archive_members(tar, target.name, path)
            member = tar.extractfile(f"{target.name}/{MANIFEST}")
            if member is None:
                raise KeyError(MANIFEST)
            packed_manifest = member.read()
            if target.exists() or target.is_symlink():
                if (target / MANIFEST).is_file() and (
                    target / MANIFEST
                ).read_bytes() == packed_manifest:
                    return target
                raise PackageError(
                    f"{target} exists and is not the package in {path.name}; edgecv will not "
                    "overwrite it: move it away or load the folder itself"
                )
            staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=path.parent))
            try:
                # the members were checked above; Python 3.9-3.11 before mid-2023 releases
                # lack extraction filters, newer ones warn without one
                if hasattr(tarfile, "data_filter"):
                    tar.extractall(staging, filter="data")
                else:
                    tar.extractall(staging)
                (staging / target.name).rename(target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    except KeyError:
        raise PackageError(
            f"{path} is not an edgecv package archive: it has no {target.name}/{MANIFEST}"
        ) from None
    except (tarfile.TarError, OSError, EOFError) as err:
        raise PackageError(f"{path} is not a readable package archive: {err}") from None
    return target


def read_manifest(path: str | Path, verify: bool = True) -> tuple[Path, dict[str, Any]]:
    """Locate a package, check its manifest (and checksums), return (folder, manifest)."""
    root = unpack_if_archive(Path(path))
    manifest_path = root / MANIFEST
    if not root.exists():
        raise PackageError(f"package {root} does not exist; create one with `edgecv deploy`")
    if not manifest_path.is_file():
        raise PackageError(f"{root} is not an edgecv package: {MANIFEST} is missing")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as err:
        raise PackageError(f"{manifest_path} is corrupt: {err}") from None
    if manifest.get("format") != FORMAT:
        raise PackageError(f"{root} is not an edgecv package (format {manifest.get('format')!r})")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise PackageError(
            f"{root} has package format {manifest.get('format_version')}, this edgecv reads "
            f"format {FORMAT_VERSION}; redeploy the model with this edgecv"
        )
    built_with = manifest.get("versions", {}).get("edgecv")
    if built_with != __version__:
        raise PackageError(
            f"{root} was built by edgecv {built_with}, this is edgecv {__version__}; kernels and "
            "plans are not portable across versions: redeploy the model"
        )
    if verify:
        for relative, expected in manifest.get("files", {}).items():
            file = root / relative
            if not file.is_file():
                raise PackageError(f"package {root} is missing {relative}; redeploy the model")
            if sha256(file) != expected:
                raise PackageError(f"package file {file} is corrupt (checksum mismatch); redeploy")
    return root, manifest


def archive(root: str | Path, force: bool = False) -> Path:
    """Pack a package folder into ``<folder>.tar.gz`` (for copying to a device).

    An existing archive is replaced only with ``force`` and only when it is an edgecv
    package archive; any other file of that name is left alone.
    """
    root = Path(root)
    out = root.with_name(root.name + ".tar.gz")
    if out.exists() or out.is_symlink():
        if not _is_package_archive(out, root.name):
            raise PackageError(
                f"{out} exists and is not an edgecv package archive; edgecv will not "
                "overwrite it: move it away"
            )
        if not force:
            raise PackageError(f"{out} already exists; pass --force to replace it")
    with tarfile.open(out, "w:gz") as tar:
        tar.add(root, arcname=root.name)
    return out


def _is_package_archive(path: Path, folder: str) -> bool:
    if path.is_symlink() or not path.is_file():
        return False
    try:
        with tarfile.open(path) as tar:
            member = tar.extractfile(f"{folder}/{MANIFEST}")
            manifest = json.loads(member.read()) if member is not None else None
    except (tarfile.TarError, OSError, EOFError, KeyError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == FORMAT
