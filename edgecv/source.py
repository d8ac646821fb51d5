"""The model source of a deploy: a zoo name exported by GluonCV, or a symbol file.

Checked in the order a user needs the answers: a symbol file's operators first (all
unsupported ones in one error), then its parameters, then its input shape.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .errors import ModelNotFoundError, ShapeError
from .frontend import zoo
from .frontend.importer import check_supported
from .frontend.mxnet_graph import load_symbol


def resolve_source(
    model: str,
    work_dir: Path,
    params: str | None = None,
    input_shape: tuple[int, ...] | dict[str, tuple[int, ...]] | None = None,
    pretrained: bool = True,
    seed: int = 0,
    notify: Callable[[str], None] = lambda message: None,
) -> zoo.ExportedModel:
    """A zoo name/alias is exported to ``work_dir``; a ``*-symbol.json`` path is used as is.

    A symbol file is checked in the order a user needs the answers: its operators (all
    unsupported ones in one error), then its parameters (none needed when every variable
    is the ``data`` input), then the input shape (the one assumed is said via
    ``notify``). ``params_path`` is None for a graph without parameters.
    ``input_shape`` is one shape, or a shape per input name for a graph with several
    inputs (``{"data0": ..., "data1": ...}``).
    """
    if not model.endswith(".json"):
        return zoo.export(
            model,
            work_dir,
            params_file=params,
            input_shape=input_shape,
            pretrained=pretrained,
            seed=seed,
        )
    symbol = Path(model)
    if not symbol.is_file():
        raise ModelNotFoundError(f"symbol file {symbol} does not exist")
    graph = load_symbol(symbol)
    check_supported(graph)
    named = dict(input_shape) if isinstance(input_shape, dict) else None
    if params is None:
        guess = Path(str(symbol).removesuffix("-symbol.json") + "-0000.params")
        needed = [n for n in graph.variable_names() if n not in (named or {"data": None})]
        if guess.is_file():
            params = str(guess)
        elif needed:
            shown = ", ".join(needed[:5]) + (", ..." if len(needed) > 5 else "")
            raise ModelNotFoundError(
                f"{symbol} has {len(needed)} parameter(s) ({shown}) and no params file was "
                f"given; {guess.name} is not beside it: pass --params FILE"
            )
    name = symbol.name.removesuffix(".json").removesuffix("-symbol")
    if named:
        missing = [n for n in named if n not in graph.variable_names()]
        if missing:
            raise ShapeError(
                f"--input-shape names {', '.join(missing)}, which {symbol.name} has no input "
                f"called; its inputs and parameters are: {', '.join(graph.variable_names()[:8])}"
            )
        shape = next(iter(named.values()))
    elif input_shape:
        shape = tuple(input_shape)
    else:
        shape = _declared_data_shape(graph) or (1, 3, 224, 224)
        notify(
            f"no --input-shape given: assuming data {'x'.join(map(str, shape))} "
            f"({'declared in the graph' if _declared_data_shape(graph) else 'the default'}); "
            "pass --input-shape N,C,H,W if the model expects another size"
        )
    task = "detection" if _looks_like_detector(symbol) else "classification"
    params_path = Path(params) if params is not None else None
    weights = "params-file" if params_path else "none"
    return zoo.ExportedModel(name, task, symbol, params_path, shape, [], weights, named)


def _declared_data_shape(graph) -> tuple[int, ...] | None:
    for node in graph.nodes:
        if node.op == "null" and node.name == "data" and node.attrs.get("__shape__"):
            try:
                shape = tuple(int(v) for v in node.attrs["__shape__"].strip("()[] ").split(","))
            except ValueError:
                return None
            return shape if len(shape) == 4 and min(shape) > 0 else None
    return None


def source_record(source: zoo.ExportedModel, model: str, params: str | None, seed: int) -> dict:
    """Where the package's source model is, so `edgecv bench` can rebuild its baselines:
    a symbol file by absolute path, a zoo model by name and weights (seeded random
    weights re-export identically)."""

    def absolute(path) -> str | None:
        return str(Path(path).resolve()) if path is not None else None

    if model.endswith(".json"):
        return {
            "kind": "symbol",
            "symbol": absolute(source.symbol_path),
            "params": absolute(source.params_path),
            "input_shape": list(source.input_shape),
        }
    return {
        "kind": "zoo",
        "name": source.name,
        "weights": source.weights,
        "seed": seed,
        "params": absolute(params),
        "input_shape": list(source.input_shape),
    }


def _looks_like_detector(symbol: Path) -> bool:
    text = symbol.read_text()
    return "_contrib_box_nms" in text or "_contrib_MultiBoxDetection" in text
