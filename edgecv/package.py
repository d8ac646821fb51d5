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
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__
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


class PackageWriter:
    """Collects a package's files in a temporary folder; :meth:`commit` moves it in place."""

    def __init__(self, destination: str | Path):
        self.destination = Path(destination)
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
        if self.destination.exists():
            shutil.rmtree(self.destination)
        self.root.rename(self.destination)
        return self.destination

    def abort(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def unpack_if_archive(path: Path) -> Path:
    """A ``.tar.gz`` package is extracted next to itself (once) and its folder returned."""
    if path.is_file() and path.name.endswith((".tar.gz", ".tgz")):
        target = path.with_name(path.name.removesuffix(".tar.gz").removesuffix(".tgz"))
        if not (target / MANIFEST).is_file():
            try:
                with tarfile.open(path) as tar:
                    tar.extractall(target.parent, filter="data")
            except (tarfile.TarError, OSError) as err:
                raise PackageError(f"{path} is not a readable package archive: {err}") from None
        return target
    return path


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


def archive(root: str | Path) -> Path:
    """Pack a package folder into ``<folder>.tar.gz`` (for copying to a device)."""
    root = Path(root)
    out = root.with_name(root.name + ".tar.gz")
    with tarfile.open(out, "w:gz") as tar:
        tar.add(root, arcname=root.name)
    return out
