"""MXNet graph + params -> Relax IRModule.

The whole graph is checked before any node is converted: unsupported operators are
reported together (with counts), then parameters that are missing or of the wrong
shape. Parameters become constants bound in the module, so later passes can fold them.
"""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Iterator

import numpy as np
import tvm
from tvm import relax

from ...board.errors import (
    ConversionError,
    EdgecvError,
    GraphError,
    ParamsError,
    QuantizedGraphError,
    ShapeError,
    UnsupportedOpsError,
    foreign_message,
)
from ..imported import ImportedModel, check_input_shapes
from .attrs import Attrs
from .context import Context
from .converters import CONVERTERS
from .mxnet_graph import MXNetGraph
from .registered import CUSTOM, convert_registered, op_key, registered_for


def supported_ops() -> list[str]:
    """The MXNet operator names edgecv converts."""
    return sorted(CONVERTERS)


# Ops of MXNet's int8 graphs (quantization passes, MKL-DNN fused subgraphs): such a graph
# is refused as a whole, not op by op, since its float32 twin is what edgecv deploys.
_QUANTIZED_PREFIXES = (
    "_contrib_quantize",
    "_contrib_dequantize",
    "_contrib_requantize",
    "_contrib_quantized_",
    "_sg_mkldnn_",
)


def check_supported(graph: MXNetGraph) -> None:
    """Raise one :class:`UnsupportedOpsError` naming every op without a converter
    (one :class:`QuantizedGraphError` for an int8 graph)."""
    quantized = {op: n for op, n in graph.op_counts().items() if op.startswith(_QUANTIZED_PREFIXES)}
    if quantized:
        raise QuantizedGraphError(quantized)
    missing: dict[str, int] = {}
    for node in graph.nodes:
        if node.op == "null":
            continue
        if registered_for(node) is None:
            if node.op not in CONVERTERS:
                key = op_key(node)  # a Custom node is known by its op_type, when it has one
                name = f"{node.op}(op_type={key})" if node.op == CUSTOM and key else node.op
                missing[name] = missing.get(name, 0) + 1
        elif node.op in CONVERTERS:
            raise EdgecvError(
                f"`{node.op}` is registered with edgecv.register_op, but edgecv converts it "
                "already; register your operator under another name (its Custom op_type)"
            )
    if missing:
        raise UnsupportedOpsError(missing, supported_ops())


def _shape_hint(node_attrs: dict[str, str]) -> tuple[int, ...] | None:
    hint = node_attrs.get("__shape__")
    if not hint:
        return None
    try:
        shape = tuple(ast.literal_eval(hint))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None  # a hint that is not a tuple ("5", garbage): no hint
    return None if any(d == 0 for d in shape) else shape


def check_params(graph: MXNetGraph, params: dict[str, np.ndarray], input_names: list[str]) -> None:
    """Every non-input variable must have a parameter, of the shape the graph declares."""
    missing, wrong = [], []
    for node in graph.nodes:
        if node.op != "null" or node.name in input_names:
            continue
        if node.name not in params:
            missing.append(node.name)
            continue
        hint = _shape_hint(node.attrs)
        if hint is not None and tuple(params[node.name].shape) != hint:
            wrong.append(f"`{node.name}` is {tuple(params[node.name].shape)}, graph says {hint}")
    if missing:
        shown = ", ".join(missing[:8]) + (
            f", ... ({len(missing)} in all)" if len(missing) > 8 else ""
        )
        raise ParamsError(
            f"{len(missing)} parameter(s) the graph needs are not in the params: {shown}. "
            "Use the .params file exported with this symbol file, or name graph inputs with "
            "--input-shape if these are inputs."
        )
    if wrong:
        raise ParamsError("parameters of the wrong shape: " + "; ".join(wrong[:8]))


def from_mxnet(
    graph: MXNetGraph,
    params: dict[str, np.ndarray],
    input_shapes: dict[str, tuple[int, ...]],
    input_dtypes: dict[str, str] | None = None,
) -> ImportedModel:
    """Convert an MXNet graph to a Relax module.

    Parameters
    ----------
    graph : MXNetGraph
        The parsed symbol (see :func:`~edgecv.frontend.mxnet.mxnet_graph.load_symbol`).
    params : dict
        Parameter arrays by name (see :func:`~edgecv.frontend.mxnet.mxnet_graph.load_params`).
    input_shapes : dict
        Static shape of each graph input, e.g. ``{"data": (1, 3, 224, 224)}``.
    input_dtypes : dict, optional
        Dtype of each input; float32 by default.

    Returns
    -------
    ImportedModel
        The module (``main`` takes the inputs in ``input_names`` order) and its signature.
    """
    check_supported(graph)
    input_shapes = check_input_shapes(input_shapes)
    input_names = list(input_shapes)
    variables = set(graph.variable_names())
    unknown = [n for n in input_names if n not in variables]
    if unknown:
        raise GraphError(
            f"{graph.source}: no graph input named {unknown}; the graph's variables that are "
            f"not parameters: {sorted(variables - set(params))}"
        )
    check_params(graph, params, input_names)
    dtypes = {n: (input_dtypes or {}).get(n, "float32") for n in input_names}
    for name, dtype in dtypes.items():
        if not _is_tensor_dtype(dtype):
            raise ShapeError(
                f"input `{name}` has dtype {dtype!r:.40}; give a NumPy dtype name such as float32"
            )

    bb = relax.BlockBuilder()
    input_vars = [relax.Var(n, relax.TensorType(input_shapes[n], dtypes[n])) for n in input_names]
    by_name = dict(zip(input_names, input_vars, strict=True))
    values: list[list[relax.Expr]] = []
    readers = _readers(graph)
    with _closed_on_error(bb), bb.function("main", input_vars):
        with bb.dataflow():
            for index, node in enumerate(graph.nodes):
                ctx = Context(bb, node, readers.get(index, {}))
                values.append(_convert_node(ctx, graph, values, params, by_name))
            outputs = []
            for node_index, out_index in graph.heads:
                produced = values[node_index]
                if out_index >= len(produced):
                    raise GraphError(f"{graph.source}: output refers to missing output {out_index}")
                outputs.append(_as_var(bb, produced[out_index]))
            result = outputs[0] if len(outputs) == 1 else relax.Tuple(outputs)
            gv = bb.emit_output(result)
        bb.emit_func_output(gv)
    mod = bb.get()
    output_names = [
        f"{graph.nodes[i].name}_output{j}"
        if len(values[i]) > 1
        else f"{graph.nodes[i].name}_output"
        for i, j in graph.heads
    ]
    return ImportedModel(
        mod=mod,
        input_names=input_names,
        input_shapes={n: tuple(input_shapes[n]) for n in input_names},
        input_dtypes=dtypes,
        output_names=output_names,
        output_shapes=[Context.shape(o) for o in outputs],
        output_dtypes=[Context.dtype(o) for o in outputs],
    )


