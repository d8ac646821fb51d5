"""The graph side of the probe: operator nodes named once, the stages to compare and
the inputs of their sort and selection ops, and the two forward passes (MXNet's of a
group of internal outputs, edgecv's of the graph cut at them)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from .stages import _kind


def _discrete_inputs(graph: dict, names: list[str], op_of: dict, ref_names: set) -> dict:
    """Stage name -> the internal output names of its op's inputs, for the index and row
    stages whose inputs are all operator outputs (not weights or the model's input)."""
    nodes = graph["nodes"]
    index_of = {n["name"]: i for i, n in enumerate(nodes)}
    outputs = {}
    for name in names:
        node = nodes[index_of[_node_of(name)]]
        if _kind(node["op"], node.get("attrs", {}), name) == "values":
            continue
        sources = []
        for src, k, *_ in node["inputs"]:
            source = nodes[src]
            single = f"{source['name']}_output"
            candidate = single if single in ref_names else f"{single}{k}"
            if source["op"] == "null" or candidate not in ref_names:
                break
            sources.append(candidate)
        else:
            outputs[name] = sources
    return outputs


def _unique_names(graph: dict) -> dict:
    """``graph`` with every operator node named once: a block called more than once (an
    FPN's RPN head on each pyramid level) gives several nodes one name, and MXNet picks
    an internal output by name; the second is renamed ``<name>_2``, and so on. Variables
    (inputs, weights) keep their names: the weights are found by them."""
    taken = {node["name"] for node in graph["nodes"]}
    seen: set[str] = set()
    for node in graph["nodes"]:
        name = node["name"]
        if node["op"] != "null" and name in seen:
            count = 2
            while f"{name}_{count}" in taken:
                count += 1
            node["name"] = f"{name}_{count}"
            taken.add(node["name"])
        seen.add(node["name"])
    return graph


def _node_of(output: str) -> str:
    """``conv0_output`` / ``split0_output1`` -> the node's name."""
    head, _, tail = output.rpartition("_output")
    return head if head and (tail == "" or tail.isdigit()) else output


def _stage_outputs(outputs: list[str], op_of: dict, stages, ops) -> list[str]:
    """The internal outputs to compare, in the graph's order: operator nodes only."""
    wanted = None if stages is None else set(stages)
    chosen = []
    for name in outputs:
        node = _node_of(name)
        op = op_of.get(node, "null")
        if op == "null":
            continue
        if wanted is not None and node not in wanted and name not in wanted:
            continue
        if ops is not None and op not in ops:
            continue
        chosen.append(name)
    return chosen


def _defined(name: str, op_of: dict, ref_names: set) -> str:
    """The MXNet reference's output for stage ``name`` (a ROIAlign's masked output)."""
    if op_of.get(_node_of(name)) == "_contrib_ROIAlign":
        masked = f"{_node_of(name)}_defined_output"
        if masked in ref_names:
            return masked
    return name


def _one_step(x: np.ndarray, rng: np.random.RandomState) -> np.ndarray:
    """``x`` with every element moved by one float32 step, up or down at random."""
    if not np.issubdtype(x.dtype, np.floating):
        return x
    towards = np.where(rng.rand(*x.shape) < 0.5, -np.inf, np.inf).astype(x.dtype)
    return np.nextafter(x, towards).astype(x.dtype)


def _mxnet_forward(mx, group, input_names: list[str], params: str | Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = mx.gluon.SymbolBlock(group, [mx.sym.var(n) for n in input_names])
        net.collect_params().load(str(params), ctx=mx.cpu(), ignore_extra=True)

    def forward(arrays: list[np.ndarray]) -> list[np.ndarray]:
        out = net(*[mx.nd.array(a, dtype=a.dtype) for a in arrays])
        return [o.asnumpy() for o in (out if isinstance(out, (list, tuple)) else [out])]

    return forward


def _edgecv_forward(cut: Path, params, inputs: dict, profile: str, options, on, work: Path):
    from edgecv.board.model import load
    from edgecv.deploy import deploy

    shapes = {k: tuple(v.shape) for k, v in inputs.items()}
    host = None if profile == "cpu" else "native"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        package = deploy(
            cut,
            work / "cut-package",
            profile,
            params=params,
            input_shape=shapes,
            host=host,
            options=options,
            force=True,
        )
    return load(package, on=on).run(*inputs.values())
