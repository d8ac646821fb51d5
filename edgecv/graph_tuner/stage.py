"""The graph tuner as a pipeline stage: the imported Relax module in, the module with
every convolution in its chosen layout out (before the Relax passes fuse it).

``--layout NCHW`` leaves the module alone. ``packed`` puts every convolution that can
be in the target's first packing. ``auto`` measures (or finds cached) costs on the
device, solves for the cheapest plan and applies it; it never fails a deploy: when
costs cannot be had (no such device here) or measuring or converting fails, the
module is built in NCHW and the reason is recorded (with a warning for failures).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable

import tvm
from tvm import relax

from ..board.errors import EdgecvError
from ..lowering.legalize import fast_exp_for
from ..profiles import Profile
from ..schedules.cpu.dot_product import DotProduct, int8_lowering
from .activations import rewrite_activations
from .apply import convert_layouts, inserted_transforms
from .channel_padding import pad_output_channels
from .costs import DIRECT
from .extract import Candidates, extract
from .graph import block_of, plain
from .solver import LayoutPlan, evaluate, solve, uniform_plans

LAYOUT_MODES = ("auto", "NCHW", "packed")

Progress = Callable[[str], None]


def packings_for(profile: Profile) -> list[str]:
    """The packed layouts the target's conv rules implement: the CPU's vector width
    (NCHW8c for AVX2, NCHW16c for AVX-512, NCHW4c for NEON), the OpenCL device's Intel
    subgroup width (NCHW16c) or Mali's float4 (NCHW4c); none yet for CUDA (no meter)."""
    if profile.runtime == "cpu":
        from ..schedules.cpu.loop_nest import Simd

        with profile.tvm_target():
            return [f"NCHW{Simd.of(profile.tvm_target()).lanes}c"]
    if profile.runtime == "opencl":
        from ..schedules.gpu.conv2d_packed import packings

        return [f"NCHW{block}c" for block in packings(profile.intel_subgroup_size)]
    return []


def winograd_plan(facts: dict) -> dict:
    """The ``winograd`` argument of :func:`edgecv.lowering.lower` from the facts
    :func:`choose_layouts` recorded: signature -> output tile side."""
    return {
        tuple(
            tuple(part) if isinstance(part, list) else part for part in choice["signature"]
        ): choice["side"]
        for choice in facts.get("winograd", [])
    }


def _winograd_choices(extracted, plan: LayoutPlan, costs) -> list[dict]:
    """The packed convolutions whose fastest algorithm was Winograd's, each with its
    signature (how legalization finds it again) and tile side. Convolutions of one
    signature take the side that is fastest for them together."""
    from ..lowering.winograd import signature
    from .costs import winograd_side

    by_signature: dict[tuple, dict[str, float]] = {}
    names: dict[tuple, list[str]] = {}
    for index, layout in plan.layouts.items():
        times = costs.algorithms.get((extracted.graph.nodes[index].name, layout), {})
        if len(times) < 2:
            continue
        key = signature(extracted.calls[index])
        total = by_signature.setdefault(key, {})
        for algorithm, seconds in times.items():
            total[algorithm] = total.get(algorithm, 0.0) + seconds
        names.setdefault(key, []).append(extracted.graph.nodes[index].name)
    choices = []
    for key, totals in by_signature.items():
        side = winograd_side(min(totals, key=totals.get))
        if side is not None:
            data, weight, padding = key
            choices.append(
                {
                    "convolutions": names[key],
                    "side": side,
                    "signature": [list(data), list(weight), list(padding)],
                }
            )
    return choices


