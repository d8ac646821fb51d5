"""Reading MXNet's exported files: ``*-symbol.json`` and ``*-NNNN.params``.

Everything here validates before anything is converted: a truncated JSON file, a
node that points past the end of the graph, a parameter the graph needs but the
params file lacks: each is one :class:`~edgecv.board.errors.EdgecvError` naming the file
and the problem.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..._mxnet import import_mxnet
from ...board.errors import GraphError, ParamsError, foreign_message


@dataclass(frozen=True)
class MXNetNode:
    """One node of an MXNet graph; ``op == "null"`` marks inputs and parameters."""

    op: str
    name: str
    attrs: dict[str, str]
    inputs: tuple[tuple[int, int], ...]  # (node index, output index)


@dataclass
class MXNetGraph:
    """A parsed, validated MXNet symbol graph (nodes in topological order)."""

    nodes: list[MXNetNode]
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
        When the text is not JSON, lacks ``nodes``/``heads``, holds a field of the wrong
        type (a node's ``op``/``name`` not a string, an input entry not
        ``[node, output, version]`` integers, attributes not a string mapping), or a node
        refers to a node that does not come before it (so a graph has no cycle).
    """
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise GraphError(
            f"{source}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}); "
            "the file may be truncated. Re-export it with `net.export(prefix)`."
        ) from None
    except RecursionError:
        raise GraphError(f"{source}: JSON nested too deep to be an MXNet symbol graph") from None
    if not isinstance(raw, dict) or "nodes" not in raw or "heads" not in raw:
        found = sorted(raw)[:10] if isinstance(raw, dict) else type(raw).__name__
        raise GraphError(
            f"{source}: not an MXNet symbol graph: expected a JSON object with `nodes` and "
            f"`heads`, found {found!r:.200}"
        )
    for key in ("nodes", "heads"):
        if not isinstance(raw[key], list):
            raise GraphError(
                f"{source}: `{key}` should be a list, found {type(raw[key]).__name__}; "
                "re-export the graph with `net.export(prefix)`"
            )
    nodes: list[MXNetNode] = []
    for index, item in enumerate(raw["nodes"]):
        nodes.append(_parse_node(item, index, len(raw["nodes"]), source))
    heads = []
    for entry in raw["heads"]:
        if not _is_entry(entry) or not 0 <= entry[0] < len(nodes):
            raise GraphError(f"{source}: output entry {entry!r:.80} refers to no node")
        heads.append((entry[0], entry[1]))
    if not heads:
        raise GraphError(f"{source}: the graph has no outputs (`heads` is empty)")
    return MXNetGraph(nodes=nodes, heads=heads, source=source)


def _is_entry(entry: object) -> bool:
    """A node entry, ``[node index, output index]`` with MXNet's optional version."""
    return (
        isinstance(entry, list)
        and 2 <= len(entry) <= 3
        and all(type(v) is int for v in entry)
        and entry[1] >= 0
    )


def _parse_node(item: object, index: int, count: int, source: str) -> MXNetNode:
    if not isinstance(item, dict) or "op" not in item or "name" not in item:
        raise GraphError(f"{source}: node #{index} lacks `op` or `name`: {item!r:.200}")
    op, name = item["op"], item["name"]
    for what, value in (("op", op), ("name", name)):
        if not isinstance(value, str) or not value.isprintable() or (what == "op" and not op):
            raise GraphError(
                f"{source}: node #{index} has {what} {value!r:.80}, expected a printable "
                "string; the file is damaged: re-export it with `net.export(prefix)`"
            )
    entries = item.get("inputs", [])
    if not isinstance(entries, list):
        raise GraphError(
            f"{source}: node `{name}` has inputs {entries!r:.80}, expected a list of "
            "[node, output, version] entries"
        )
    inputs = []
    for entry in entries:
        if not _is_entry(entry):
            raise GraphError(
                f"{source}: node `{name}` has a malformed input {entry!r:.80}: expected "
                "[node index, output index, version], whole numbers >= 0"
            )
        src, out = entry[0], entry[1]
        if not 0 <= src < index:
            raise GraphError(
                f"{source}: node `{name}` (#{index}) takes input from node #{src}, "
                f"which does not come before it (graph has {count} nodes)"
            )
        inputs.append((src, out))
    attrs = item.get("attrs", item.get("attr", item.get("param", {}))) or {}
    if not isinstance(attrs, dict):
        raise GraphError(
            f"{source}: node `{name}` has attributes {attrs!r:.80}, expected a JSON object "
            "of strings"
        )
    return MXNetNode(
        op, name, {k: _attr_value(name, k, v, source) for k, v in attrs.items()}, tuple(inputs)
    )


