"""A whole model against its independent reference: MXNet's forward pass of an exported
graph (:func:`compare_with_mxnet`) or ONNX Runtime's CPU forward pass of an ONNX file
(:func:`compare_with_onnxruntime`), within the tolerance table, loosened for depth and
for the reference's own drift by the helpers here."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from ..frontend.mxnet.mxnet_graph import with_defined_roi_align
from .detections import is_detection, match_detections
from .tolerances import TOLERANCES, assert_close


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
    outputs: list[np.ndarray] | None = None,
) -> dict:
    """Assert a package's outputs match ONNX Runtime's CPU forward pass of the ONNX file
    it was deployed from, on the same ``inputs``; the ONNX counterpart of
    :func:`compare_with_mxnet`, with the same tolerances.

    Parameters
    ----------
    package_or_model : path or edgecv.board.model.DeployedModel
        The package folder (loaded here) or a loaded model.
    onnx_path : path
        The ONNX file (external data beside it); its weights must be the package's.
    inputs : dict or list, optional
        Arrays by input name or in the package's input order; by default standard normal
        values of each input's shape and dtype from ``seed``.
    outputs : list of arrays, optional
        The package's outputs for ``inputs`` computed elsewhere (a board's run of a
        package this machine cannot load); ``inputs`` must be given then, and the package
        is not loaded.

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

    from ..board.model import DeployedModel, load
    from ..board.package import read_manifest

    if outputs is not None and inputs is None:
        raise ValueError("compare_with_onnxruntime: outputs computed elsewhere need their inputs")
    if outputs is not None:
        model = None
    elif isinstance(package_or_model, DeployedModel):
        model = package_or_model
    else:
        model = load(package_or_model)
    specs = (
        model.manifest.inputs
        if model is not None
        else read_manifest(package_or_model, verify=False)[1].inputs
    )
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

    ref = forward(*xs)
    ours = list(outputs) if outputs is not None else model.run(*xs)
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