def conv_candidates(packings: list[str], int8_block: int | None = None) -> Candidates:
    """Plain, and each packing whose block divides the output channels (depthwise:
    one input channel per output channel; other grouped convolutions stay plain).

    An INT8 convolution (uint8 x int8, groups 1) is packed only for the CPU's dot
    product (``int8_block``, its int32 lanes): in the packing of that block, when it
    divides both channel counts (:func:`edgecv.lowering.legalize.conv2d_int8_nchwc`);
    any other integer convolution stays plain."""

    def candidates(call: relax.Call) -> tuple[str, ...]:
        data, weight = call.args[0].ty, call.args[1].ty
        channels, outputs = int(data.shape[1]), int(weight.shape[0])
        groups = int(call.attrs.groups)
        if str(data.dtype) == "uint8" and str(weight.dtype) == "int8" and groups == 1:
            if not int8_block or channels % int8_block or outputs % int8_block:
                return (plain(4),)
            return (plain(4), *(p for p in packings if block_of(p) == int8_block))
        # float32 weights: a float32 convolution, or an INT8 one computed in float32
        # arithmetic on its integer input (edgecv.lowering.quantize)
        if str(weight.dtype) != "float32" or (groups > 1 and not groups == channels == outputs):
            return (plain(4),)
        return (plain(4), *(p for p in packings if outputs % block_of(p) == 0))

    return candidates


def choose_layouts(
    mod: tvm.IRModule,
    profile: Profile,
    options,
    progress: Progress = lambda message: None,
    dot: DotProduct | None = None,
) -> tuple[tvm.IRModule, dict]:
    """``mod`` with its convolutions in the layouts ``options.layout`` asks for, and the
    manifest's record of what was chosen (see the module docstring). ``dot``: the dot
    product an INT8 build's uint8 x int8 convolutions run on (the CPU pipeline's
    decision), packed for its lanes; None leaves them plain."""
    mode = options.layout
    if mode not in LAYOUT_MODES:
        raise EdgecvError(f"--layout must be one of {', '.join(LAYOUT_MODES)}, not {mode!r}")
    if mode == "NCHW":
        return mod, {"mode": mode, "chosen": "NCHW"}
    packings = packings_for(profile)
    if not packings:
        reason = f"no packed convolution rule for {profile.runtime} targets"
        return mod, {"mode": mode, "chosen": "NCHW", "reason": reason}
    started = time.perf_counter()
    try:
        converted, facts = _tune(mod, profile, options, packings, mode, progress, dot)
    except Exception as err:  # a tuner that breaks never breaks the deploy
        if mode == "packed":
            raise EdgecvError(f"--layout packed failed: {err}; deploy with --layout NCHW") from err
        reason = f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:300]}"
        warnings.warn(f"graph tuner: {reason}; building in NCHW", stacklevel=2)
        return mod, {"mode": mode, "chosen": "NCHW", "reason": reason}
    facts["seconds"] = round(time.perf_counter() - started, 3)
    return converted, facts


def _tune(mod, profile, options, packings, mode, progress, dot) -> tuple[tvm.IRModule, dict]:
    block = max(block_of(p) for p in packings)
    prepared = relax.transform.FoldConstant()(pad_output_channels(rewrite_activations(mod), block))
    int8_block, int8_pairs = int8_lowering(dot)
    extracted = extract(prepared, conv_candidates(packings, int8_block))
    extracted.int8_block, extracted.int8_pairs = int8_block, int8_pairs
    extracted.fast_exp = fast_exp_for(profile.tvm_target())
    graph = extracted.graph
    facts: dict = {"mode": mode, "packings": packings}
    if all(len(graph.choices(i)) < 2 for i in graph.convs()):
        return mod, {**facts, "chosen": "NCHW", "reason": "no convolution can be packed"}
    if mode == "packed":
        layouts = uniform_plans(graph).get(packings[0], {})
        plan = None
    else:
        from .devices import meter_for

        meter, cache, why_not = meter_for(profile, options)
        if meter is None and cache is None:
            return mod, {**facts, "chosen": "NCHW", "reason": why_not}
        from ..lowering.winograd import SIDES
        from .measure import measure_costs

        # Winograd measured beside direct on every device: the CPU and GPU rules both
        # schedule it (edgecv.schedules.cpu.winograd, edgecv.schedules.gpu.winograd)
        budget = getattr(options, "layout_budget_s", None)
        costs = measure_costs(extracted, packings, meter, cache, progress, SIDES, budget)
        plan = solve(graph, costs)
        layouts = plan.layouts
        facts.update(_plan_facts(graph, plan, costs, packings))
        facts["winograd"] = _winograd_choices(extracted, plan, costs)
    progress(f"graph tuner: {_summary(graph, layouts)}")
    converted = convert_layouts(extracted, layouts)
    found = inserted_transforms(converted)
    facts["chosen"] = "plan" if plan is not None else packings[0]
    facts["inserted_transforms"] = len(found)
    if plan is not None and len(found) != len(plan.transforms):
        facts["model_mismatch"] = (
            f"the plan predicted {len(plan.transforms)} transforms, Relax inserted {len(found)}"
        )
    return converted, facts


