"""Where does edgecv first depart from MXNet? A stage-by-stage probe of one model.

A whole-model comparison (:func:`edgecv.testing.compare_with_mxnet`) says *that* a
package's outputs differ from MXNet's; this probe says *where*. It runs both on the
same weights and input and compares every chosen internal output of the MXNet graph
(``sym.get_internals()``): MXNet's values come from one forward pass of the graph with
those outputs as heads; edgecv's from deploying the graph cut at the same nodes (the
same sub-graph with those outputs as its heads: one package, one run). The plan of a
package does not keep which MXNet node wrote which buffer, and fusion leaves most
intermediate values in no buffer at all, so cutting the graph is what gives edgecv's
value of a node.

What counts as a departure is measured, not assumed: MXNet is run again with every
input element moved by one float32 step (``np.nextafter``, up or down at random) in a
few random directions, and the largest change of each internal output is MXNet's own
*drift* there. A stage departs when edgecv's difference from MXNet exceeds ``factor``
times that drift (at least one float32 rounding step of the stage's largest value), or
when it changes a detection-style result (sorted indices, NMS keep lists) that MXNet's
own drift does not change.
A sort or selection stage that differs is run again alone on MXNet's values of its
inputs: if it then gives MXNet's answer, the difference is a tie that rounding broke,
and the stages after it follow that tie (``StageDifference.tie``, ``follows_tie``).

    python -m edgecv.divergence_probe model-symbol.json model-0000.params --shape 1,3,512,512
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgecv import progress

# Outputs that are indices of a ranking: argsort's output, topk's indices. Their values
# are positions; what matters is which positions a row holds (as a set) and their order.
_INDEX_OPS = {"argsort"}
# Outputs whose rows may reorder or be replaced by a near tie (NMS keep lists, sorted
# values, proposals): their values are compared sorted, their rows matched as sets.
_ROW_OPS = {
    "_contrib_box_nms",
    "_contrib_box_non_maximum_suppression",
    "_contrib_MultiBoxDetection",
    "_contrib_Proposal",
    "_contrib_MultiProposal",
    "sort",
}
# Rows of a row output match when every field is within this fraction of the output's
# largest magnitude (10x the float32 atol of edgecv.testing.TOLERANCES: the boxes' rule).
_ROW_MATCH = 1e-4


@dataclass
class StageDifference:
    """One internal output of the MXNet graph, edgecv's value against MXNet's.

    ``max_abs_diff`` and ``mxnet_drift`` are largest absolute differences (rows output:
    of the values sorted); ``ratio`` is the first over the larger of the second and one
    float32 step of the stage's scale. For index and row outputs ``sets_differ`` says
    whether edgecv's rows (index sets, kept boxes) differ from MXNet's and
    ``drift_sets_differ`` whether MXNet's own one-step runs changed them; None elsewhere.
    """

    name: str
    op: str
    max_abs_diff: float
    mxnet_drift: float
    ratio: float
    departs: bool
    sets_differ: bool | None = None
    drift_sets_differ: bool | None = None
    detail: str = ""
    scale: float = 0.0  # the largest magnitude in MXNet's output of the stage
    tie: bool = False  # edgecv's op alone on MXNet's inputs gives MXNet's answer
    follows_tie: str | None = None  # the tie stage this one reads, directly or not


@dataclass
class DivergenceReport:
    """The stages in the graph's (topological) order and the first one that departs."""

    stages: list[StageDifference]
    factor: float

    @property
    def first(self) -> StageDifference | None:
        return next((s for s in self.stages if s.departs), None)

    def table(self, limit: int | None = None) -> str:
        """One line per stage (the first ``limit``, and the first departing one)."""
        lines = [f"{'stage':60} {'op':28} {'max|diff|':>10} {'drift':>10} {'ratio':>9}  sets"]
        first = self.first
        for i, s in enumerate(self.stages):
            if limit is not None and i >= limit and s is not first:
                continue
            sets = "" if s.sets_differ is None else ("DIFFER" if s.sets_differ else "same")
            if s.drift_sets_differ:
                sets += " (mxnet drift too)"
            if s.tie:
                sets += " TIE (the op alone on MXNet's inputs gives MXNet's answer)"
            if s.follows_tie:
                sets += f" (follows the tie at {s.follows_tie})"
            mark = "  <-- first departure" if s is first else ""
            lines.append(
                f"{s.name[:60]:60} {s.op[:28]:28} {s.max_abs_diff:10.3g} {s.mxnet_drift:10.3g} "
                f"{s.ratio:9.3g}  {sets}{mark}" + (f"  [{s.detail}]" if s.detail else "")
            )
        verdict = (
            f"first departure: {first.name} (ratio {first.ratio:.3g} > {self.factor:g})"
            if first
            else f"no stage departs beyond {self.factor:g}x MXNet's own drift"
        )
        return "\n".join([*lines, verdict])


