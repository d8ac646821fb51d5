"""What the graph tuner weighs: every convolution's kernel time in each candidate layout
and every layout transform's time, measured on the device and cached.

A convolution's cost is the time of the kernel it becomes in the model: the model is
converted to one layout throughout (all plain, all of one packing) and lowered as a
deploy lowers it, and the fused kernel holding each convolution (its BatchNorm,
activation and residual add with it) is what is timed, scheduled by the schedule
stage (tuned record, default rule, safe rule) exactly as the deploy will. A kernel the
tuning database holds a record for takes the record's time instead of a measurement.

Transforms are timed by shape and pair of layouts. Both kinds of time are kept in
``layout_costs.json`` in the device's database folder, keyed by the device (its
target, and its OpenCL platform, device and driver; on a CPU, the number of threads
its kernels ran on), the kernel's structure and, for transforms, shape and layouts; a
second deploy measures nothing. A key names the
kernel before it is scheduled, so each device's entries also carry the fingerprint of
the default rules that scheduled them (:func:`rules_fingerprint`): after a rule
changes, its kernels are measured again instead of being weighed by their old times.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import tvm
import tvm_ffi
from tvm import relax, tirx

from .. import __version__
from ..lowering import lower
from ..lowering.legalize import WINOGRAD
from ..lowering.winograd import SIDES, eligible
from ..lowering.winograd import signature as call_signature
from .apply import convert_layouts
from .extract import Extracted
from .graph import block_of, is_packed, packed, plain
from .solver import uniform_plans

COSTS_FILE = "layout_costs.json"
# What the cached times mean; entries of another version are measured again. Raise it
# when the meter or a rule changes what a kernel's time is. 2: the CPU meter times
# kernels with their weights out of cache, as in a model (1: warm); 3: Winograd's rule
# inlines an epilogue that reads a value twice (LeakyReLU) as the other rules do.
COSTS_VERSION = 3
CONV_OPS = (
    "conv2d",
    "conv2d_NCHWc",
    "depthwise_conv2d_NCHWc",
    "winograd_conv2d_NCHWc",
    "conv2d_int8_NCHW",
    "conv2d_int8_NCHWc",
)

Progress = Callable[[str], None]


@dataclass
class Kernel:
    """A kernel to time: its PrimFunc and the key it is cached under."""

    func: tirx.PrimFunc
    key: str
    seconds: float | None = None
    source: str = ""  # "cache", "database", "measured", "failed"


DIRECT = "direct"


def winograd_algorithm(side: int) -> str:
    return f"winograd{side}"


def winograd_side(algorithm: str) -> int | None:
    """The output tile side of a Winograd algorithm's name; None for direct."""
    return int(algorithm.removeprefix("winograd")) if algorithm.startswith("winograd") else None


@dataclass
class MeasuredCosts:
    """:class:`~.solver.Costs` from measurements: seconds per (convolution node name,
    layout) and per (shape, src, dst) transform; ``sources`` counts where each came
    from (cache, database, measured)."""

    kernels: dict[tuple[str, str], float] = field(default_factory=dict)
    transforms: dict[tuple[tuple[int, ...], str, str], float] = field(default_factory=dict)
    sources: dict[str, int] = field(default_factory=dict)
    # (convolution, layout) -> its time by each algorithm measured ("direct",
    # "winograd2", "winograd4"); ``kernels`` holds the fastest
    algorithms: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    # (convolution, layout, algorithm) -> where its time came from: "database",
    # "cache", "measured" or "predicted"
    origins: dict[tuple[str, str, str], str] = field(default_factory=dict)

    def kernel(self, node, layout: str) -> float:
        return self.kernels.get((node.name, layout), float("inf"))

    def add(self, name: str, layout: str, algorithm: str, seconds: float) -> None:
        """One algorithm's time for a convolution in ``layout``; the fastest counts."""
        times = self.algorithms.setdefault((name, layout), {})
        times[algorithm] = seconds
        self.kernels[(name, layout)] = min(times.values())

    def transform(self, shape, src: str, dst: str) -> float:
        return self.transforms.get((tuple(shape), src, dst), float("inf"))


