"""Reading MXNet's exported files: ``*-symbol.json`` and ``*-NNNN.params``.

Everything here validates before anything is converted: a truncated JSON file, a
node that points past the end of the graph, a parameter the graph needs but the
params file lacks: each is one :class:`~edgecv.errors.EdgecvError` naming the file
and the problem.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._mxnet import import_mxnet
from ..errors import GraphError, ParamsError, foreign_message


@dataclass(frozen=True)
class Node:
    """One node of an MXNet graph; ``op == "null"`` marks inputs and parameters."""

    op: str
    name: str
    attrs: dict[str, str]
    inputs: tuple[tuple[int, int], ...]  # (node index, output index)


@dataclass
class MXNetGraph:
    """A parsed, validated MXNet symbol graph (nodes in topological order)."""

    nodes: list[Node]
    heads: list[tuple[int, int]]
    source: str = "<graph>"
    arg_names: list[str] = field(default_factory=list)

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes:
            if node.op != "null":
                counts[node.op] = counts.get(node.op, 0) + 1
        return counts

    def variable_names(self) -> list[str]:
        return [n.name for n in self.nodes if n.op == "null"]


def parse_symbol(text: str, source: str = "<graph>") -> MXNetGraph:
    """Parse the text of an MXNet ``*-symbol.json`` file.

    Raises
    ------
    GraphError
        When the text is not JSON, lacks ``nodes``/``heads``, or a node refers to a
        node that does not come before it.
    """
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise GraphError(
            f"{source}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}); "
            "the file may be truncated. Re-export it with `net.export(prefix)`."
        ) from None
    if not isinstance(raw, dict) or "nodes" not in raw or "heads" not in raw:
        found = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
        raise GraphError(
            f"{source}: not an MXNet symbol graph: expected a JSON object with `nodes` and "
            f"`heads`, found {found}"
        )
    nodes: list[Node] = []
    for index, item in enumerate(raw["nodes"]):
        if not isinstance(item, dict) or "op" not in item or "name" not in item:
            raise GraphError(f"{source}: node #{index} lacks `op` or `name`: {item!r:.200}")
        inputs = []
        for entry in item.get("inputs", []):
            if not isinstance(entry, list) or len(entry) < 2:
                raise GraphError(f"{source}: node `{item['name']}` has a malformed input {entry!r}")
            src, out = int(entry[0]), int(entry[1])
            if not 0 <= src < index:
                raise GraphError(
                    f"{source}: node `{item['name']}` (#{index}) takes input from node #{src}, "
                    f"which does not come before it (graph has {len(raw['nodes'])} nodes)"
                )
            inputs.append((src, out))
        attrs = item.get("attrs", item.get("attr", item.get("param", {}))) or {}
        nodes.append(Node(item["op"], item["name"], dict(attrs), tuple(inputs)))
    heads = []
    for entry in raw["heads"]:
        if not isinstance(entry, list) or not 0 <= int(entry[0]) < len(nodes):
            raise GraphError(f"{source}: output entry {entry!r} refers to no node")
        heads.append((int(entry[0]), int(entry[1])))
    if not heads:
        raise GraphError(f"{source}: the graph has no outputs (`heads` is empty)")
    return MXNetGraph(nodes=nodes, heads=heads, source=source)


def load_symbol(path: str | Path) -> MXNetGraph:
    """Read and parse an MXNet ``*-symbol.json`` file (see :func:`parse_symbol`)."""
    path = Path(path)
    if not path.is_file():
        raise GraphError(f"symbol file {path} does not exist")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise GraphError(f"cannot read symbol file {path}: {err}") from None
    return parse_symbol(text, source=str(path))


def load_params(path: str | Path) -> dict[str, np.ndarray]:
    """Read an MXNet ``.params`` file into ``{name: array}``.

    The ``arg:``/``aux:`` prefixes that ``Module.save_checkpoint`` writes are removed.
    """
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"params file {path} does not exist")
    mx = import_mxnet()
    try:
        loaded = mx.nd.load(str(path))
    except Exception as err:  # MXNetError (with MXNet's traceback text) on corrupt files
        raise ParamsError(
            f"cannot read params file {path}: {foreign_message(err)} (truncated, or not an "
            "MXNet .params file written by `net.export()` or `net.save_parameters()`)"
        ) from None
    if not isinstance(loaded, dict):
        raise ParamsError(f"params file {path} holds an unnamed list of arrays; expected names")
    params = {}
    for name, value in loaded.items():
        if name.startswith(("arg:", "aux:")):
            name = name[4:]
        params[name] = value.asnumpy()
    return params
