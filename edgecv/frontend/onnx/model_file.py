"""Reading an ONNX file: the graph and its weights (external data from the file's folder),
and the opset of its default domain, checked against what the frontend converts."""

from __future__ import annotations

from pathlib import Path

from ...board.errors import GraphError, ModelNotFoundError, foreign_message

# The default domain's opsets edgecv imports: from the first opset of ONNX 1.2 (TVM's
# frontend takes models from ONNX 1.1 on) to the newest one the installed onnx package
# defines (onnx 1.17: opset 22), whose operator schemas the converters were written to.
MIN_OPSET = 7
DEFAULT_DOMAINS = ("", "ai.onnx")


def max_opset() -> int:
    """The newest default-domain opset the installed onnx package defines."""
    import onnx

    return int(onnx.defs.onnx_opset_version())


def load_model(path: str | Path):
    """The ``onnx.ModelProto`` in ``path`` with every weight in memory: tensors stored as
    external data are read from files beside it (their locations are relative to the
    file's folder, as ONNX writes them)."""
    import onnx
    from google.protobuf.message import DecodeError

    path = Path(path)
    if not path.is_file():
        raise ModelNotFoundError(f"ONNX file {path} does not exist")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError) as err:
        raise GraphError(
            f"{path} is not a readable ONNX file ({foreign_message(err, 160)}); export the "
            "model again (torch.onnx.export, or the exporter of its framework)"
        ) from None
    if not model.graph.node:
        raise GraphError(f"{path} holds no graph (no nodes); is it an ONNX model file?")
    try:
        onnx.load_external_data_for_model(model, str(path.parent))
    except (OSError, onnx.checker.ValidationError) as err:  # missing, or outside the folder
        raise GraphError(
            f"{path} keeps weights in external data files, and one cannot be read "
            f"({foreign_message(err, 200)}); keep the data files beside the .onnx file, as "
            "the exporter wrote them"
        ) from None
    return model


def model_opset(model) -> int:
    """The opset of the model's default (``ai.onnx``) domain; 1 when it names none."""
    for entry in model.opset_import:
        if entry.domain in DEFAULT_DOMAINS:
            return int(entry.version)
    return 1


def check_opset(model, source: str) -> int:
    """The default domain's opset, or one :class:`GraphError` line when the frontend does
    not import it."""
    opset, newest = model_opset(model), max_opset()
    if not MIN_OPSET <= opset <= newest:
        raise GraphError(
            f"{source} uses ONNX opset {opset}; edgecv imports opsets {MIN_OPSET} to {newest}: "
            f"export it again with an opset in that range (torch.onnx.export(..., "
            f"opset_version={min(max(opset, MIN_OPSET), newest)}), or "
            "onnx.version_converter.convert_version)"
        )
    return opset
