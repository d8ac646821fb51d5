"""The deploy package: a folder with a manifest, the plan, the params and the kernels.

Layout::

    manifest.json        model, profile, inputs/outputs, preprocessing, classes,
                         versions, build facts, sha256 of every other file
                         (:mod:`.manifest`, its one writer and reader)
    plan.json            the static execution plan (:mod:`.plan`)
    params.npz           constant tensors by name
    kernels/cpu.so       kernels per device (one file per backend)

Writing goes to a staging folder beside the destination, renamed into place at the
end (:mod:`.durable`), so a failed or killed deploy never leaves a half-written package
and never loses the one it replaces. Reading checks the format version, the edgecv
version and every checksum before anything is executed, and :class:`Package` hands the
loader each file from the bytes that were checked.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import tarfile
from collections import Counter
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from .durable import (
    PACKAGE,
    clean_stale_staging,
    fsync_tree,
    make_staging,
    remove_staging,
    replacing,
    swap_in,
)
from .errors import PackageError, foreign_message
from .manifest import FORMAT, MANIFEST, SHA256_DIGEST, Manifest
from .plan import Launch, Plan, launches_from_json


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
        model, profile = (
            part.get("name", "?") if isinstance(part, dict) else "?"
            for part in (manifest.get("model"), manifest.get("profile"))
        )
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
        # deploys killed here before: their staging folders go, a package they had
        # moved aside comes back (before the check, which then sees it)
        clean_stale_staging(self.destination.parent)
        check_destination(self.destination, force)
        self.destination.parent.mkdir(parents=True, exist_ok=True)
        self.staging = make_staging(self.destination)
        self.root = self.staging / PACKAGE

    def path(self, relative: str) -> Path:
        full = self.root / relative
        full.parent.mkdir(parents=True, exist_ok=True)
        return full

    def write_text(self, relative: str, text: str) -> None:
        """A text file; a name ending in ``.gz`` is written gzipped (no timestamp, so the
        same text gives the same bytes): see :func:`read_package_text`."""
        data = text.encode("utf-8")
        if relative.endswith(".gz"):
            data = gzip.compress(data, mtime=0)
        self.path(relative).write_bytes(data)

    def write_arrays(self, relative: str, arrays: dict[str, np.ndarray]) -> None:
        with open(self.path(relative), "wb") as f:
            np.savez(f, **arrays)

    def commit(self, manifest: Manifest) -> Path:
        """Write ``manifest``, sealed with the sha256 of every file written, and move the
        package into place."""
        files = sorted(p for p in self.root.rglob("*") if p.is_file())
        sealed = manifest.sealed({str(p.relative_to(self.root)): sha256(p) for p in files})
        (self.root / MANIFEST).write_text(sealed.to_json())
        # Checked again: something may have appeared there while the model compiled.
        check_destination(self.destination, self.force)
        swap_in(self.staging, self.destination)
        return self.destination

    def abort(self) -> None:
        remove_staging(self.staging)


def _archive_members(tar: tarfile.TarFile, folder: str, archive_path: Path) -> None:
    """Every member must be a file or a folder inside ``folder/``: no absolute paths, no
    ``..``, no links. Deploy never writes a link, and links cannot be checked one by one:
    a chain of them, each pointing inside as written, can lead out, and a Python
    without tarfile's ``data`` filter (3.9's early releases) extracts through it."""

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
            raise refuse(
                member,
                f"is a link (to `{member.linkname}`), and a package archive holds only "
                "files and folders",
            )
        if not (member.isfile() or member.isdir()):
            raise refuse(member, "is a device, pipe or other special file")


def unpack_if_archive(path: Path, pin: str | None = None) -> Path:
    """A ``.tar.gz`` package is extracted next to itself (once) and its folder returned.

    Extraction goes to a temporary sibling, then is renamed into place, and only when
    every member lies inside the package folder (and its manifest is the one ``pin``
    names, when given). A folder already there is used when it is the same package (same
    manifest) and refused otherwise: it is never overwritten.
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
            if pin is not None:
                _check_pin(packed_manifest, pin, path)
            if target.exists() or target.is_symlink():
                if (target / MANIFEST).is_file() and (
                    target / MANIFEST
                ).read_bytes() == packed_manifest:
                    return target
                raise PackageError(
                    f"{target} exists and is not the package in {path.name}; edgecv will not "
                    "overwrite it: move it away or load the folder itself"
                )
            # a marked staging folder: one a killed extraction leaves is removed by the
            # next extraction or deploy beside it (durable.clean_stale_staging)
            clean_stale_staging(path.parent, target.name)
            staging = make_staging(target)
            try:
                # the members were checked above; Python 3.9-3.11 before mid-2023 releases
                # lack extraction filters, newer ones warn without one
                if hasattr(tarfile, "data_filter"):
                    tar.extractall(staging / PACKAGE, filter="data")
                else:
                    tar.extractall(staging / PACKAGE)
                fsync_tree(staging / PACKAGE)
                (staging / PACKAGE / target.name).rename(target)
            finally:
                remove_staging(staging)
    except KeyError:
        raise PackageError(
            f"{path} is not an edgecv package archive: it has no {target.name}/{MANIFEST}"
        ) from None
    except (tarfile.TarError, OSError, EOFError) as err:
        raise PackageError(f"{path} is not a readable package archive: {err}") from None
    return target


