"""On-disk cache of compiled device programs, so a package's second start skips the compiler.

Entries are keyed by a SHA-256 over everything that decides the binary: the program
source, the build options, and the device and driver identity (an OpenCL platform and
driver version; a CUDA architecture and nvcc version). A new driver or edgecv's own
newer code generation is a new key; nothing is ever invalidated by hand. The folder
is ``$EDGECV_CACHE_DIR`` or ``~/.cache/edgecv/kernels``; deleting it is always safe.
Entries are written to a temporary file and renamed, so concurrent processes and a
crash mid-write leave either a whole entry or none; an entry that fails to load is
deleted and rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path


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
    path = entry_path(key, suffix)
    try:
        return path.read_bytes()
    except OSError:
        return None


def write(key: str, suffix: str, data: bytes) -> None:
    """Store an entry atomically; a read-only or full disk only costs the cache."""
    path = entry_path(key, suffix)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        pass


def forget(key: str, suffix: str) -> None:
    entry_path(key, suffix).unlink(missing_ok=True)


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
