"""``probe_divergence``: the stages of a graph compared in passes bounded by memory, each
pass one MXNet forward pass (and its one-step runs) and one deploy of the graph cut at
the pass's stages."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgecv.board import progress

from .graph import (
    _defined,
    _discrete_inputs,
    _edgecv_forward,
    _mxnet_forward,
    _node_of,
    _one_step,
    _stage_outputs,
    _unique_names,
)
from .report import DivergenceReport, StageDifference
from .stages import _compare_stage, _Drift, _drift
from .ties import _rerun_discrete


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
        result, base, anchor_values = _run_passes(
            setup, names, ops_of, [_defined(n, op_of, ref_names) for n in names], sizes, limit
        )
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


def _run_passes(
    setup: _Setup, names: list[str], ops_of: list, picked: list[str], sizes: list[int], limit: int
) -> tuple[list[StageDifference], dict[int, np.ndarray], dict[str, np.ndarray]]:
    """Every stage, in passes holding at most ``limit`` bytes of outputs (``picked``: each
    stage's output in MXNet's reference graph): the stages compared, MXNet's outputs of the
    sort and selection stages by position, and MXNet's values of those stages' inputs."""
    result: list[StageDifference] = []
    base: dict[int, np.ndarray] = {}
    anchor_values: dict[str, np.ndarray] = {}
    passes = _passes(sizes, limit)
    for k, (first, stop) in enumerate(passes):
        if len(passes) > 1:
            held = sum(sizes[first:stop]) / 2**30
            progress.say(
                f"probe pass {k + 1} of {len(passes)}: stages {first + 1}-{stop} of "
                f"{len(names)} ({held:.2f} GiB of outputs)"
            )
        passed = _probe_pass(setup, picked[first:stop], names[first:stop], ops_of[first:stop])
        result += passed.stages
        base.update({first + i: ref for i, ref in passed.kept.items()})
        anchor_values.update(passed.anchor_values)
    return result, base, anchor_values


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
