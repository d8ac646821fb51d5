"""On-disk cache of compiled device programs, so a package's second start skips the compiler.

Entries are keyed by a SHA-256 over everything that decides the binary: the program
source, the build options, and the device and driver identity (an OpenCL platform and
driver version; a CUDA architecture and nvcc version). A new driver or edgecv's own
newer code generation is a new key; nothing is ever invalidated by hand. The folder
is ``$EDGECV_CACHE_DIR`` or ``~/.cache/edgecv/kernels``; deleting it is always safe.
Entries are written to a temporary file, fsynced and renamed, so concurrent processes,
a crash or a power loss mid-write leave either a whole entry or none. Each entry starts
with the SHA-256 of its bytes, checked on every read: one that does not match (a bad
disk, a file system that lost the data behind the name) is deleted and built again, as
is one the driver refuses to load (OpenCL), never loaded and never fatal.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from ..durable import write_bytes

# An entry is this, the hex SHA-256 of the payload, a newline and the payload; an entry
# of an older edgecv (no header) reads as damaged and is built again.
_HEADER = b"edgecv-kernel-cache-1 sha256:"


def cache_dir() -> Path:
    env = os.environ.get("EDGECV_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "edgecv" / "kernels"


def cache_key(*parts: str | bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def entry_path(key: str, suffix: str) -> Path:
    return cache_dir() / f"{key[:40]}.{suffix}"


def read(key: str, suffix: str) -> bytes | None:
    """The entry's payload, or None when there is none or it is damaged (then it is
    deleted, so the caller's build replaces it)."""
    try:
        data = entry_path(key, suffix).read_bytes()
    except OSError:
        return None
    header, _, payload = data.partition(b"\n")
    if header != _HEADER + hashlib.sha256(payload).hexdigest().encode():
        forget(key, suffix)
        return None
    return payload


def write(key: str, suffix: str, data: bytes) -> None:
    """Store an entry atomically; a read-only or full disk only costs the cache."""
    path = entry_path(key, suffix)
    digest = hashlib.sha256(data).hexdigest().encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes(path, _HEADER + digest + b"\n" + data, mode=0o600)
    except OSError:
        pass


def forget(key: str, suffix: str) -> None:
    try:
        entry_path(key, suffix).unlink(missing_ok=True)
    except OSError:  # a read-only cache: the entry is read, found bad, and built again
        pass


def get_or_build(parts: Sequence[str | bytes], suffix: str, build: Callable[[], bytes]) -> bytes:
    key = cache_key(*parts)
    found = read(key, suffix)
    if found is not None:
        return found
    data = build()
    write(key, suffix, data)
    return data


def compile_cuda_cached(source: str, arch: str) -> bytes:
    """A cubin for ``arch`` from ``source`` with this machine's nvcc, cached."""
    from ..errors import EdgecvError
    from .nvcc import compile_source, find_nvcc, nvcc_version

    nvcc = find_nvcc()
    if nvcc is None:
        raise EdgecvError(
            f"this package carries CUDA source only (no binary for {arch}) and there is no "
            "nvcc on this machine to compile it; install the CUDA toolkit, or redeploy on a "
            f"machine whose nvcc supports {arch}"
        )
    parts = ("cuda", source, arch, nvcc_version(nvcc))
    return get_or_build(parts, "cubin", lambda: compile_source(source, arch, "cubin", nvcc))
