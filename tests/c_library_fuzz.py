"""The C runtime's loader fuzzed: a package's manifest and plan with one value replaced,
its manifest, plan and weights with bytes changed (resealed where past the checksum),
and its .tar.gz with bytes of the tar changed. Each load either succeeds (and the model
runs, or fails to with one inference error) or is one error line; the process never
crashes. Run in the test process on the plain build, and in a process of its own on the
sanitizer build (``python tests/c_library_fuzz.py BUILD PACKAGE SCRATCH CASES``, with
libasan preloaded): imports neither TVM nor edgecv."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import sys
import tarfile
from pathlib import Path

import c_library as rc
import numpy as np

VALUES = [None, -1, 0, 1, 7, 64, 2**31, 2**63 - 1, 2**70, 1.5, -0.0, "", "x", "../x", [], {}, True]


def reseal(package: Path, relative: str) -> None:
    """Record the current sha256 of ``relative`` in the manifest: a change then reaches
    the reader of that file, past the checksums."""
    manifest = json.loads((package / "manifest.json").read_text())
    manifest["files"][relative] = hashlib.sha256((package / relative).read_bytes()).hexdigest()
    (package / "manifest.json").write_text(json.dumps(manifest, indent=2))


def leaves(value, path=()):
    """Every (path, value) of a JSON document, the document itself first."""
    yield path, value
    if isinstance(value, dict):
        items = value.items()
    else:
        items = enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        yield from leaves(child, (*path, key))


def replaced(document, path, value):
    if not path:
        return value
    document = json.loads(json.dumps(document))
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return document


def cases(original: Path, rng: np.random.RandomState, count: int) -> list[tuple[str, bytes]]:
    """(file, new bytes): ``count`` value replacements per JSON file, ``count // 2``
    byte changes per file."""
    made = []
    for relative in ("manifest.json", "plan.json"):
        document = json.loads((original / relative).read_text())
        paths = [path for path, _ in leaves(document)]
        for _ in range(count):
            where, value = paths[rng.randint(len(paths))], VALUES[rng.randint(len(VALUES))]
            made.append((relative, json.dumps(replaced(document, where, value)).encode()))
    for relative in ("manifest.json", "plan.json", "params.npz"):
        data = (original / relative).read_bytes()
        for _ in range(count // 2):
            changed = bytearray(data)
            for at in rng.randint(len(data), size=rng.randint(1, 4)):
                changed[at] = rng.randint(256)
            made.append((relative, bytes(changed)))
    return made


def load_and_run(lib, package: Path, codes: set[int]) -> None:
    """Load ``package``: one error line, or a model that runs (or fails to, in one line)."""
    try:
        model = rc.CModel(lib, package)
    except rc.CError as err:
        assert 0 < err.code <= rc.E_ARCHIVE and err.message and "\n" not in err.message, err
        codes.add(err.code)
        return
    try:
        model.run(*[np.zeros(shape, dtype) for _, shape, dtype, _ in model.inputs])
    except rc.CError as err:  # a plan passing every check may not fit its kernels
        assert err.code == rc.E_INFERENCE and "\n" not in err.message, err
    model.close()
    codes.add(rc.OK)


def resealed_header(tar: bytearray, at: int) -> None:
    """The header at ``at`` with its checksum made right again (changes past it reach the
    reader of names, sizes and types)."""
    header = tar[at : at + 512]
    header[148:156] = b" " * 8
    tar[at + 148 : at + 156] = b"%06o\0 " % sum(header)


def fuzz_archive(lib, original: Path, scratch: Path, count: int, seed: int = 0) -> set[int]:
    """The package's .tar.gz with bytes of its tar headers changed (their checksums made
    right again half the time), gzipped again: past gzip's checksum, into the tar
    reader, ``count`` times."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(original, arcname=original.name)
    with tarfile.open(fileobj=io.BytesIO(buffer.getvalue())) as tar:
        headers = [m.offset for m in tar.getmembers()]
    data, rng, codes = buffer.getvalue(), np.random.RandomState(seed), set()
    folder = scratch / "archives"
    folder.mkdir()
    for _ in range(count):
        changed = bytearray(data)
        header = headers[rng.randint(len(headers))]
        for _ in range(rng.randint(1, 4)):
            changed[header + rng.choice([rng.randint(148), 156 + rng.randint(356)])] = rng.randint(
                256
            )
        if rng.rand() < 0.5:
            resealed_header(changed, header)
        packed = gzip.compress(bytes(changed), compresslevel=1, mtime=0)
        (folder / f"{original.name}.tar.gz").write_bytes(packed)
        load_and_run(lib, folder / f"{original.name}.tar.gz", codes)
    shutil.rmtree(folder)
    return codes


def fuzz(lib, original: Path, scratch: Path, count: int, seed: int = 0) -> set[int]:
    """Load every case from a copy of ``original`` in ``scratch``; the status codes seen."""
    package = scratch / "fuzzed"
    shutil.copytree(original, package)
    codes = set()
    for relative, data in cases(original, np.random.RandomState(seed), count):
        (package / relative).write_bytes(data)
        if relative != "manifest.json":
            reseal(package, relative)
        load_and_run(lib, package, codes)
        for name in {"manifest.json", relative}:
            (package / name).write_bytes((original / name).read_bytes())
    shutil.rmtree(package)
    return codes


if __name__ == "__main__":
    build, original, scratch, count = sys.argv[1:]
    lib, original, scratch, count = (
        rc.library(Path(build)),
        Path(original),
        Path(scratch),
        int(count),
    )
    print(sorted(fuzz(lib, original, scratch, count) | fuzz_archive(lib, original, scratch, count)))