def _is_tensor_dtype(dtype: object) -> bool:
    try:
        return isinstance(dtype, str) and np.dtype(dtype).kind in "biuf"
    except TypeError:
        return False


@contextlib.contextmanager
def _closed_on_error(bb: relax.BlockBuilder) -> Iterator[None]:
    """Close the block and variable scope ``bb.function`` leaves open when its body raises.

    TVM's scopes restore only their Python state on an exception; the C++ builder keeps
    a binding block and, when it is freed (after the CLI printed its one error line),
    logs ``Warning: BlockBuilder destroyed with remaining blocks!``.
    """
    try:
        yield
    except BaseException:
        while True:  # the block the function scope opened, and any inner one
            try:
                bb._end_block()
            except tvm.error.InternalError:  # "no block is being built"
                break
        bb.end_scope()
        raise


def _as_var(bb: relax.BlockBuilder, expr: relax.Expr) -> relax.Expr:
    if isinstance(expr, tvm.ir.expr.Constant):
        # A graph output that is a constant still needs a buffer of its own.
        return bb.emit(relax.op.add(expr, relax.const(0, str(expr.ty.dtype))))
    return expr


def _readers(graph: MXNetGraph) -> dict[int, dict[int, list]]:
    """node index -> output index -> [(reading node, input position)]; a graph output
    reads as (None, position among the heads)."""
    found: dict[int, dict[int, list]] = {}
    for node in graph.nodes:
        for position, (src, out) in enumerate(node.inputs):
            found.setdefault(src, {}).setdefault(out, []).append((node, position))
    for position, (src, out) in enumerate(graph.heads):
        found.setdefault(src, {}).setdefault(out, []).append((None, position))
    return found


def _convert_node(ctx: Context, graph, values, params, inputs_by_name) -> list[relax.Expr]:
    bb, node = ctx.bb, ctx.node
    if node.op == "null":
        if node.name in inputs_by_name:
            return [inputs_by_name[node.name]]
        value = np.ascontiguousarray(params[node.name])
        if value.dtype.kind not in "biuf":
            raise ParamsError(
                f"parameter `{node.name}` is {value.dtype}, not numbers edgecv compiles: "
                "use the .params file exported with this symbol file"
            )
        # relax.const narrows int64 arrays to int32 unless told the dtype
        try:
            return [relax.const(value, str(value.dtype))]
        except Exception as err:  # a dtype TVM has no constants of (bfloat16 from MXNet)
            raise ParamsError(
                f"parameter `{node.name}` of dtype {value.dtype} cannot be a constant: "
                f"{foreign_message(err)}"
            ) from None
    args = []
    for src, out in node.inputs:
        produced = values[src]
        if out >= len(produced):
            raise GraphError(
                f"{graph.source}: node `{node.name}` uses output {out} of "
                f"`{graph.nodes[src].name}`, which has {len(produced)} output(s)"
            )
        args.append(produced[out])
    try:
        registered = registered_for(node)
        if registered is not None:
            return [convert_registered(ctx, registered, args)]
        result = CONVERTERS[node.op](ctx, args, Attrs(node.op, node.name, node.attrs))
        results = result if isinstance(result, list) else [result]
        # Emitting here makes Relax infer shapes now, so a bad node fails with its name.
        return [
            r if isinstance(r, (relax.Var, tvm.ir.expr.Constant)) else bb.emit(r) for r in results
        ]
    except EdgecvError:
        raise
    except Exception as err:  # TVM raises many kinds for ill-typed ops; name the node.
        detail = foreign_message(err)
        shapes = [Context.shape(a) if hasattr(a, "ty") else "?" for a in args]
        raise ConversionError(
            f"node `{node.name}` (op `{node.op}`) with input shapes {shapes} failed to convert: "
            f"{detail}"
        ) from None
