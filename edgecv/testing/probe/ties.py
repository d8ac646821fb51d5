"""Ties the probe tells apart from departures: a sort or selection stage run again alone
on MXNet's values of its inputs, and the stages that read a tie."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from .graph import _edgecv_forward, _node_of
from .stages import _ROW_MATCH, _kind, _unmatched_rows


def _rerun_discrete(mx, graph, result, base, anchors, anchor_values, profile, on) -> None:
    """A sort or selection stage whose answer differs from MXNet's is run again alone in
    edgecv on MXNet's values of its inputs. If it then gives MXNet's answer (the same
    kept rows; the same indices, or indices of equal keys where MXNet's ``std::sort``
    leaves their order unspecified), the operator is MXNet's and the difference came
    from its inputs, judged at their own stages (within the factor of MXNet's drift, or
    the first departure is there): a tie that rounding breaks. The stage no longer
    departs, and the stages that read it, directly or not, follow that tie: their values
    are compared but no longer depart (which boxes survive a tie is rounding's choice)."""
    nodes = graph["nodes"]
    index_of = {n["name"]: i for i, n in enumerate(nodes)}
    ties: dict[int, str] = {}  # node index -> the tie stage it reads, directly or not
    for i, stage in enumerate(result):
        node = index_of[_node_of(stage.name)]
        if node in ties and stage.departs:
            stage.departs, stage.follows_tie = False, ties[node]
            continue
        if not stage.departs or stage.name not in anchors:
            continue
        if _same_alone(mx, nodes[node], stage, base[i], anchors, anchor_values, profile, on):
            stage.departs, stage.tie = False, True
            ties[node] = stage.name
            for later in range(node + 1, len(nodes)):
                if any(src in ties for src, *_ in nodes[later]["inputs"]):
                    ties.setdefault(later, stage.name)


def _same_alone(mx, node, stage, ref, anchors, values, profile, on) -> bool:
    """Whether edgecv's ``node`` alone (a one-operator graph) on MXNet's values of its
    inputs gives MXNet's answer: the same indices, the same kept rows."""
    from edgecv.pipelines import BuildOptions

    sources = anchors[stage.name]
    names = [f"anchor{k}" for k in range(len(sources))]
    position = stage.name.rpartition("_output")[2] or "0"
    graph = {
        "nodes": [{"op": "null", "name": n, "inputs": []} for n in names]
        + [{**node, "inputs": [[k, 0, 0] for k in range(len(names))]}],
        "arg_nodes": list(range(len(names))),
        "heads": [[len(names), int(position), 0]],
        "attrs": {"mxnet_version": ["int", 10901]},
    }
    inputs = {n: values[src] for n, src in zip(names, sources, strict=True)}
    with tempfile.TemporaryDirectory(prefix="edgecv-probe-op-") as tmp:
        work = Path(tmp)
        symbol, params = work / "op-symbol.json", work / "op-0000.params"
        symbol.write_text(mx.sym.load_json(json.dumps(graph)).tojson())
        mx.nd.save(str(params), {})
        options = BuildOptions(layout="NCHW")
        ours = _edgecv_forward(symbol, params, inputs, profile, options, on, work)[0]
    attrs = node.get("attrs", {})
    if _kind(stage.op, attrs, stage.name) == "index":
        if np.array_equal(ours, ref):
            return True
        # MXNet sorts with std::sort: equal keys come out in an unspecified order, so
        # edgecv's order is MXNet's when it picks, position by position, equal keys
        keys = np.asarray(inputs[names[0]])
        axis = int(attrs.get("axis", -1))
        if ours.shape != ref.shape:
            return False
        picked = ours.astype(np.int64)
        unique = bool((np.diff(np.sort(picked, axis=axis), axis=axis) != 0).all())
        ordered = [np.take_along_axis(keys, o, axis) for o in (picked, ref.astype(np.int64))]
        return unique and bool(np.array_equal(*ordered))
    tol = _ROW_MATCH * max(stage.scale, 1.0)
    return ours.shape == ref.shape and sum(_unmatched_rows(ours, ref, tol)) == 0
