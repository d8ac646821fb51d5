"""The C runtime's loader fuzzed: a package's manifest and plan with one value replaced,
and its manifest, plan and weights with bytes changed (resealed where past the
checksum). Each load either succeeds (and the model runs, or fails to with one
inference error) or is one error line; the process never crashes. Run in the test
process on the plain build, and in a process of its own on the sanitizer build
(``python tests/c_library_fuzz.py BUILD PACKAGE SCRATCH CASES``, with libasan
preloaded): imports neither TVM nor edgecv."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
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


def fuzz(lib, original: Path, scratch: Path, count: int, seed: int = 0) -> set[int]:
    """Load every case from a copy of ``original`` in ``scratch``; the status codes seen."""
    package = scratch / "fuzzed"
    shutil.copytree(original, package)
    codes = set()
    for relative, data in cases(original, np.random.RandomState(seed), count):
        (package / relative).write_bytes(data)
        if relative != "manifest.json":
            reseal(package, relative)
        try:
            model = rc.CModel(lib, package)
        except rc.CError as err:
            assert 0 < err.code <= rc.E_MEMORY and err.message and "\n" not in err.message, err
            codes.add(err.code)
        else:
            try:
                x = [np.zeros(shape, dtype) for _, shape, dtype, _ in model.inputs]
                model.run(*x)
            except rc.CError as err:  # a plan passing every check may not fit its kernels
                assert err.code == rc.E_INFERENCE and "\n" not in err.message, err
            model.close()
            codes.add(rc.OK)
        for name in {"manifest.json", relative}:
            (package / name).write_bytes((original / name).read_bytes())
    shutil.rmtree(package)
    return codes


if __name__ == "__main__":
    build, original, scratch, count = sys.argv[1:]
    print(sorted(fuzz(rc.library(Path(build)), Path(original), Path(scratch), int(count))))