class CostCache:
    """``layout_costs.json`` files: read from every folder given (first wins), written
    to ``writable`` only. Entries from another edgecv or TVM version, or of another
    :data:`COSTS_VERSION`, or measured under other default rules (``rules``, see
    :func:`rules_fingerprint`) are ignored."""

    def __init__(
        self, folders: Iterable[str | Path], writable: str | Path | None, device: str, rules: str
    ):
        self.device = device
        self.rules = rules
        self.writable = Path(writable) if writable else None
        self.entries: dict[str, float] = {}
        for folder in reversed([Path(f) for f in folders]):
            self.entries.update(self._read(folder / COSTS_FILE))
        self.new: dict[str, float] = {}

    def _read(self, path: Path) -> dict[str, float]:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        if not _current(data) or data.get("rules", {}).get(self.device) != self.rules:
            return {}
        return {k: float(v) for k, v in data.get("devices", {}).get(self.device, {}).items()}

    def get(self, key: str) -> float | None:
        return self.entries.get(key)

    def put(self, key: str, seconds: float) -> None:
        self.entries[key] = self.new[key] = seconds

    def save(self) -> None:
        """Add the new entries to the writable file (read again first: another deploy
        may have written since)."""
        if self.writable is None or not self.new:
            return
        path = self.writable / COSTS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            data = json.loads(path.read_text())
            if not _current(data):
                data = {}
        except (OSError, ValueError):
            data = {}
        data.update({"edgecv": __version__, "tvm": tvm.__version__, "version": COSTS_VERSION})
        devices, rules = data.setdefault("devices", {}), data.setdefault("rules", {})
        if rules.get(self.device) != self.rules:  # measured under other rules: replaced
            devices[self.device], rules[self.device] = {}, self.rules
        devices.setdefault(self.device, {}).update(self.new)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        tmp.replace(path)


def _current(data: dict) -> bool:
    return (data.get("edgecv"), data.get("tvm"), data.get("version")) == (
        __version__,
        tvm.__version__,
        COSTS_VERSION,
    )


def cpu_costs_key(device_class: str, threads: int) -> str:
    """The key of a CPU's costs in ``layout_costs.json``: its tuning device class and
    the threads its kernels ran on. A kernel's time depends on both, and times of one
    thread count beside another's weigh a plan wrongly (costs a one-thread process had
    cached made a two-core plan slower:
    benchmarks/results/graph_tuner-2026-11-25-zen5-2core.md)."""
    return f"{device_class} threads={threads}"


def costs_folder_name(costs_key: str) -> str:
    """The device class a costs key belongs to (its database folder's name)."""
    return costs_key.split(" threads=")[0]


def kernel_key(func: tirx.PrimFunc) -> str:
    """A kernel's identity regardless of its name in one model."""
    named = func.attrs is not None and "global_symbol" in func.attrs
    bare = func.without_attr("global_symbol") if named else func
    return f"kernel:{tvm_ffi.structural_hash(bare):016x}"


def transform_key(shape: tuple[int, ...], src: str, dst: str) -> str:
    return f"transform:{'x'.join(map(str, shape))}:{src}->{dst}"


def conv_kernels(
    extracted: Extracted, layout: str, winograd: int | None = None
) -> dict[str, tirx.PrimFunc]:
    """Per convolution node (by name) that can run in ``layout``, the fused kernel
    holding it when the whole model is converted to ``layout`` and lowered; with
    ``winograd`` (an output tile side), only the convolutions that then run by
    Winograd's algorithm (:mod:`.winograd`)."""
    graph = extracted.graph
    plans = uniform_plans(graph)
    layouts = plans.get(layout, {i: plain(4) for i in graph.convs()})
    chosen = None
    if winograd is not None:
        chosen = {
            call_signature(extracted.calls[i]): winograd
            for i in graph.convs()
            if is_packed(layouts[i]) and eligible(extracted.calls[i])
        }
        if not chosen:
            return {}
    lowered = lower(
        convert_layouts(extracted, layouts),
        chosen,
        extracted.int8_block,
        extracted.int8_pairs,
        extracted.fast_exp,
    )
    functions = {gv.name_hint: f for gv, f in lowered.kernels.functions.items()}
    steps = [
        s.kernel
        for s in lowered.plan.steps
        if any(op in CONV_OPS for op in lowered.kernel_ops.get(s.kernel, []))
    ]
    convs = graph.convs()
    if len(steps) != len(convs):
        raise RuntimeError(
            f"{len(convs)} convolutions became {len(steps)} convolution kernels in {layout}"
        )
    # Kernels run in the plan's order, which on parallel branches (Fast-SCNN's) is not
    # the graph's: each convolution takes the first unclaimed kernel of its signature.
    unclaimed = list(steps)
    found = {}
    for index in convs:
        signature = _conv_signature(extracted, index)
        kernel = next(
            (k for k in unclaimed if _holds(functions[k], signature)),
            None,
        )
        if kernel is None:
            continue
        unclaimed.remove(kernel)
        if layouts[index] != layout:
            continue
        if winograd is None or WINOGRAD in lowered.kernel_ops.get(kernel, []):
            found[graph.nodes[index].name] = functions[kernel]
    return found