def _attr_value(node: str, key: str, value: object, source: str) -> str:
    """An attribute as MXNet stores it, a string: a number or boolean written bare
    (a hand-edited graph) is its text; a list, object or null is refused."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, int, float)):
        return str(value)
    raise GraphError(
        f"{source}: node `{node}` attribute {key!r:.40} is {type(value).__name__}; MXNet "
        f'stores attributes as strings, such as "(3, 3)"'
    )


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
    The file's layout is checked first (:func:`check_params_file`), so that a damaged
    file is refused before MXNet allocates what it declares.
    """
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"params file {path} does not exist")
    check_params_file(path)
    mx = import_mxnet()
    try:
        loaded = mx.nd.load(str(path))
        if isinstance(loaded, list) and not loaded:
            loaded = {}  # a graph without weights: MXNet saves {} as an empty list
        if not isinstance(loaded, dict):
            raise ParamsError(f"params file {path} holds an unnamed list of arrays; expected names")
        # asnumpy() too: MXNet refuses there an array of 2**31 elements or more
        arrays = {name: value.asnumpy() for name, value in loaded.items()}
    except ParamsError:
        raise
    except Exception as err:  # MXNetError (with MXNet's traceback text) on corrupt files
        raise ParamsError(
            f"cannot read params file {path}: {foreign_message(err)} (truncated, or not an "
            "MXNet .params file written by `net.export()` or `net.save_parameters()`)"
        ) from None
    params = {}
    for name, value in arrays.items():
        if name.startswith(("arg:", "aux:")):
            name = name[4:]
        if not name.isprintable():
            raise ParamsError(
                f"params file {path} names an array {name!r:.60}, not a parameter name: the "
                "file is damaged; export it again"
            )
        params[name] = value
    return params


# MXNet's NDArray list file (src/ndarray/ndarray.cc: NDArray::Save, mx.nd.save): a list
# magic and a reserved word, the arrays, then their names
_LIST_MAGIC = 0x112
_ARRAY_MAGICS = (0xF993FAC9, 0xF993FACA)  # NDARRAY_V2_MAGIC, NDARRAY_V3_MAGIC (numpy shapes)
_V1_MAGIC = 0xF993FAC8  # NDARRAY_V1_MAGIC: no storage type (MXNet < 1.0)
# bytes per element of MXNet's type flags (mshadow's kFloat32 = 0 ... kBfloat16 = 12)
_ITEM_BYTES = {0: 4, 1: 8, 2: 2, 3: 1, 4: 4, 5: 1, 6: 8, 7: 1, 8: 2, 9: 2, 10: 4, 11: 8, 12: 2}
_MAX_NDIM = 32