class Package:
    """A package read by :func:`open_package`: its folder, manifest and pin (the sha256
    of the manifest), and the bytes of each file the loader reads as they were checked
    (:meth:`take`): what runs is what was checked, whatever the file holds by then."""

    def __init__(self, root: Path, manifest: Manifest, pin: str, checked: dict):
        self.root, self.manifest, self.sha256 = root, manifest, pin
        self._checked = checked
        self._uses = Counter(manifest.loaded_files)

    def take(self, relative: str) -> bytes:
        """The checked bytes of package file ``relative``; dropped after its last use, so
        the params are not held twice while they load."""
        data = self._checked[relative]
        self._uses[relative] -= 1
        if self._uses[relative] <= 0:
            del self._checked[relative]
        return data

    def plan(self) -> Plan:
        """The package's plan, checked (:meth:`Plan.check`) and matching the manifest's
        inputs: a damaged plan is refused here, not met half-way through an inference."""
        path = self.root / "plan.json"
        try:
            plan = Plan.from_json(self.take("plan.json").decode("utf-8"))
        except ValueError as err:  # not UTF-8 or JSON, or not a plan (FormatError)
            reason = err.msg if isinstance(err, json.JSONDecodeError) else _reason(err)
            raise PackageError(f"{path} is malformed: {reason}; redeploy the model") from None
        declared = [(list(t.shape), t.dtype) for t in self.manifest.inputs]
        planned = [(list(plan.buffers[b].shape), plan.buffers[b].dtype) for b in plan.inputs]
        if declared != planned:
            raise PackageError(
                f"{path} takes inputs {planned} (shape, dtype) and its manifest says "
                f"{declared}; the package is inconsistent: redeploy the model"
            )
        return plan

    def params(self) -> dict[str, np.ndarray]:
        """The package's constants by name, from the bytes of params.npz as checked."""
        return read_params(self.root, self.take("params.npz"))

    def file(self, relative: str | None, binary: bool) -> bytes | str | None:
        """The package file ``relative`` as it was checked: bytes, or text (gunzipped);
        None for no file."""
        if relative is None:
            return None
        path, data = self.root / relative, self.take(relative)
        try:
            return data if binary else read_package_text(path, data)
        except (OSError, ValueError, EOFError) as err:  # gzip: BadGzipFile, EOFError
            raise PackageError(f"cannot read {path}: {_reason(err)}; redeploy the model") from None

    def kernel_text(self, key: str) -> str:
        """The text file ``build.kernels[key]`` (OpenCL C, CUDA, launches), refused when
        the manifest names none or it is not text."""
        kernels = self.manifest.kernels
        if key not in kernels:
            raise PackageError(f"{self.root}/{MANIFEST} names no `build.kernels.{key}`; redeploy")
        return self.file(kernels[key], binary=False)

    def launches(self, key: str) -> dict[str, list[Launch]]:
        """The GPU launches recorded in ``build.kernels[key]``, checked."""
        try:
            return launches_from_json(self.kernel_text(key))
        except ValueError as err:  # not JSON, or not launches (FormatError)
            path = self.root / self.manifest.kernels[key]
            raise PackageError(f"{path} is malformed: {err}; redeploy") from None


def read_params(root: Path, data: bytes | None = None) -> dict[str, np.ndarray]:
    """The constants of the package at ``root`` by name (from ``data``, the bytes of its
    params.npz as they were checked, when given); an unreadable params.npz is refused in
    one line."""
    path = root / "params.npz"
    try:
        with np.load(path if data is None else io.BytesIO(data)) as npz:
            return {k: npz[k] for k in npz.files}
    except MemoryError:
        raise PackageError(f"{path} needs more memory than this machine has") from None
    except Exception as err:  # BadZipFile, zlib.error, ValueError, EOFError, OSError, ...
        raise PackageError(
            f"cannot read {path} ({type(err).__name__}: {_reason(err)}); redeploy the model"
        ) from None


def _reason(err: BaseException) -> str:
    """Why reading a package file failed, on one line."""
    return foreign_message(err, limit=300)


def read_manifest(
    path: str | Path, verify: bool = True, sha256: str | None = None
) -> tuple[Path, Manifest]:
    """Locate a package, check its manifest (and checksums), return (folder, manifest);
    see :func:`open_package`."""
    package = open_package(path, verify, sha256, keep=False)
    return package.root, package.manifest


