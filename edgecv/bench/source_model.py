"""The package's source model, read again for the baselines ``edgecv bench --vs`` builds:
its ONNX file, its symbol and params files, or a zoo model re-exported with the same
weights (what the manifest records, or ``--source``)."""

from __future__ import annotations

import warnings
from pathlib import Path

from ..board import progress
from ..board.errors import EdgecvError
from ..board.manifest import Manifest
from ..board.package import sha256


def source_files(manifest: Manifest, source: str | None, work: Path) -> tuple[Path, Path | None]:
    """The files of the package's source model: an ONNX file (and None), or the symbol
    and params files of an MXNet graph. ``--source`` (an ``.onnx`` file, or a
    ``*-symbol.json`` with its ``-0000.params`` beside it), else what the manifest records
    (the ONNX file the package was deployed from, a symbol file's path, or a zoo model
    re-exported with the same weights)."""
    if source and source.lower().endswith(".onnx"):
        if not Path(source).is_file():
            raise EdgecvError(f"--source: {source} does not exist")
        return Path(source), None
    if source:
        symbol = Path(source)
        params = Path(str(symbol).removesuffix("-symbol.json") + "-0000.params")
        for path in (symbol, params):
            if not path.is_file():
                raise EdgecvError(f"--source: {path} does not exist")
        return symbol, params
    record = manifest.source
    if record is None:
        raise EdgecvError(
            "this package does not record its source model (deployed by an older edgecv); "
            "pass --source PREFIX-symbol.json"
        )
    if record["kind"] == "onnx":
        return _recorded_onnx(record), None
    if record["kind"] == "symbol":
        symbol, params = Path(record["symbol"]), record.get("params")
        if not symbol.is_file() or (params and not Path(params).is_file()):
            raise EdgecvError(
                f"the package's source model {symbol} is no longer there; pass --source"
            )
        if not params:
            raise EdgecvError("the source graph has no params file; baselines need one")
        return symbol, Path(params)
    from ..frontend.mxnet import zoo

    progress.say(f"re-exporting {record['name']} ({record['weights']} weights) for the baselines")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = zoo.export(
            record["name"],
            work,
            params_file=record.get("params"),
            input_shape=tuple(record["input_shape"]),
            pretrained=record["weights"] == "pretrained",
            seed=record.get("seed", 0),
        )
    return exported.symbol_path, exported.params_path


def _recorded_onnx(record: dict) -> Path:
    """The ONNX file the package was deployed from, refused when it is gone or changed
    (the baselines would run other weights than the package's)."""
    path = Path(record["path"])
    if not path.is_file():
        raise EdgecvError(f"the package's source model {path} is no longer there; pass --source")
    if sha256(path) != record.get("sha256"):
        raise EdgecvError(
            f"the package's source model {path} changed since it was deployed (its sha256 "
            "differs); pass --source with the file it was deployed from"
        )
    return path