def probe_divergence(
    symbol: str | Path,
    params: str | Path,
    inputs: dict[str, np.ndarray],
    profile: str = "cpu",
    stages: Sequence[str] | None = None,
    ops: Sequence[str] | None = None,
    edgecv_params: str | Path | None = None,
    options=None,
    on: str | None = None,
    factor: float = 4.0,
    trials: int = 3,
    seed: int = 0,
    workdir: str | Path | None = None,
    pass_bytes: int | None = None,
) -> DivergenceReport:
    """Compare edgecv with MXNet at every chosen internal output of an exported graph.

    Parameters
    ----------
    symbol, params : path
        The exported graph (``*-symbol.json``) and its weights (``*-0000.params``).
    inputs : dict
        Input name -> array, in the graph's input order.
    profile : str
        The device profile edgecv deploys the cut graph for; a GPU profile's package is
        built with this machine as host and run on ``on`` (an OpenCL device query).
    stages : sequence of str, optional
        Node names (or internal output names, ``<node>_output``) to compare; by default
        every output of every operator node, or those of ``ops``.
    ops : sequence of str, optional
        Only nodes of these MXNet operators (``Convolution``, ``_contrib_box_nms``, ...).
    edgecv_params : path, optional
        The weights edgecv deploys when they are not ``params`` (an edited copy: the
        probe then finds where the edit first shows).
    options : edgecv.pipelines.BuildOptions, optional
        The build's options (``BuildOptions(layout="NCHW")`` skips the layout search).
    factor : float
        A stage departs when its difference exceeds ``factor`` times MXNet's drift
        (4, as :func:`edgecv.testing.compare_with_mxnet` holds a whole model).
    trials, seed : int
        How many random one-step moves of the input measure the drift, and their seed.
    workdir : path, optional
        Where the cut graph and its package are written (a temporary folder by default).
    pass_bytes : int, optional
        The stages are compared in passes, each holding at most this many bytes of the
        stages' outputs (a stage larger than that gets a pass of its own); each pass runs
        MXNet and deploys the graph cut at its own stages. Both sides hold a pass's outputs
        several times over (MXNet's, its one-step runs', edgecv's), so the default is an
        eighth of the memory available: one pass for most models, a few for an R-CNN's
        mask head on 1,000 ROIs (6 GB of stage outputs).

    Returns
    -------
    DivergenceReport
        Per stage: name, op, max abs difference, MXNet's drift, their ratio, whether
        index sets / kept rows differ; ``report.first`` is the first departing stage.
    """
    from edgecv._mxnet import import_mxnet
    from edgecv.frontend.mxnet.mxnet_graph import with_defined_roi_align

    mx = import_mxnet()
    graph = _unique_names(json.loads(Path(symbol).read_text()))
    nodes = graph["nodes"]
    op_of = {n["name"]: n["op"] for n in nodes}
    full = mx.sym.load_json(json.dumps(graph))
    internals = full.get_internals()
    names = _stage_outputs(internals.list_outputs(), op_of, stages, ops)
    if not names:
        raise ValueError(f"no internal output of {symbol} matches stages={stages} ops={ops}")
    attrs_of = {n["name"]: n.get("attrs", {}) for n in nodes}
    ops_of = [(op_of.get(_node_of(n), "?"), attrs_of.get(_node_of(n), {})) for n in names]
    shapes = {k: tuple(v.shape) for k, v in inputs.items()}
    sizes = _output_bytes(mx, internals, names, shapes)
    limit = pass_bytes if pass_bytes is not None else _default_pass_bytes()
    with tempfile.TemporaryDirectory(prefix="edgecv-probe-") as tmp:
        work = Path(workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        # MXNet runs its graph with FPN ROIAligns defined (see with_defined_roi_align):
        # a ROIAlign stage is read after its mask, where the rest of the graph reads it
        reference = mx.sym.load_json(with_defined_roi_align(json.dumps(graph)))
        ref_internals = reference.get_internals()
        ref_names = set(ref_internals.list_outputs())
        # MXNet's values of the inputs of sorting and selecting stages: such an op is run
        # again alone on them when edgecv's answer differs (see _rerun_discrete)
        anchors = _discrete_inputs(graph, names, op_of, ref_names)
        setup = _Setup(
            mx, internals, ref_internals, anchors, inputs, Path(params),
            Path(edgecv_params or params), profile, options, on, work, factor, trials, seed,
        )  # fmt: skip
        result: list[StageDifference] = []
        base: dict[int, np.ndarray] = {}  # MXNet's outputs of the sort and selection stages
        anchor_values: dict[str, np.ndarray] = {}
        passes = _passes(sizes, limit)
        for k, (first, stop) in enumerate(passes):
            if len(passes) > 1:
                held = sum(sizes[first:stop]) / 2**30
                progress.say(
                    f"probe pass {k + 1} of {len(passes)}: stages {first + 1}-{stop} of "
                    f"{len(names)} ({held:.2f} GiB of outputs)"
                )
            picked = [_defined(n, op_of, ref_names) for n in names[first:stop]]
            passed = _probe_pass(setup, picked, names[first:stop], ops_of[first:stop])
            result += passed.stages
            base.update({first + i: ref for i, ref in passed.kept.items()})
            anchor_values.update(passed.anchor_values)
    _rerun_discrete(mx, graph, result, base, anchors, anchor_values, profile, on)
    return DivergenceReport(result, factor)


@dataclass
class _Setup:
    """What every pass of one probe shares: the two graphs, the inputs and the build."""

    mx: object
    internals: object  # the graph's internal outputs (edgecv's cut is taken from them)
    ref_internals: object  # those of MXNet's reference graph (ROIAligns defined)
    anchors: dict[str, list[str]]  # sort/selection stage -> its inputs' output names
    inputs: dict[str, np.ndarray]
    params: Path
    edgecv_params: Path
    profile: str
    options: object
    on: str | None
    work: Path
    factor: float
    trials: int
    seed: int


@dataclass
class _Pass:
    stages: list[StageDifference]
    kept: dict[int, np.ndarray]  # MXNet's output of each sort/selection stage, by position
    anchor_values: dict[str, np.ndarray]  # MXNet's values of those stages' inputs


def _probe_pass(setup: _Setup, picked: list[str], names: list[str], ops_of: list) -> _Pass:
    """One pass: MXNet's values of ``names`` (``picked`` in its reference graph) and of
    the inputs of their sort and selection stages, MXNet's drift over the one-step runs,
    edgecv's values from the graph cut at ``names``, and their comparison."""
    mx, anchors = setup.mx, setup.anchors
    extra = sorted({a for n in names if n in anchors for a in anchors[n]})
    group = mx.sym.Group([setup.ref_internals[n] for n in picked + extra])
    forward = _mxnet_forward(mx, group, list(setup.inputs), setup.params)
    xs = list(setup.inputs.values())
    base = forward(xs)
    anchor_values = dict(zip(extra, base[len(names) :], strict=True))
    del base[len(names) :]
    rng = np.random.RandomState(setup.seed)  # every pass moves the input the same ways
    # each trial's outputs are summarized as they come (an R-CNN's 123 stages on
    # 1,000 ROIs hold gigabytes: keeping every trial's took a probe past 23 GB)
    drifts: list[list[_Drift]] = [[] for _ in names]
    for _ in range(setup.trials):
        moved = forward([_one_step(x, rng) for x in xs])
        for i, (name, (op, attrs)) in enumerate(zip(names, ops_of, strict=True)):
            drifts[i].append(_drift(op, attrs, name, moved[i], base[i]))
        del moved
    cut = setup.work / "cut-symbol.json"
    cut.write_text(mx.sym.Group([setup.internals[n] for n in names]).tojson())
    ours = _edgecv_forward(
        cut, setup.edgecv_params, setup.inputs, setup.profile, setup.options, setup.on, setup.work
    )
    if len(ours) != len(names):
        raise AssertionError(f"the cut graph gave {len(ours)} outputs for {len(names)} stages")
    stages = [
        _compare_stage(name, op, attrs, ours[i], base[i], drifts[i], setup.factor)
        for i, (name, (op, attrs)) in enumerate(zip(names, ops_of, strict=True))
    ]
    kept = {i: base[i] for i, name in enumerate(names) if name in anchors}
    return _Pass(stages, kept, anchor_values)


def _output_bytes(mx, internals, names: list[str], shapes: dict) -> list[int]:
    """Bytes of each stage's output (MXNet's shape and type inference); 0 where MXNet
    cannot infer them (the stage then adds nothing to its pass's size)."""
    outputs = mx.sym.Group([internals[n] for n in names])
    try:
        _, out_shapes, _ = outputs.infer_shape(**shapes)
        _, out_types, _ = outputs.infer_type(**{k: np.float32 for k in shapes})
    except Exception:  # noqa: BLE001 (a graph MXNet cannot infer: one pass)
        return [0] * len(names)
    if out_shapes is None or out_types is None:
        return [0] * len(names)
    return [
        int(np.prod(s, dtype=np.int64)) * np.dtype(t).itemsize
        for s, t in zip(out_shapes, out_types, strict=True)
    ]


def _default_pass_bytes() -> int:
    import psutil  # the compiler side's (pyproject's `compiler` extra), as the meters use it

    return max(psutil.virtual_memory().available // 8, 256 << 20)


def _passes(sizes: list[int], limit: int) -> list[tuple[int, int]]:
    """Consecutive ``[first, stop)`` ranges of stages, each holding at most ``limit``
    bytes (a larger stage alone)."""
    passes, first, held = [], 0, 0
    for i, size in enumerate(sizes):
        if i > first and held + size > limit:
            passes.append((first, i))
            first, held = i, 0
        held += size
    if first < len(sizes):
        passes.append((first, len(sizes)))
    return passes


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
    from edgecv.deploy import deploy
    from edgecv.model import load

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


@dataclass
class _Drift:
    """How far one of MXNet's one-step runs moved a stage: the largest change (of the
    sorted values for row outputs), and whether it changed index sets or kept rows
    (``sets``) or index positions (``order``)."""

    value: float
    sets: bool = False
    order: bool = False


def _scale(ref: np.ndarray) -> float:
    """The largest finite magnitude of MXNet's output (NaNs, MXNet's own where it reads
    memory it never wrote, are compared by position in _max_abs)."""
    largest = 0.0
    for (b,) in _blocks(ref):
        largest = max(largest, float(np.abs(b[np.isfinite(b)]).max(initial=0.0)))
    return largest


def _axis(attrs: dict) -> int | None:
    return int(attrs.get("axis", -1)) if str(attrs.get("axis", "-1")) != "None" else None


def _drift(op: str, attrs: dict, name: str, moved: np.ndarray, ref: np.ndarray) -> _Drift:
    moved, ref = np.asarray(moved), np.asarray(ref)
    if moved.shape != ref.shape:
        return _Drift(np.inf, True, True)
    kind = _kind(op, attrs, name)
    if kind == "rows":
        drift = _Drift(_max_abs(np.sort(moved, axis=None), np.sort(ref, axis=None)))
    else:
        drift = _Drift(_max_abs(moved, ref))
    if kind == "index":
        drift.sets = _index_sets_differ(moved, ref, _axis(attrs))
        drift.order = bool((moved != ref).any())
    elif kind == "rows":
        tol = _ROW_MATCH * max(_scale(ref), 1.0)
        drift.sets = sum(_unmatched_rows(moved, ref, tol)) > 0
    return drift


def _compare_stage(name, op, attrs, ours, ref, drifts: list[_Drift], factor) -> StageDifference:
    ours, ref = np.asarray(ours), np.asarray(ref)
    if ours.shape != ref.shape:
        return StageDifference(
            name, op, np.inf, 0.0, np.inf, True, detail=f"shape {ours.shape} != MXNet's {ref.shape}"
        )
    kind = _kind(op, attrs, name)
    mine = _drift(op, attrs, name, ours, ref)  # edgecv's difference, measured as a drift is
    diff = mine.value
    drift = max((d.value for d in drifts), default=0.0)
    scale = _scale(ref)
    step = max(np.finfo(np.float32).eps * scale, float(np.finfo(np.float32).tiny))
    ratio = diff / (drift if drift > step else step)
    departs = bool(ratio > factor)
    sets = drift_sets = None
    detail = ""
    if kind == "index":
        sets, drift_sets = mine.sets, any(d.sets for d in drifts)
        drift_order = any(d.order for d in drifts)
        departs = (sets and not drift_sets) or (mine.order and not drift_order)
        detail = f"{int((ours != ref).sum())} positions differ" if mine.order else ""
    elif kind == "rows":
        only_mx, only_ours = _unmatched_rows(ours, ref, _ROW_MATCH * max(scale, 1.0))
        sets, drift_sets = bool(only_mx or only_ours), any(d.sets for d in drifts)
        departs = departs or (sets and not drift_sets)
        if sets:
            detail = f"{only_mx} rows only in MXNet's, {only_ours} only in edgecv's"
    return StageDifference(
        name, op, diff, drift, float(ratio), bool(departs), sets, drift_sets, detail, scale
    )


def _kind(op: str, attrs: dict, name: str) -> str:
    """``index`` (positions of a ranking), ``rows`` (rows that may reorder) or ``values``."""
    if op in _INDEX_OPS:
        return "index"
    if op == "topk":
        ret = attrs.get("ret_typ", "indices")
        index_output = {"indices": "0", "both": "1"}.get(ret)
        position = name.rpartition("_output")[2] or "0"
        if index_output == position:
            return "index"
        return "rows" if ret in ("value", "both") else "values"
    return "rows" if op in _ROW_OPS else "values"


def _max_abs(a: np.ndarray, b: np.ndarray) -> float:
    """The largest absolute difference; NaN on both sides at a position is no difference,
    NaN on one side an infinite one."""
    largest = 0.0
    for x, y in _blocks(a, b):
        d = np.where(np.isnan(x) & np.isnan(y), 0.0, np.abs(x - y))
        largest = max(largest, float(np.nan_to_num(d, nan=np.inf).max(initial=0.0)))
    return largest


# elements compared at a time: a mask head's stage holds 200 million, and whole float64
# copies of it (and of its differences) took gigabytes per comparison
_BLOCK = 1 << 22


def _blocks(*arrays: np.ndarray):
    """The arrays' elements, flat, ``_BLOCK`` at a time, as float64."""
    flat = [np.asarray(a).reshape(-1) for a in arrays]
    for start in range(0, flat[0].size, _BLOCK):
        yield [f[start : start + _BLOCK].astype(np.float64) for f in flat]


def _index_sets_differ(ours: np.ndarray, ref: np.ndarray, axis: int | None) -> bool:
    """Whether any row (along ``axis``) holds another set of indices."""
    return not np.array_equal(np.sort(ours, axis=axis), np.sort(ref, axis=axis))


def _unmatched_rows(ours: np.ndarray, ref: np.ndarray, tol: float) -> tuple[int, int]:
    """Valid rows (not all -1) of MXNet's with no row of edgecv's within ``tol`` in every
    field, and the other way round: boxes one side kept and the other did not."""
    width = ref.shape[-1] if ref.ndim >= 2 else 1
    a = np.asarray(ours, np.float64).reshape(-1, width)
    b = np.asarray(ref, np.float64).reshape(-1, width)
    a, b = a[~(a == -1).all(1)], b[~(b == -1).all(1)]

    def unmatched(x, y):
        if not len(y):
            return len(x)
        if np.isfinite(x).all() and np.isfinite(y).all():
            # a row matches when its nearest row in the max-norm is within tol: a k-d tree
            # answers that in n log n (80,000 kept rows of an R-CNN's final NMS, compared
            # pair by pair, took a probe's pass many minutes)
            from scipy.spatial import cKDTree

            bound = float(np.nextafter(tol, np.inf))
            distance, _ = cKDTree(y).query(x, k=1, p=np.inf, distance_upper_bound=bound)
            return int((~(distance <= tol)).sum())
        count = 0
        for start in range(0, len(x), 256):  # bounded memory: 256 x len(y) x width
            chunk = x[start : start + 256]
            close = (np.abs(chunk[:, None, :] - y[None, :, :]) <= tol).all(-1).any(1)
            count += int((~close).sum())
        return count

    return unmatched(b, a), unmatched(a, b)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m edgecv.divergence_probe SYMBOL PARAMS --shape N,C,H,W``: print the table."""
    parser = argparse.ArgumentParser(
        prog="python -m edgecv.divergence_probe", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("symbol")
    parser.add_argument("params")
    parser.add_argument("--shape", help="input shape N,C,H,W (input `data`)")
    parser.add_argument("--input", help="a .npy input (input `data`); a photo by default")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--on", default=None, help="OpenCL device of a GPU profile")
    parser.add_argument("--ops", default=None, help="comma-separated MXNet ops to compare")
    parser.add_argument("--stages", default=None, help="comma-separated node names")
    parser.add_argument("--layout", default="NCHW", help="conv layouts (default NCHW: fast)")
    parser.add_argument("--factor", type=float, default=4.0)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--all", action="store_true", help="print every stage")
    args = parser.parse_args(argv)
    from edgecv.frontend.mxnet.random_weights import example_input
    from edgecv.pipelines import BuildOptions

    if args.input:
        x = np.load(args.input)
    elif args.shape:
        x = example_input(tuple(int(d) for d in args.shape.split(",")), 0)
    else:
        parser.error("give --shape or --input")
    report = probe_divergence(
        args.symbol,
        args.params,
        {"data": x},
        profile=args.profile,
        on=args.on,
        stages=args.stages.split(",") if args.stages else None,
        ops=args.ops.split(",") if args.ops else None,
        options=BuildOptions(layout=args.layout),
        factor=args.factor,
        trials=args.trials,
    )
    print(report.table(limit=None if args.all else 40))
    return 1 if report.first else 0


if __name__ == "__main__":
    sys.exit(main())