def open_package(
    path: str | Path, verify: bool = True, sha256: str | None = None, keep: bool = True
) -> Package:
    """Locate a package and check it: its manifest against the pin ``sha256`` when given,
    then field by field (:func:`~edgecv.board.manifest.check_manifest`); with ``verify`` every
    file it lists against its sha256, and every file the loader reads (the plan, the
    params, each kernel file) must be listed. Nothing of a package is read, and no kernel library
    reaches the dynamic loader, before its bytes are known to be the ones the deploy
    wrote; with ``keep`` the bytes checked of those files are kept for the loader.

    The checksums sit in the package's own manifest: they catch damage, not someone who
    can write the package; the pin (printed by ``edgecv deploy``) catches that too.
    """
    pin = check_pin(sha256)
    root = unpack_if_archive(Path(path), pin)
    manifest_path = root / MANIFEST
    if not root.exists():
        raise PackageError(f"package {root} does not exist; create one with `edgecv deploy`")
    if not manifest_path.is_file():
        raise PackageError(f"{root} is not an edgecv package: {MANIFEST} is missing")
    try:
        data = manifest_path.read_bytes()
        if pin is not None:
            _check_pin(data, pin, root)
        manifest = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as err:  # not UTF-8, not JSON, nested too deep
        reason = err.msg if isinstance(err, json.JSONDecodeError) else type(err).__name__
        raise PackageError(
            f"{manifest_path} is corrupt ({reason}); redeploy the model or copy the package again"
        ) from None
    except OSError as err:
        raise PackageError(f"cannot read {manifest_path}: {err.strerror or err}") from None
    checked_manifest = Manifest.checked(manifest, root)
    checked = _check_files(root, checked_manifest, keep) if verify else {}
    return Package(root, checked_manifest, hashlib.sha256(data).hexdigest(), checked)


def _check_files(root: Path, manifest: Manifest, keep: bool) -> dict[str, bytes]:
    """Check every file the manifest lists; return the bytes checked of those the loader
    reads (with ``keep``)."""
    files, loaded = manifest.files, manifest.loaded_files
    for relative in loaded:
        if relative not in files:
            raise PackageError(
                f"{root / MANIFEST} lists no checksum for {relative}, which the loader "
                "reads; the manifest is damaged: redeploy the model"
            )
    checked = {}
    for relative, expected in files.items():
        file = root / relative
        if not file.is_file():
            raise PackageError(f"package {root} is missing {relative}; redeploy the model")
        try:
            if keep and relative in loaded:
                checked[relative] = file.read_bytes()
                actual = hashlib.sha256(checked[relative]).hexdigest()
            else:
                actual = sha256(file)
        except OSError as err:
            raise PackageError(f"cannot read package file {file}: {err.strerror}") from None
        if actual != expected:
            raise PackageError(f"package file {file} is corrupt (checksum mismatch); redeploy")
    return checked


def check_pin(sha256: str | None) -> str | None:
    """A package pin as given (``edgecv.load(sha256=)``, ``--sha256``), in lower case;
    refused unless it is 64 hex digits."""
    if sha256 is None:
        return None
    pin = sha256.strip().lower() if isinstance(sha256, str) else None
    if pin is None or not SHA256_DIGEST.fullmatch(pin):
        raise PackageError(
            f"sha256 {sha256!r:.80} is not a package pin: give the 64 hex digits `edgecv "
            "deploy` printed (the sha256 of the package's manifest.json)"
        )
    return pin


def _check_pin(manifest: bytes, pin: str, where: Path) -> None:
    found = hashlib.sha256(manifest).hexdigest()
    if found != pin:
        raise PackageError(
            f"{where} is not the pinned package: its manifest has sha256 {found}, the pin "
            f"expects {pin}; load the package the pin was printed for (its manifest lists "
            "every file's sha256, so any change to the package changes it)"
        )


def manifest_sha256(root: str | Path) -> str:
    """The pin of the package folder ``root``: the sha256 of its manifest, which lists
    the sha256 of every other file (``edgecv.load(path, sha256=...)``)."""
    return hashlib.sha256((Path(root) / MANIFEST).read_bytes()).hexdigest()


def archive(root: str | Path, force: bool = False) -> Path:
    """Pack a package folder into ``<folder>.tar.gz`` (for copying to a device).

    An existing archive is replaced only with ``force`` and only when it is an edgecv
    package archive; any other file of that name is left alone. The archive is written
    beside it and renamed over it when whole, so a failure leaves the old one.
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
    kept = "the archive there is unchanged" if out.exists() else "nothing was written"
    try:
        with replacing(out) as temporary, tarfile.open(temporary, "w:gz") as tar:
            tar.add(root, arcname=root.name)
    except OSError as err:
        raise PackageError(f"cannot write {out}: {err.strerror or err}; {kept}") from None
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


def read_package_text(path: Path, data: bytes | None = None) -> str:
    """A package's text file (``data``: its bytes, already read), gunzipped when its name
    ends in ``.gz`` (the GPU kernels' source: OpenCL C and CUDA text take a tenth of the
    bytes; 2.8 MB for SSD-512)."""
    data = path.read_bytes() if data is None else data
    if path.name.endswith(".gz"):
        data = gzip.decompress(data)
    return data.decode("utf-8")
