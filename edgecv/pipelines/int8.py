"""The INT8 step of the CPU pipeline: calibration data in, a quantized Relax module out.

``edgecv deploy MODEL --precision int8 --calibrate DIR_OR_NPY`` runs it before the graph
tuner (:mod:`.cpu`), in order:

1. The calibration inputs (:func:`read_calibration`): a folder of images read with the
   package's own preprocessing, or a ``.npy`` of already preprocessed inputs; at most
   ``--calibration-size`` of them (a seeded sample when there are more).
2. Statistics (:func:`collect_statistics`): edgecv's own float32 build of the model
   (the same Relax passes, CPU rules and LLVM as a float32 deploy, NCHW) with every
   quantizable operator's input as an extra output, run on each input; per tensor a
   min/max and a histogram (:mod:`edgecv.lowering.calibration`). edgecv's compiled
   module rather than TVM's Relax VM: the VM would run the same kernels unscheduled
   (one core, no vectors), minutes per image for ResNet-50, where the scheduled build
   runs at the float32 package's speed; and the statistics are those of the very
   kernels the float32 package runs. The statistics of the package being replaced
   (its ``calibration.json``) are reused instead when they were taken on the same
   model (structural hash of the imported module, weights included) and the same
   inputs (sha256 of the preprocessed tensors).
3. Scales by ``--calibration-method`` and the rewrite
   (:func:`edgecv.lowering.quantize.quantize`).

The statistics go into the package as ``calibration.json`` (checksummed in the
manifest's ``files`` like every file), the choices into the manifest's
``build.quantization``.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm
import tvm_ffi

from ..board.errors import EdgecvError
from ..board.imaging import preprocess, read_image
from ..board.precision import Precision
from ..lowering import lower
from ..lowering.calibration import METHODS, PERCENTILE, STATS_VERSION, TensorQuant, TensorStats
from ..lowering.legalize import sums_in_pairs
from ..lowering.quantize import quantize
from ..lowering.quantize_plan import WEIGHT_MAX, exact_in_float32, shiftable
from ..lowering.quantize_sites import find_sites, with_taps
from ..profiles import Profile
from ..schedules.cpu.dot_product import DotProduct, runs_on_dot_product

DEFAULT_CALIBRATION_SIZE = 100
# Chosen from the measured accuracy of the three methods: docs/int8.md.
DEFAULT_METHOD = "percentile"
CALIBRATION_FILE = "calibration.json"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")
FORMAT = "edgecv-calibration"
WHAT_TO_PASS = (
    "pass --calibrate DIR (a folder of images like those the model will see, read with "
    "the package's preprocessing) or --calibrate X.npy (preprocessed inputs, N x the "
    "input shape)"
)


class CalibrationError(EdgecvError):
    """Calibration data missing, unreadable or of the wrong shape."""


@dataclass
class CalibrationInputs:
    """The preprocessed inputs the statistics are taken on."""

    arrays: np.ndarray  # (N, *input shape), float32
    source: str  # the path given
    kind: str  # "images" or "npy"
    available: int  # inputs the source held (N of them were used)
    sha256: str  # of the float32 tensors: the same inputs give the same statistics

    def to_json(self) -> dict:
        return {
            "source": self.source,
            "kind": self.kind,
            "inputs": int(len(self.arrays)),
            "available": self.available,
            "sha256": self.sha256,
        }


def check_request(options, profile: Profile) -> None:
    """Refuse, before anything is compiled, a precision request that cannot be built:
    int8 without calibration data or on a GPU profile, calibration options without
    int8, a calibration source that is not there (an unknown precision never gets
    here: :class:`~.steps.BuildOptions` parses it)."""
    if options.precision is not Precision.INT8:
        if options.calibrate is not None or options.calibration_size is not None:
            raise CalibrationError(
                "--calibrate and --calibration-size apply to --precision int8 only; add "
                "--precision int8, or leave them out for a float32 package"
            )
        return
    if profile.runtime != "cpu":
        raise EdgecvError(
            f"--precision int8 builds for CPU profiles only in this version; profile "
            f"`{profile.name}` runs on the {profile.runtime} backend (its GPU kernels are "
            "float32): deploy with --device cpu, or without --precision int8"
        )
    if options.calibrate is None:
        raise CalibrationError(f"--precision int8 needs calibration data: {WHAT_TO_PASS}")
    size = options.calibration_size
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise CalibrationError(f"--calibration-size must be a whole number >= 1, got {size!r}")
    if options.calibration_method not in METHODS:
        raise CalibrationError(
            f"--calibration-method must be one of {', '.join(METHODS)}, not "
            f"{options.calibration_method!r}"
        )
    _source_kind(Path(options.calibrate))


def _source_kind(path: Path) -> str:
    if path.is_dir():
        return "images"
    if path.is_file() and path.suffix.lower() == ".npy":
        return "npy"
    if not path.exists():
        raise CalibrationError(f"--calibrate {path}: no such file or folder; {WHAT_TO_PASS}")
    raise CalibrationError(
        f"--calibrate {path} is neither a folder of images nor a .npy file; {WHAT_TO_PASS}"
    )


def read_calibration(
    path: str | Path, input_shape: tuple[int, ...], preprocessing: dict, size: int | None
) -> CalibrationInputs:
    """At most ``size`` (default :data:`DEFAULT_CALIBRATION_SIZE`) preprocessed inputs
    of ``input_shape`` from the folder of images or ``.npy`` file at ``path``. More
    available than asked: a sample drawn with a fixed seed (the same inputs on every
    redeploy), in their original order."""
    path = Path(path)
    size = DEFAULT_CALIBRATION_SIZE if size is None else size
    shape = tuple(int(d) for d in input_shape)
    kind = _source_kind(path)
    if kind == "images":
        files = sorted(
            p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
        )
        if not files:
            raise CalibrationError(
                f"--calibrate {path} holds no images ({', '.join(IMAGE_SUFFIXES)}); {WHAT_TO_PASS}"
            )
        chosen = [files[i] for i in _sample(len(files), size)]
        arrays = np.stack([preprocess(read_image(f), preprocessing, shape) for f in chosen])
        available = len(files)
    else:
        try:
            data = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as err:
            raise CalibrationError(f"cannot read --calibrate {path}: {err}") from None
        if data.shape[1:] == shape:
            pass
        elif shape[0] == 1 and data.shape[1:] == shape[1:]:  # N x C x H x W for batch 1
            data = data.reshape(len(data), *shape)
        else:
            raise CalibrationError(
                f"--calibrate {path} holds an array of shape {tuple(data.shape)}; expected N x "
                f"{'x'.join(map(str, shape))} (N preprocessed inputs of the model's input shape)"
            )
        if len(data) == 0:
            raise CalibrationError(f"--calibrate {path} holds no inputs (N = 0)")
        if not np.issubdtype(data.dtype, np.number):
            raise CalibrationError(f"--calibrate {path} holds {data.dtype}, not numbers")
        arrays = np.asarray(data[_sample(len(data), size)], np.float32)
        available = len(data)
    if not np.all(np.isfinite(arrays)):
        raise CalibrationError(f"--calibrate {path}: the inputs hold NaN or infinite values")
    arrays = np.ascontiguousarray(arrays, np.float32)
    digest = hashlib.sha256(arrays.tobytes()).hexdigest()
    return CalibrationInputs(arrays, str(path), kind, available, digest)


def _sample(available: int, size: int) -> np.ndarray:
    if available <= size:
        return np.arange(available)
    return np.sort(np.random.RandomState(0).choice(available, size, replace=False))


def model_key(mod: tvm.IRModule) -> str:
    """Identifies the imported model, weights and input shape included: statistics taken
    on another one are never reused."""
    return f"{int(tvm_ffi.structural_hash(mod)):016x}"


class _Folder:
    """Where the calibration build's kernel library is linked (a package writer's
    ``path``, without the package)."""

    def __init__(self, root: Path):
        self.root = root

    def path(self, relative: str) -> Path:
        full = self.root / relative
        full.parent.mkdir(parents=True, exist_ok=True)
        return full


def collect_statistics(mod, keys, tensors, inputs, profile, options, progress) -> dict:
    """Run the float32 model with the tensors ``tensors`` (named ``keys``) as extra
    outputs on every calibration input; their :class:`TensorStats` by key."""
    from ..board.runtime.cpu import CPUBackend
    from ..board.runtime.executor import Executor
    from .steps import compile_cpu_kernels

    tapped = with_taps(mod, tensors)
    lowered = lower(tapped)
    target = profile.with_native_host().host_target()  # runs here, whatever the package's
    progress(f"calibration: compiling the float32 model with {len(keys)} tensors to observe")
    write, _ = compile_cpu_kernels(lowered.kernels, target, lowered, options, progress)
    stats = {key: TensorStats() for key in keys}
    with tempfile.TemporaryDirectory(prefix="edgecv-calibration-") as tmp:
        folder = _Folder(Path(tmp))
        library = write(folder)["cpu"]
        executor = Executor(lowered.plan, CPUBackend.load(folder.path(library)), lowered.constants)
        first = len(lowered.plan.outputs) - len(keys)
        progress(f"calibration: running {len(inputs.arrays)} inputs")
        for x in inputs.arrays:
            outputs = executor.run([x])
            for key, value in zip(keys, outputs[first:], strict=True):
                stats[key].update(value)
    return stats


def reusable_statistics(previous: dict | None, key: str, inputs: CalibrationInputs) -> dict | None:
    """The per-tensor statistics of a saved ``calibration.json`` when they were taken
    on the model ``key`` and the very ``inputs`` (and by this format version)."""
    if not isinstance(previous, dict) or previous.get("format") != FORMAT:
        return None
    data = previous.get("data") or {}
    if (
        previous.get("version") != STATS_VERSION
        or previous.get("model") != key
        or data.get("sha256") != inputs.sha256
    ):
        return None
    return previous.get("tensors")


def quantize_model(
    mod: tvm.IRModule, profile: Profile, options, progress, dot: DotProduct | None
) -> tuple[tvm.IRModule, dict, dict[str, str]]:
    """``mod`` quantized (see the module docstring) for its convolutions to run on
    ``dot`` (the CPU pipeline's decision: the dot product of the profile's CPU, None
    when it has none), the manifest's ``build.quantization`` facts and the files for the
    package (``calibration.json``)."""
    inputs: CalibrationInputs | None = options.calibration
    if inputs is None:
        raise CalibrationError(f"--precision int8 needs calibration data: {WHAT_TO_PASS}")
    started = time.perf_counter()
    method = options.calibration_method
    key = model_key(mod)
    found = find_sites(mod)
    stats, reused = _statistics(mod, found, key, inputs, profile, options, progress)
    calibration_s = time.perf_counter() - started
    thresholds = {k: {m: s.threshold(m) for m in METHODS} for k, s in stats.items()}
    if dot is None:
        _warn_without_dot_product(profile)
    quants = choose_quants(found, stats, {k: t[method] for k, t in thresholds.items()}, dot)
    quantized, records = quantize(
        mod,
        quants,
        _weight_limits(dot),
        arithmetic=_arithmetic(dot),
        dense_as_conv=dot is not None,  # an int32 dense layer there is on the dot product
        residual_adds=True,
        shift_signed=lambda site, quant: _shifted(site, quant, dot),
    )
    calibration = {**inputs.to_json(), "reused": reused, "seconds": round(calibration_s, 3)}
    facts = _facts(method, dot, found, records, calibration)
    counts = facts["quantized"]
    progress(
        f"quantized {', '.join(f'{n} {op}' for op, n in sorted(counts.items()))} to int8 "
        f"({method} calibration on {len(inputs.arrays)} inputs)"
    )
    tensors = {
        k: {
            **stats[k].to_json(),
            "readers": found.readers[k],
            "dtype": quants[k].dtype,
            "thresholds": thresholds[k],
            "scale": quants[k].scale,
            "levels": quants[k].qmax,
        }
        for k in found.tensors
    }
    document = {
        "format": FORMAT,
        "version": STATS_VERSION,
        "model": key,
        "data": inputs.to_json(),
        "method": method,
        "percentile": PERCENTILE,
        "tensors": tensors,
    }
    return quantized, facts, {CALIBRATION_FILE: json.dumps(document, separators=(",", ":"))}


def _statistics(mod, found, key: str, inputs: CalibrationInputs, profile, options, progress):
    """(statistics by tensor key, whether they are the package's saved ones): those of
    the previous ``calibration.json`` when taken on this model and these inputs, else
    collected by running the float32 model."""
    keys = list(found.tensors)
    saved = reusable_statistics(options.previous_calibration, key, inputs)
    if saved is not None and set(saved) == set(keys):
        progress(
            f"calibration: reusing the statistics of {len(keys)} tensors ({CALIBRATION_FILE} "
            "of the package replaced: same model, same inputs)"
        )
        return {k: TensorStats.from_json(saved[k]) for k in keys}, True
    tensors = [found.tensors[k] for k in keys]
    return collect_statistics(mod, keys, tensors, inputs, profile, options, progress), False


def choose_quants(
    found, stats: dict[str, TensorStats], thresholds: dict[str, float], dot: DotProduct | None
) -> dict[str, TensorQuant]:
    """Each tensor's quantization from its calibration threshold: uint8 where it was
    never negative (7-bit where a kernel on ``dot`` needs it), else int8."""
    quants = {k: TensorQuant.of(thresholds[k], s.nonnegative) for k, s in stats.items()}
    if dot is not None and dot.data_max < 255:  # 7-bit data where the kernels need it
        for tensor in _seven_bit_inputs(found, quants, dot):
            quants[tensor] = TensorQuant.of(thresholds[tensor], True, dot.data_max)
    return quants


def _warn_without_dot_product(profile: Profile) -> None:
    mcpu = profile.tvm_target().attrs.get("mcpu", "generic")
    warnings.warn(
        f"profile {profile.name}: its CPU ({mcpu}) has no "
        "8-bit dot-product instruction edgecv uses (x86 AVX2 or AVX-512, ARM dotprod): "
        "its INT8 convolutions compute in int32 lanes, about half float32's speed; "
        "deploy without --precision int8 for speed (docs/int8.md)",
        stacklevel=3,
    )


def _facts(method: str, dot, found, records: list[dict], calibration: dict) -> dict:
    """The manifest's ``build.quantization``: how weights and activations were quantized,
    what was, and each operator's record."""
    adds = [r for r in records if r["op"] == "add"]
    records = [r for r in records if r["op"] != "add"]
    counts: dict[str, int] = {}
    for record in records:
        counts[record["op"]] = counts.get(record["op"], 0) + 1
    return {
        "method": method,
        "weights": "int8, symmetric, per output channel (|q| <= weight_max of each "
        "operator: 63 where the CPU's instruction adds two products in int16)",
        "dot_product": dot.intrinsic if dot else None,
        "activations": "uint8 where never negative (0..127 where a spatial convolution on "
        "the dot product sums two steps in int16, or any kernel on ARM's signed sdot reads "
        "it), else int8 symmetric; zero point 0 (an int8 input of an operator without "
        "padding on x86's u8 x s8 dot product is read as q + 128: input_shift)",
        "quantized": counts,
        "float32_arithmetic": sum(r["arithmetic"] == "float32" for r in records),
        "not_quantized": len(found.sites) - len(records),
        "adds_reading_8_bits": [{"add": r["name"], "input": r["input"]} for r in adds],
        "calibration": {"file": CALIBRATION_FILE, **calibration},
        "operators": records,
    }


def _seven_bit_inputs(found, quants: dict, dot) -> set[str]:
    """The uint8 tensors that a kernel on the dot product reads as 7-bit data
    (:meth:`~edgecv.schedules.cpu.dot_product.DotProduct.seven_bit_data`: one that sums
    two steps in int16, :func:`edgecv.lowering.legalize.sums_in_pairs`, or any on ARM's
    signed ``sdot``): they get 7-bit data."""
    keys = set()
    for site in found.sites:
        quant = quants.get(site.tensor)
        if quant is None or quant.dtype != "uint8":
            continue
        if site.op == "dense":
            if _dense_on_dot(site, quant, dot) and dot.seven_bit_data(in_pairs=False):
                keys.add(site.tensor)  # a 1x1 convolution on the dot product
            continue
        groups = int(site.call.attrs.groups)
        if runs_on_dot_product(site.weight.shape, groups, quant.dtype, dot) and dot.seven_bit_data(
            sums_in_pairs(*site.weight.shape[2:])
        ):
            keys.add(site.tensor)
    return keys


def _shifted(site, quant: TensorQuant, dot) -> bool:
    """Whether ``site`` reads its signed input shifted into ``uint8``
    (:data:`edgecv.lowering.quantize_plan.SIGNED_SHIFT`) to run on ``dot``: an operator
    without padding on an instruction that multiplies unsigned data, whose kernel does
    not need 7-bit data (shifted values span 1..255)."""
    if dot is None or dot.signed_bytes or not shiftable(site, quant):
        return False
    return not (site.op == "conv2d" and dot.seven_bit_data(sums_in_pairs(*site.weight.shape[2:])))


def _dot_dtype(site, quant: TensorQuant, dot) -> str:
    """The dtype of ``site``'s input as ``dot``'s kernel would read it."""
    return "uint8" if _shifted(site, quant, dot) else quant.dtype


def _weight_limits(dot: DotProduct | None):
    """The largest weight magnitude per quantized operator: 7 bits for the convolutions
    the CPU's ``vpmaddubsw`` (``dot``) will multiply (two u8 x s8 products added in int16
    saturate beyond 2 x 255 x 63), 8 bits elsewhere
    (:mod:`edgecv.schedules.cpu.dot_product`)."""

    def limit(site, quant: TensorQuant) -> int:
        if dot is None:
            return WEIGHT_MAX
        if site.op == "dense":
            return dot.weight_max if _dense_on_dot(site, quant, dot) else WEIGHT_MAX
        groups = int(site.call.attrs.groups)
        if runs_on_dot_product(site.weight.shape, groups, _dot_dtype(site, quant, dot), dot):
            return dot.weight_max
        return WEIGHT_MAX

    return limit


def _arithmetic(dot: DotProduct | None):
    """How each quantized operator computes (see
    :func:`edgecv.lowering.quantize.quantize`): on the CPU's dot-product instruction
    ``dot`` (``int32``: :mod:`edgecv.schedules.cpu.conv2d_int8`) where it applies;
    else, where float32 holds its sums exactly (depthwise and first convolutions, small
    dense layers), the same integers in float32 kernels, which run at float32's speed
    where int32 lanes ran at half of it; else not quantized at all on a CPU with a dot
    product (None), int32 on one without."""

    def arithmetic(site, quant: TensorQuant, weight_max: int) -> str | None:
        if dot is not None and site.op == "dense" and _dense_on_dot(site, quant, dot):
            return "int32"
        if dot is not None and site.op == "conv2d":
            groups = int(site.call.attrs.groups)
            if runs_on_dot_product(site.weight.shape, groups, _dot_dtype(site, quant, dot), dot):
                return "int32"
        if exact_in_float32(site, quant, weight_max):
            return "float32"
        # int32 lanes run at about half float32's speed: where the CPU has a dot
        # product but this operator cannot use it (SSD's 126-channel class heads, a
        # signed input read with padding), it stays float32 (SSD's heads took most of
        # its INT8 time in int32: benchmarks/results/int8_cpu-2026-11-26-zen3.md)
        return None if dot is not None else "int32"

    return arithmetic


def _dense_on_dot(site, quant: TensorQuant, dot) -> bool:
    """Whether a dense layer runs on the dot product as the 1x1 convolution it is (the
    INT8 convolution kernels: ``uint8`` data of 2 dimensions, output channels in the
    instruction's lanes, inputs in fours). In float32 a dense layer reads its float32
    weights once per inference, in 8 bits a quarter of the bytes
    (benchmarks/results/int8_cpu-2026-11-27-zen3.md)."""
    out_channels, in_channels = site.weight.shape
    return len(site.call.args[0].ty.shape) == 2 and runs_on_dot_product(
        (out_channels, in_channels, 1, 1), 1, _dot_dtype(site, quant, dot), dot
    )


def read_previous(package: Path) -> dict | None:
    """The ``calibration.json`` of the package at ``package``, if there is one to read."""
    try:
        return json.loads((Path(package) / CALIBRATION_FILE).read_text())
    except (OSError, ValueError):
        return None


__all__ = [
    "CALIBRATION_FILE",
    "DEFAULT_CALIBRATION_SIZE",
    "DEFAULT_METHOD",
    "CalibrationError",
    "CalibrationInputs",
    "check_request",
    "collect_statistics",
    "model_key",
    "quantize_model",
    "read_calibration",
    "read_previous",
    "reusable_statistics",
]
