"""Numerical comparison used by the tests and benchmarks: a whole model against its
independent reference (MXNet for an MXNet graph, ONNX Runtime's CPU forward for an ONNX
file), detections row by row, registered operators against their NumPy reference; all
within the one tolerance table by dtype of :mod:`edgecv.tolerances`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

# the divergence probe and MXNet's reference graph are part of edgecv.testing too
from .divergence_probe import DivergenceReport, StageDifference, probe_divergence  # noqa: F401
from .frontend.mxnet.mxnet_graph import with_defined_roi_align  # noqa: F401

# the tolerance table and the asserts that read it live in edgecv.tolerances
from .tolerances import (  # noqa: F401
    FP16_PER_LAYER,
    INT8_PER_LAYER,
    TOLERANCES,
    assert_close,
    assert_close_fp16,
    assert_close_int8,
)


def match_detections(
    ours: list[np.ndarray],
    ref: list[np.ndarray],
    loosen: float = 1.0,
    box_scale: float = 1.0,
    cut: list[int] | None = None,
) -> int:
    """Compare (ids, scores, boxes); return the number of valid detections compared.

    Rows are walked in MXNet's order. A run of rows whose reference scores are each
    equal to the one before within the float32 tolerance is a tie: MXNet's sort and
    ours may order it differently without either being wrong, so within the run the
    rows are matched as a set (sorted by id then box). Everything else must match
    position by position. Boxes are decoded from pixel-sized anchors (``corner =
    anchor + offset``), so their rounding is relative to ``box_scale`` (the input
    size), not to the corner's own value, which can be near 0 after cancellation.

    A tie that runs into the end of a full output (every row valid: the output was
    cut inside the tie, by ``topk`` or its length) is the one place where which rows
    are in the output is not decided by the scores: candidates beyond the cut tie with
    those inside it, and rounding picks. Random-weight SSD-VGG scores all 100 rows
    within 3e-7 of each other out of thousands. Given a list ``cut``, such a group
    whose rows differ is compared by its scores only and its row count appended to
    ``cut``; without it (the zoo models' parity tests) every row must match.
    """
    ids, scores = (o[0].reshape(o.shape[1], -1) for o in ours[:2])
    rids, rscores = (o[0].reshape(o.shape[1], -1) for o in ref[:2])
    rtol, atol = TOLERANCES["float32"]
    rows = ids.shape[0]
    i = 0
    while i < rows:
        j = i + 1
        # the run goes on while each row ties with the one before it (0.33709, 0.33707,
        # 0.33707: the last two swapped places in YOLOv3's output, out of the first's
        # reach but tied with each other)
        while j < rows and abs(rscores[j, 0] - rscores[j - 1, 0]) <= loosen * (
            atol + rtol * abs(rscores[j - 1, 0])
        ):
            j += 1
        try:
            _match_rows(ours, ref, i, j, loosen, box_scale)
        except AssertionError:
            # a tie reaching the end of a full output: which tied candidates made the
            # cut is rounding's choice; their scores must still match
            full = (rids[:, 0] >= 0).all() and (ids[:, 0] >= 0).all()
            if cut is None or not (j == rows and j - i > 1 and full):
                raise
            assert_close(
                np.sort(scores[i:j, 0]),
                np.sort(rscores[i:j, 0]),
                f"scores of the tie cut at the end, rows {i}:{j}",
                loosen,
            )
            cut.append(j - i)
        i = j
    return int((rids[:, 0] >= 0).sum())


def _match_rows(ours, ref, i: int, j: int, loosen: float, box_scale: float) -> None:
    """Rows ``i:j`` of (ids, scores, boxes), as a set when they are a tie."""
    ours_rows, ref_rows = (
        np.concatenate([o[0][i:j].reshape(j - i, -1) for o in x], axis=1) for x in (ours, ref)
    )
    if j - i > 1:
        ours_rows, ref_rows = _by_class_and_box(ours_rows), _by_class_and_box(ref_rows)
    np.testing.assert_array_equal(ours_rows[:, 0], ref_rows[:, 0], err_msg=f"ids, rows {i}:{j}")
    assert_close(ours_rows[:, 1:2], ref_rows[:, 1:2], f"scores, rows {i}:{j}", loosen)
    # Box sizes are exp(std * d) * anchor: a relative error e in the regression d
    # becomes std * |d| * e in the box, on top of the corner = center +- size/2
    # cancellation; boxes get 10x the tolerance of the scores for that.
    assert_close(ours_rows[:, 2:], ref_rows[:, 2:], f"boxes, rows {i}:{j}", 10 * loosen, box_scale)


def _by_class_and_box(rows: np.ndarray) -> np.ndarray:
    """(id, score, box) rows sorted by id, then box corners rounded to a pixel, then
    score: the score, which differs within tolerance, must not order two tied rows, and
    neither may a box corner's last bits."""
    boxes = np.round(rows[:, 2:]).T[::-1]
    return rows[np.lexsort((rows[:, 1], *boxes, rows[:, 0]))]


def reference_drift(
    forward, inputs: list[np.ndarray], as_sets=(), seed: int = 0, trials: int = 3
) -> tuple[list, list[float]]:
    """How far the reference drifts from itself on this model: its outputs on
    ``inputs``, and the largest absolute change of each output of ``forward`` (MXNet's
    own forward pass) over ``trials`` runs with every input moved by about one float32
    rounding step (relative 1e-7; a detector's tie may flip in one trial of three).

    Outputs whose index is in ``as_sets`` are rows that may reorder (a detector's ids,
    scores and boxes after NMS): their values are compared sorted, which measures how
    far the values move without counting a swap of two near-equal rows as a change.
    """
    rng = np.random.RandomState(seed)
    base = forward(*inputs)
    drift = [0.0] * len(base)
    for _ in range(trials):
        noisy = [(x * (1 + 1e-7 * rng.standard_normal(x.shape))).astype(x.dtype) for x in inputs]
        for i, (a, b) in enumerate(zip(base, forward(*noisy), strict=True)):
            a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
            if i in as_sets:
                a, b = np.sort(a, axis=None), np.sort(b, axis=None)
            drift[i] = max(drift[i], float(np.abs(a - b).max(initial=0.0)))
    return base, drift


def rounding_loosening(forward, inputs: list[np.ndarray], seed: int = 0) -> list[float]:
    """How much to loosen the table per output for a model that amplifies rounding.

    The reference's drift against itself (:func:`reference_drift`), relative to each
    output's scale, is how far two correct float32 implementations may drift apart on
    this model: deep segmentation nets with random weights amplify rounding to 2e-4 of
    the output's scale (ICNet), 20x the table's ``atol``. Returns ``4 x`` that drift in
    units of the table's float32 ``atol`` (at least 1; integer outputs stay exact):
    edgecv is held to four times the reference's own drift, never more loosely.
    """
    base, drifts = reference_drift(forward, inputs, seed=seed)
    _, atol = TOLERANCES["float32"]
    factors = []
    for a, drift in zip(base, drifts, strict=True):
        if not np.issubdtype(np.asarray(a).dtype, np.floating):
            factors.append(1.0)
            continue
        scale = max(1.0, float(np.abs(a).max(initial=0.0)))
        factors.append(max(1.0, 4 * drift / scale / atol))
    return factors


def detection_loosening(
    forward, inputs: list[np.ndarray], box_scale: float, seed: int = 0
) -> float:
    """The ``loosen`` of :func:`match_detections` that holds edgecv to four times the
    reference's own drift (:func:`reference_drift`, rows as sets) in the scores (in
    units of ``atol``) and the boxes (in units of ``10 x atol x box_scale``): at least 1."""
    _, atol = TOLERANCES["float32"]
    _, scores, boxes = reference_drift(forward, inputs, (0, 1, 2), seed)[1][:3]
    return max(1.0, 4 * scores / atol, 4 * boxes / (10 * atol * box_scale))


def network_loosening(symbol_path: str | Path) -> float:
    """How much to loosen the table for a whole network exported to ``symbol_path``.

    Each layer's float32 sum runs in a different order in MXNet (oneDNN) than in our
    kernels; the rounding differences compound through the layers. The table's
    tolerance is per operator, so a network gets it times (its weighted layers / 10):
    ResNet-50 (54 layers) compares within ~5e-5 of its output scale.
    """
    text = Path(symbol_path).read_text()
    layers = text.count('"op": "Convolution"') + text.count('"op": "FullyConnected"')
    return max(1.0, layers / 10)


def is_detection(outputs: list) -> bool:
    """(ids, scores, boxes, ...) of a detector: (1, N, 1), (1, N, 1), (1, N, 4)."""
    if len(outputs) < 3:
        return False
    shapes = [np.shape(o) for o in outputs[:3]]
    return all(len(s) == 3 and s[:2] == shapes[0][:2] for s in shapes) and [
        s[2] for s in shapes
    ] == [1, 1, 4]


def compare_with_mxnet(
    ours: list[np.ndarray],
    symbol_path: str | Path,
    params_path: str | Path,
    inputs: dict[str, np.ndarray],
) -> dict:
    """Assert a whole model's outputs ``ours`` match MXNet's forward pass of the same
    exported graph on the same ``inputs`` (name -> array, in the graph's input order).

    Detectors (see :func:`is_detection`) compare their first three outputs with
    :func:`match_detections`, rows whose scores tie as sets; every other output with
    :func:`assert_close`. The tolerance is the table's, loosened for depth
    (:func:`network_loosening`) and, where MXNet's own outputs drift further when the
    input moves by one float32 rounding step, held to four times that drift
    (:func:`rounding_loosening`, :func:`detection_loosening`). Returns what was compared:
    ``{"loosen": largest factor used, "detections": valid rows compared or None,
    "cut_tie_rows": rows of a tie cut at the end, compared by score only}``.
    """
    import warnings

    from edgecv._mxnet import import_mxnet

    mx = import_mxnet()
    text = Path(symbol_path).read_text()
    defined = with_defined_roi_align(text)
    with tempfile.TemporaryDirectory(prefix="edgecv-reference-") as tmp:
        reference = Path(tmp) / "reference-symbol.json"
        reference.write_text(defined)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            net = mx.gluon.SymbolBlock.imports(str(reference), list(inputs), str(params_path))

    def forward(*arrays):
        out = net(*[mx.nd.array(a) for a in arrays])
        return [r.asnumpy() for r in (out if isinstance(out, (list, tuple)) else [out])]

    xs = list(inputs.values())
    ref = forward(*xs)
    if len(ours) != len(ref):
        raise AssertionError(f"{len(ours)} outputs, MXNet has {len(ref)}")
    depth = network_loosening(symbol_path)
    result: dict = {"loosen": depth, "detections": None}
    first = 0
    if is_detection(ref):
        box_scale = float(max(xs[0].shape[2:]))
        loosen = max(depth, detection_loosening(forward, xs, box_scale))
        cut: list[int] = []
        compared = match_detections(ours[:3], ref[:3], loosen, box_scale, cut)
        result.update(loosen=loosen, detections=compared, cut_tie_rows=sum(cut))
        first = 3
    if first < len(ref):
        factors = [max(depth, f) for f in rounding_loosening(forward, xs)]
        for i in range(first, len(ref)):
            assert_close(ours[i], ref[i], f"output {i}", loosen=factors[i])
        result["loosen"] = max([result["loosen"], *factors[first:]])
    return result


def compare_with_onnxruntime(
    package_or_model,
    onnx_path: str | Path,
    inputs: dict[str, np.ndarray] | list[np.ndarray] | None = None,
    seed: int = 0,
) -> dict:
    """Assert a package's outputs match ONNX Runtime's CPU forward pass of the ONNX file
    it was deployed from, on the same ``inputs``; the ONNX counterpart of
    :func:`compare_with_mxnet`, with the same tolerances.

    Parameters
    ----------
    package_or_model : path or edgecv.model.DeployedModel
        The package folder (loaded here) or a loaded model.
    onnx_path : path
        The ONNX file (external data beside it); its weights must be the package's.
    inputs : dict or list, optional
        Arrays by input name or in the package's input order; by default standard normal
        values of each input's shape and dtype from ``seed``.

    Every output compares with :func:`assert_close`, loosened for depth (the file's
    Conv, ConvTranspose, Gemm and MatMul nodes / 10, as :func:`network_loosening` counts
    MXNet's) and, where ONNX Runtime's own outputs drift further when the input moves by
    one float32 rounding step, held to four times that drift (:func:`rounding_loosening`).
    Returns ``{"loosen": largest factor used, "max_error": largest difference relative
    to each output's scale, "scale": the largest magnitude of ONNX Runtime's outputs}``
    (a scale far below 1 says the inputs or weights make the comparison weak: the
    tolerance is relative to at least 1).
    """
    import onnx
    import onnxruntime as ort

    from .model import DeployedModel, load

    loaded = isinstance(package_or_model, DeployedModel)
    model = package_or_model if loaded else load(package_or_model)
    specs = model.manifest.inputs
    if inputs is None:
        rng = np.random.RandomState(seed)
        inputs = [rng.standard_normal(t.shape).astype(t.dtype) for t in specs]
    xs = [inputs[t.name] for t in specs] if isinstance(inputs, dict) else list(inputs)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def forward(*arrays):
        return session.run(None, dict(zip(names, arrays, strict=True)))

    ref, ours = forward(*xs), model.run(*xs)
    if len(ours) != len(ref):
        raise AssertionError(f"{len(ours)} outputs, ONNX Runtime has {len(ref)}")
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    weighted = ("Conv", "ConvTranspose", "Gemm", "MatMul")
    depth = max(1.0, sum(node.op_type in weighted for node in graph.node) / 10)
    factors = [max(depth, f) for f in rounding_loosening(forward, xs, seed=seed)]
    errors = []
    for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
        assert_close(a, b, f"output {i} ({graph.output[i].name})", loosen=factors[i])
        scale = max(1.0, float(np.abs(b).max(initial=0.0)))
        errors.append(float(np.abs(np.asarray(a, np.float64) - b).max(initial=0.0)) / scale)
    scale = max(float(np.abs(b).max(initial=0.0)) for b in ref)
    return {"loosen": max(factors), "max_error": max(errors), "scale": scale}


def detector_inputs(rng, batch, classes, n, levels=None):
    """Softmax-like class probabilities, regressions, anchors inside the unit square."""
    if levels is None:
        cls = rng.uniform(0, 1, (batch, classes, n))
    else:  # few distinct values: equal scores and equal best classes
        cls = rng.choice(levels, (batch, classes, n))
    cls = (cls / cls.sum(1, keepdims=True)).astype(np.float32)
    loc = (rng.standard_normal((batch, n * 4)) * 0.5).astype(np.float32)
    centre, size = rng.uniform(0.1, 0.9, (1, n, 2)), rng.uniform(0.05, 0.5, (1, n, 2))
    anchors = np.concatenate([centre - size / 2, centre + size / 2], -1).astype(np.float32)
    return cls, loc, anchors


def run_cli(*args, cwd: str | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run ``python -m edgecv.cli ARGS`` as a user would, in a fresh process importing this
    checkout of edgecv; returns the finished process (stdout/stderr as text)."""
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "edgecv.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
    )


def assert_one_error_line(result: subprocess.CompletedProcess, fragment: str) -> str:
    """A CLI failure: non-zero exit, exactly one ``edgecv: error:`` line holding
    ``fragment``, no traceback. Returns that line."""
    err = result.stderr
    assert result.returncode != 0, (result.returncode, result.stdout, err)
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("edgecv: error:")]
    assert len(lines) == 1, err
    assert fragment in err, (fragment, err)
    return lines[0]


def check_op(
    name: str,
    shapes: Sequence[tuple[int, ...]],
    attrs: dict | None = None,
    devices: Sequence[str] | None = None,
    seed: int = 0,
    loosen: float = 1.0,
) -> dict[str, float]:
    """Check the operator registered as ``name`` (:func:`edgecv.register_op`) against its
    NumPy reference on random inputs, compiled alone on each device as a deploy would.

    Each device gets a one-node model of the op (a ``Custom`` node with ``op_type`` =
    ``name``), deployed through the whole pipeline (import, fusion, the schedule stage,
    code, package), loaded and run on normal random float32 inputs; its output must
    match ``reference(*inputs, **attrs)`` per :data:`TOLERANCES`.

    Parameters
    ----------
    name : str
        The registered operator; it must have a ``reference``.
    shapes : sequence of tuple
        The shape of each input, in the order ``compute`` takes them (weights too).
    attrs : dict, optional
        The node's attributes, as the compute function and the reference receive them.
    devices : sequence of str, optional
        ``cpu`` and OpenCL device queries (``intel``, ``pocl``; see ``edgecv devices``);
        by default ``cpu`` and every OpenCL device found but simulators. An OpenCL device
        with Intel subgroups is built for the ``deeplens`` profile, another for ``aisage``
        (with this machine's CPU as host), the boards they stand in for.
    seed : int
        Seed of the random inputs.
    loosen : float
        Multiplies the tolerances (say why when passing more than 1: a long reduction).

    Returns
    -------
    dict
        Device -> largest absolute difference from the reference.
    """
    from edgecv.deploy import deploy
    from edgecv.model import load
    from edgecv.op_registry import RegistrationError, registered_op
    from edgecv.pipelines import BuildOptions
    from edgecv.runtime.opencl_devices import opencl_devices
    from edgecv.runtime.opencl_program import is_simulator

    op = registered_op(name)
    if op is None or op.reference is None:
        why = "is not registered" if op is None else "has no reference"
        raise RegistrationError(
            f"check_op: operator `{name}` {why}; register it with "
            "edgecv.register_op(name, compute, shape=..., reference=numpy_function)"
        )
    attrs = dict(attrs or {})
    rng = np.random.RandomState(seed)
    inputs = [rng.normal(size=tuple(s)).astype(np.float32) for s in shapes]
    expected = np.asarray(op.reference(*inputs, **attrs))
    found = {d.platform: d for d in opencl_devices()}
    if devices is None:  # a simulator (Oclgrind) checks races, at minutes per kernel
        devices = ["cpu", *(p for p in found if not is_simulator(p))]
    errors: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="edgecv-check-op-") as tmp:
        symbol = Path(tmp) / f"{name}-symbol.json"
        symbol.write_text(_one_node_symbol(name, len(inputs), attrs))
        shape_of = {f"in{i}": tuple(x.shape) for i, x in enumerate(inputs)}
        for device in devices:
            if device == "cpu":
                profile, host, on = "cpu", None, None
            else:
                match = [d for d in found.values() if d.matches(device)]
                if not match:
                    raise RegistrationError(
                        f"check_op: no OpenCL device matches {device!r}; found: "
                        f"{', '.join(found) or 'none'}"
                    )
                intel = match[0].intel_subgroups
                profile, host = ("deeplens", None) if intel else ("aisage", "native")
                on = device
            options = BuildOptions(check_on=None, tuning=None, layout="NCHW")
            package = deploy(
                str(symbol),
                Path(tmp) / f"pkg-{len(errors)}",
                profile,
                input_shape=shape_of,
                host=host,
                options=options,
            )
            (actual,) = load(package, on=on).run(*inputs)
            assert_close(actual, expected, f"{name} on {device}", loosen=loosen)
            errors[device] = float(np.abs(actual.astype(np.float64) - expected).max())
    return errors


def _one_node_symbol(name: str, inputs: int, attrs: dict) -> str:
    """MXNet symbol JSON of one ``Custom`` node of ``op_type`` ``name`` on inputs
    ``in0..inN-1``, its attributes written as MXNet writes them (strings)."""
    nodes = [{"op": "null", "name": f"in{i}", "inputs": []} for i in range(inputs)]
    custom = {"op_type": name, **{k: str(v) for k, v in attrs.items()}}
    nodes.append(
        {
            "op": "Custom",
            "name": name,
            "attrs": custom,
            "inputs": [[i, 0, 0] for i in range(inputs)],
        }
    )
    return json.dumps(
        {
            "nodes": nodes,
            "arg_nodes": list(range(inputs)),
            "node_row_ptr": list(range(inputs + 2)),
            "heads": [[inputs, 0, 0]],
            "attrs": {"mxnet_version": ["int", 10901]},
        }
    )