def check_params_file(path: str | Path) -> None:
    """Refuse a ``.params`` file whose arrays do not fit in it.

    Walks the header of every array (dense, as ``net.export()`` and
    ``net.save_parameters()`` write them) and refuses, naming the array, a file that
    ends before the bytes an array declares, or declares a negative size or an absurd
    rank: a truncated file, or a bit flipped in a shape, which MXNet itself would meet
    by first allocating what the damaged shape claims (gigabytes, for one flipped bit).
    A layout this walk does not know (an older MXNet's, sparse arrays) is left to MXNet.
    """
    path = Path(path)
    size = path.stat().st_size

    def refuse(detail: str) -> ParamsError:
        return ParamsError(
            f"cannot read params file {path}: Invalid NDArray file format (truncated, or not "
            f"an MXNet .params file written by `net.export()` or `net.save_parameters()`): "
            f"{detail}"
        )

    with open(path, "rb") as f:

        def read(fmt: str, what: str) -> tuple:
            count = struct.calcsize(fmt)
            data = f.read(count)
            if len(data) < count:
                raise refuse(f"the file ends at byte {size} inside {what}")
            return struct.unpack(fmt, data)

        magic, _reserved, count = read("<QQQ", "the header")
        if magic != _LIST_MAGIC:
            raise refuse(f"it does not start with MXNet's array list magic ({magic:#x})")
        if count > (size - 24) // 12:  # an array takes 12 bytes at the very least
            raise refuse(f"it declares {count:,} arrays in {size:,} bytes")
        for index in range(count):
            what = f"array #{index}"
            (array_magic,) = read("<I", what)
            if array_magic not in (_V1_MAGIC, *_ARRAY_MAGICS):
                if index == 0 and array_magic <= _MAX_NDIM:
                    return  # MXNet's first layout (its first word is a rank): MXNet reads it
                raise refuse(f"{what} of the {count:,} declared has no array header")
            (stype,) = read("<i", what) if array_magic != _V1_MAGIC else (0,)
            if stype in (1, 2):
                return  # sparse storage (row_sparse, csr): MXNet reads it
            if stype != 0:
                raise refuse(f"{what} declares storage type {stype}")
            (ndim,) = read("<i", what)
            if ndim < -1 or ndim > _MAX_NDIM:
                raise refuse(f"{what} declares {ndim} dimensions")
            if ndim == -1 or (ndim == 0 and array_magic != _ARRAY_MAGICS[1]):
                continue  # an array without data ("none")
            shape = read(f"<{ndim}q", what)
            if any(d < 0 for d in shape):
                raise refuse(f"{what} declares shape {shape}")
            _dev_type, _dev_id, type_flag = read("<iii", what)
            if type_flag not in _ITEM_BYTES:
                return  # MXNet names the unknown type
            nbytes = math.prod(shape) * _ITEM_BYTES[type_flag]
            left = size - f.tell()
            if nbytes > left:
                raise refuse(
                    f"{what} of shape {shape} needs {nbytes:,} bytes and {left:,} are left"
                )
            f.seek(nbytes, 1)
        (names,) = read("<Q", "the names")
        if names not in (0, count):
            raise refuse(f"it holds {count} arrays and {names:,} names")
        for index in range(names):
            (length,) = read("<Q", f"name #{index}")
            if length > size - f.tell():
                raise refuse(f"name #{index} needs {length:,} bytes, the file ends first")
            f.seek(length, 1)


def with_defined_roi_align(symbol_json: str) -> str:
    """The MXNet graph ``symbol_json`` with every ``_contrib_ROIAlign`` made to return
    a zero row for a ROI whose batch index is negative, as edgecv's ROIAlign does.

    GluonCV's FPN detectors (``faster_rcnn_fpn_*``, ``mask_rcnn_fpn_*``) pool each ROI
    from one pyramid level by giving it batch index -1 at every other level; MXNet's
    CPU kernel then reads memory before the feature map (found comparing edgecv with
    MXNet: the same ROI row gave 0, 512.1 or 4.6e-41 from run to run), so its output
    is no reference. The rewrite pools from clamped ROIs and multiplies by the mask;
    ROIs with a valid batch index give exactly MXNet's values.
    """
    graph = json.loads(symbol_json)
    if not any(n["op"] == "_contrib_ROIAlign" for n in graph["nodes"]):
        return symbol_json
    nodes: list[dict] = []
    moved: dict[int, int] = {}  # old node index -> new index of what replaces it

    def add(op: str, name: str, inputs: list, attrs: dict | None = None) -> list:
        nodes.append({"op": op, "name": name, "attrs": attrs or {}, "inputs": inputs})
        return [len(nodes) - 1, 0, 0]

    for index, node in enumerate(graph["nodes"]):
        node = dict(node, inputs=[[moved[i], k, v] for i, k, v in node["inputs"]])
        if node["op"] != "_contrib_ROIAlign":
            nodes.append(node)
            moved[index] = len(nodes) - 1
            continue
        data, rois = node["inputs"]
        name = node["name"]
        batch = add("slice_axis", f"{name}_batch", [rois], {"axis": "1", "begin": "0", "end": "1"})
        valid = add("_greater_equal_scalar", f"{name}_valid", [batch], {"scalar": "0"})
        rows = add("broadcast_like", f"{name}_valid_rows", [valid, rois])
        zeros = add("zeros_like", f"{name}_zeros", [rois])
        clamped = add("where", f"{name}_clamped", [rows, rois, zeros])
        pooled = add(node["op"], name, [data, clamped], node.get("attrs"))
        mask = add("Reshape", f"{name}_mask", [valid], {"shape": "(-1, 1, 1, 1)"})
        add("broadcast_mul", f"{name}_defined", [pooled, mask])
        moved[index] = len(nodes) - 1
    graph["nodes"] = nodes
    graph["arg_nodes"] = [i for i, n in enumerate(nodes) if n["op"] == "null"]
    graph["heads"] = [[moved[i], k, v] for i, k, v in graph["heads"]]
    graph.pop("node_row_ptr", None)
    return json.dumps(graph)
