"""The model source of a deploy: a zoo name exported by GluonCV, an MXNet symbol file, or
an ONNX file; each resolved source imports itself (:meth:`MXNetSource.import_model`,
:meth:`OnnxSource.import_model`), so deploy and tune ask it for the Relax module without
knowing which frontend ran.

Checked in the order a user needs the answers: a model file's operators first (all
unsupported ones in one error), then its parameters, then its input shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .board.errors import ModelNotFoundError, ShapeError
from .board.package import sha256
from .frontend.imported import ImportedModel
from .frontend.mxnet import zoo
from .frontend.mxnet.importer import check_supported, from_mxnet
from .frontend.mxnet.mxnet_graph import load_params, load_symbol

Shapes = tuple[int, ...] | dict[str, tuple[int, ...]] | None


@dataclass
class MXNetSource:
    """An MXNet graph on disk (a symbol file, or a zoo model exported to a folder that
    lives while the source is imported) and what the manifest records of it."""

    exported: zoo.ExportedModel
    record: dict = field(default_factory=dict)

    name = property(lambda self: self.exported.name)
    task = property(lambda self: self.exported.task)
    weights = property(lambda self: self.exported.weights)
    classes = property(lambda self: self.exported.classes)
    file = property(lambda self: self.exported.symbol_path)

    def import_model(self) -> ImportedModel:
        """The graph and its parameters as a Relax module."""
        graph = load_symbol(self.exported.symbol_path)
        params = self.exported.params_path
        return from_mxnet(graph, load_params(params) if params else {}, self.exported.graph_inputs)


@dataclass
class OnnxSource:
    """An ONNX file, read and checked (opset, operators, input shapes) when resolved."""

    file: Path
    model: object  # onnx.ModelProto, its weights in memory
    input_shapes: dict[str, tuple[int, ...]]
    record: dict
    task: str = "classification"
    weights: str = "onnx-file"
    classes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.file.stem

    def import_model(self) -> ImportedModel:
        """The graph and its weights as a Relax module."""
        from .frontend.onnx.importer import from_onnx

        return from_onnx(self.model, self.input_shapes, source=self.file.name)


ModelSource = MXNetSource | OnnxSource


def resolve_source(
    model: str,
    work_dir: Path,
    params: str | None = None,
    input_shape: Shapes = None,
    pretrained: bool = True,
    seed: int = 0,
    notify: Callable[[str], None] = lambda message: None,
) -> ModelSource:
    """The source ``model`` names, ready to import: a zoo name/alias is exported to
    ``work_dir`` (which must live until it is imported); a ``*-symbol.json`` or ``*.onnx``
    path is read as is.

    ``input_shape`` is one shape, or a shape per input name for a graph with several
    inputs (``{"data0": ..., "data1": ...}``). The source's ``record`` is what the
    manifest keeps of it, so `edgecv bench` can rebuild its baselines.
    """
    if model.lower().endswith(".onnx"):
        if params is not None:
            raise ModelNotFoundError(
                f"--params does not apply to {Path(model).name}: an ONNX file carries its "
                "weights (or names the external data files beside it)"
            )
        return resolve_onnx(Path(model), input_shape)
    if not model.endswith(".json"):
        exported = zoo.export(
            model,
            work_dir,
            params_file=params,
            input_shape=input_shape,
            pretrained=pretrained,
            seed=seed,
        )
        return MXNetSource(exported, _zoo_record(exported, params, seed))
    exported = _resolve_symbol(Path(model), params, input_shape, notify)
    return MXNetSource(exported, _symbol_record(exported))


def resolve_onnx(path: Path, input_shape: Shapes = None) -> OnnxSource:
    """An ONNX file read and checked in the order a user needs the answers: the file, its
    opset, its operators (all unsupported ones in one error), its input shapes (symbolic
    dimensions need ``input_shape``)."""
    from .frontend.onnx.graph_inputs import graph_inputs, static_shapes
    from .frontend.onnx.model_file import check_opset, load_model
    from .frontend.onnx.ops import registered_ops
    from .frontend.onnx.qdq import check_format

    model = load_model(path)
    check_opset(model, path.name)
    check_format(model, path.name)  # a QOperator model: one line, not its ops listed
    registered_ops(model)
    shapes = static_shapes(graph_inputs(model), input_shape, path.name)
    outputs = model.graph.output
    rank = len(outputs[0].type.tensor_type.shape.dim) if len(outputs) == 1 else 0
    record = {
        "kind": "onnx",
        "path": str(path.resolve()),
        "sha256": sha256(path),
        "input_shapes": {n: list(s) for n, s in shapes.items()},
    }
    # a classifier's logits, top-5 for `run IMAGE`; other outputs are plain tensors
    task = "classification" if rank == 2 else "tensor"
    return OnnxSource(path, model, shapes, record, task)


def _resolve_symbol(
    symbol: Path, params: str | None, input_shape: Shapes, notify: Callable[[str], None]
) -> zoo.ExportedModel:
    """A symbol file, checked in the order a user needs the answers: its operators (all
    unsupported ones in one error), then its parameters (none needed when every variable
    is the ``data`` input; ``params_path`` is None for a graph without parameters), then
    the input shape (the one assumed is said via ``notify``)."""
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


def _absolute(path) -> str | None:
    return str(Path(path).resolve()) if path is not None else None


def _symbol_record(source: zoo.ExportedModel) -> dict:
    """A symbol file, by absolute path."""
    return {
        "kind": "symbol",
        "symbol": _absolute(source.symbol_path),
        "params": _absolute(source.params_path),
        "input_shape": list(source.input_shape),
    }


def _zoo_record(source: zoo.ExportedModel, params: str | None, seed: int) -> dict:
    """A zoo model by name and weights (seeded random weights re-export identically)."""
    return {
        "kind": "zoo",
        "name": source.name,
        "weights": source.weights,
        "seed": seed,
        "params": _absolute(params),
        "input_shape": list(source.input_shape),
    }


def _looks_like_detector(symbol: Path) -> bool:
    text = symbol.read_text()
    return "_contrib_box_nms" in text or "_contrib_MultiBoxDetection" in text