def _conv_signature(extracted: Extracted, index: int) -> tuple:
    """(output, data) logical shapes, weight elements and kernel size of conv ``index``."""
    call = extracted.calls[index]
    data, weight = (tuple(int(d) for d in a.ty.shape.values) for a in call.args[:2])
    node = extracted.graph.nodes[index]
    return (tuple(node.shape), data, math.prod(weight), weight[2:4])


def _holds(func: tirx.PrimFunc, signature: tuple) -> bool:
    """Whether ``func``'s parameters fit the :func:`_conv_signature` ``signature``: the
    output last, the data and the weight (kernel size at axes 2-3 in every layout)
    among the others; packed shapes compared in NCHW.

    The output may be larger than the convolution's where the kernel ends in a
    broadcasting op: a squeeze-and-excitation's 1x1 convolution on the pooled
    ``[N, C, 1, 1]`` fuses with the multiply that scales the ``[N, C, H, W]`` map by it
    (MobileNetV3's, GluonCV's and torchvision's alike); and it may have fewer channels
    where the kernel ends in the slice that drops the channels
    :mod:`.channel_padding` added."""
    out, data, numel, size = signature
    shapes = [[int(d) for d in p.shape] for p in func.params]

    def from_out(shape: tuple[int, ...]) -> bool:
        if len(shape) != len(out) or len(out) < 2 or shape[1] > out[1]:
            return False
        pairs = zip(out, shape, strict=True)
        return all(o in (1, s) for axis, (o, s) in enumerate(pairs) if axis != 1)

    def logical(shape: list[int]) -> tuple[int, ...]:  # NCHW[x]c -> NCHW
        return tuple(shape if len(shape) != 5 else [shape[0], shape[1] * shape[4], *shape[2:4]])

    def weights(shape: list[int]) -> tuple[int, tuple[int, ...]]:
        if len(shape) == 5 and _transformed(shape) and size == (3, 3):
            # Winograd's weights, [a*a, O/ob, C/ib, ib, ob]: 9 per a*a of them
            return math.prod(shape[1:]) * 9, size
        return math.prod(shape), tuple(shape[2:4])

    inputs = shapes[:-1]
    return (
        from_out(logical(shapes[-1]))
        and data in [logical(s) for s in inputs]
        and (numel, size) in [weights(s) for s in inputs if len(s) >= 4]
    )


def _transformed(shape: list[int]) -> bool:
    alpha = math.isqrt(shape[0])
    return alpha * alpha == shape[0] and alpha - 2 in SIDES


def transform_kernel(shape: tuple[int, ...], src: str, dst: str) -> tirx.PrimFunc:
    """The kernel of one layout transform of a tensor of logical ``shape``."""
    rank = len(shape)
    block = block_of(src if is_packed(src) else dst)
    if is_packed(src):
        physical = (shape[0], shape[1] // block, *shape[2:], block)

        def index_map(*i):
            return (i[0], i[1] * block + i[-1], *i[2:-1])
    else:
        physical = tuple(shape)

        def index_map(*i):
            return (i[0], i[1] // block, *i[2:], i[1] % block)

    del rank
    x = relax.Var("x", relax.TensorType(physical, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            mapping = tirx.IndexMap.from_func(index_map, ndim=len(physical), index_dtype="int32")
            y = bb.emit_output(relax.op.layout_transform(x, index_map=mapping))
        bb.emit_func_output(y)
    # Lowered as a deploy lowers the model's own transforms (through FuseOps/FuseTIR).
    kernels = lower(bb.get()).kernels
    return next(f for f in kernels.functions.values() if isinstance(f, tirx.PrimFunc))


def needed_transforms(extracted: Extracted, packings: Iterable[str]) -> set[tuple]:
    """Every (shape, src, dst) a plan could need: to and from each packing, for every
    tensor whose channels divide into it (the solver asks for nothing else)."""
    needed = set()
    users = extracted.graph.consumers()
    for node, used in zip(extracted.graph.nodes, users, strict=True):
        if not used or node.kind == "const" or node.rank < 2:
            continue
        for layout in packings:
            block = block_of(layout)
            if node.shape[1] % block == 0:
                pack = packed(node.rank, block)
                needed.add((node.shape, plain(node.rank), pack))
                needed.add((node.shape, pack, plain(node.rank)))
    return needed


def work_folder(prefix: str) -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix=prefix)
