"""An ONNX graph's inputs (initializers are weights, not inputs) and their static shapes:
the shapes the graph declares, with ``--input-shape`` for the dimensions it leaves
symbolic (``batch``, ``height``) or unknown."""

from __future__ import annotations

from dataclasses import dataclass

from ...board.errors import GraphError, ShapeError


@dataclass(frozen=True)
class GraphInput:
    """One input as the graph declares it: a dim is a size, a name (symbolic) or None."""

    name: str
    dims: tuple[int | str | None, ...] | None  # None: the graph gives no rank
    dtype: str

    @property
    def static(self) -> bool:
        return self.dims is not None and all(isinstance(d, int) for d in self.dims)

    def described(self) -> str:
        if self.dims is None:
            return f"{self.name} (rank unknown)"
        return f"{self.name} [{', '.join('?' if d is None else str(d) for d in self.dims)}]"


def graph_inputs(model) -> list[GraphInput]:
    """The model's inputs in graph order, without the initializers some exporters also
    list as inputs."""
    import onnx

    weights = {t.name for t in model.graph.initializer}
    found = []
    for value in model.graph.input:
        if value.name in weights:
            continue
        tensor = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            raise GraphError(
                f"graph input `{value.name}` is not a tensor (a sequence or map); edgecv "
                "deploys models whose inputs are tensors"
            )
        dtype = str(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        dims = None
        if tensor.HasField("shape"):
            dims = tuple(
                d.dim_value
                if d.HasField("dim_value") and d.dim_value > 0
                else (d.dim_param or None)
                for d in tensor.shape.dim
            )
        found.append(GraphInput(value.name, dims, dtype))
    if not found:
        raise GraphError("the ONNX graph has no inputs besides its weights; nothing to feed it")
    return found


def static_shapes(
    inputs: list[GraphInput],
    given: tuple[int, ...] | dict[str, tuple[int, ...]] | None,
    source: str,
) -> dict[str, tuple[int, ...]]:
    """Each input's static shape: ``given`` (one shape for a one-input model, or a shape
    by input name) where the user passed one, else the graph's. One :class:`ShapeError`
    names every input whose shape is still not static, and how to pass it."""
    if given is not None and not isinstance(given, dict):
        if len(inputs) != 1:
            raise ShapeError(
                f"{source} has {len(inputs)} inputs ({', '.join(i.name for i in inputs)}); "
                "give each its shape as --input-shape NAME=DIMS"
            )
        given = {inputs[0].name: tuple(given)}
    given = dict(given or {})
    names = [i.name for i in inputs]
    unknown = [n for n in given if n not in names]
    if unknown:
        raise ShapeError(
            f"--input-shape names {', '.join(unknown)}, which {source} has no input called; "
            f"its inputs are: {', '.join(names)}"
        )
    shapes, symbolic = {}, []
    for value in inputs:
        if value.name in given:
            shape = tuple(int(d) for d in given[value.name])
            _check_against_graph(value, shape, source)
            shapes[value.name] = shape
        elif value.static:
            shapes[value.name] = tuple(int(d) for d in value.dims)
        else:
            symbolic.append(value)
    if symbolic:
        listed = "; ".join(v.described() for v in symbolic)
        example = " ".join(f"--input-shape {v.name}={','.join(_example_dims(v))}" for v in symbolic)
        raise ShapeError(
            f"{source} leaves input dimensions symbolic: {listed}; give every input a static "
            f"shape, e.g. {example}"
        )
    return shapes


def _example_dims(value: GraphInput) -> list[str]:
    """The input's dims for the error's example: its sizes, 1 for a symbolic batch, the
    other symbolic ones as ``<name>`` to fill in."""
    if value.dims is None:
        return ["<N>", "<C>", "<H>", "<W>"]
    return [
        str(d) if isinstance(d, int) else "1" if i == 0 else f"<{d or '?'}>"
        for i, d in enumerate(value.dims)
    ]


def _check_against_graph(value: GraphInput, shape: tuple[int, ...], source: str) -> None:
    """A given shape keeps the graph's rank and its fixed sizes."""
    if value.dims is None:
        return
    fixed = [(i, d) for i, d in enumerate(value.dims) if isinstance(d, int)]
    if len(shape) != len(value.dims) or any(shape[i] != d for i, d in fixed):
        raise ShapeError(
            f"--input-shape {value.name}={','.join(map(str, shape))} does not fit {source}'s "
            f"input {value.described()}: keep its rank and its fixed sizes"
        )