def _summary(graph, layouts: dict[int, str]) -> str:
    counts: dict[str, int] = {}
    for layout in layouts.values():
        counts[layout] = counts.get(layout, 0) + 1
    return ", ".join(f"{n} convolutions in {layout}" for layout, n in sorted(counts.items()))


def _plan_facts(graph, plan: LayoutPlan, costs, packings: list[str]) -> dict:
    """What the manifest and ``--explain`` show of a plan."""
    # the uniform plans as `--layout NCHW|packed` build them: direct convolutions
    uniform = {
        name: _finite(evaluate(graph, layouts, _Direct(costs)).total)
        for name, layouts in uniform_plans(graph).items()
    }
    convolutions = []
    for index, layout in sorted(plan.layouts.items()):
        node = graph.nodes[index]
        times = {c: _finite(costs.kernel(node, c)) for c in graph.choices(index)}
        # per candidate layout timed by several algorithms, each algorithm's time
        algorithms = {
            c: {a: _finite(t) for a, t in costs.algorithms[(node.name, c)].items()}
            for c in graph.choices(index)
            if len(costs.algorithms.get((node.name, c), {})) > 1
        }
        # where each candidate's time came from (its fastest algorithm's)
        origins = {
            c: costs.origins.get((node.name, c, _fastest(costs, node.name, c)), "")
            for c in graph.choices(index)
        }
        convolutions.append(
            {
                "name": node.name,
                "op": node.op,
                "shape": list(node.shape),
                "layout": layout,
                "seconds": times,
                "sources": origins,
                **({"algorithms": algorithms} if algorithms else {}),
            }
        )
    transforms = [
        {
            "producer": graph.nodes[t.producer].name,
            "consumer": graph.nodes[t.consumer].name,
            "shape": list(t.shape),
            "src": t.src,
            "dst": t.dst,
            "seconds": _finite(t.seconds),
        }
        for t in plan.transforms
    ]
    return {
        "solver": plan.solver,
        "states": plan.states,
        "predicted_s": _finite(plan.total),
        "uniform_predicted_s": uniform,
        "costs": dict(costs.sources),
        "convolutions": convolutions,
        "transforms": transforms,
    }


def _fastest(costs, name: str, layout: str) -> str:
    times = costs.algorithms.get((name, layout), {})
    return min(times, key=times.get) if times else DIRECT


class _Direct:
    """The costs of the direct convolutions only (what `--layout packed` builds)."""

    def __init__(self, costs):
        self.costs = costs

    def kernel(self, node, layout: str) -> float:
        times = self.costs.algorithms.get((node.name, layout), {})
        return times.get(DIRECT, self.costs.kernel(node, layout))

    def transform(self, shape, src: str, dst: str) -> float:
        return self.costs.transform(shape, src, dst)


def _finite(seconds: float) -> float | None:
    return round(seconds, 7) if seconds != float("inf") else None
