"""Where an inference's time goes: per-launch times of a loaded package, by kernel.

OpenCL packages are timed by the device itself (OpenCL event profiling: start and
end of each kernel on the device); CPU launches are synchronous, so each is timed on
the host around its call; device copies are timed the same way.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np


@dataclass
class KernelTime:
    """Total time of one plan kernel (all its launches) per inference."""

    kernel: str
    device: str
    seconds: float
    launches: int
    ops: list[str] = field(default_factory=list)
    how: str = "host timer"


def profile_steps(model, x: np.ndarray, repeat: int = 5) -> list[KernelTime]:
    """Median per-inference time of each plan kernel over ``repeat`` profiled runs.

    Parameters
    ----------
    model : DeployedModel
        A loaded package (``edgecv.load``).
    x : ndarray
        One input tensor.
    repeat : int
        Profiled inferences (after the caller's warm-up).

    Returns
    -------
    list of KernelTime
        Sorted by time, largest first.
    """
    kernel_ops = model.manifest.kernel_ops
    with model.executor.context() as context:  # no other call runs in it meanwhile
        runs, counts = _profile_in(context, x, repeat)
    keys = {k for r in runs for k in r}
    event_based = _event_based(context.backends.get("gpu"))
    result = [
        KernelTime(
            kernel=name,
            device=device,
            seconds=float(np.median([r.get((name, device), 0.0) for r in runs])),
            launches=counts[(name, device)],
            ops=list(kernel_ops.get(name, [])),
            how="OpenCL events" if device == "gpu" and event_based else "host timer",
        )
        for name, device in keys
    ]
    return sorted(result, key=lambda k: -k.seconds)


def _event_based(gpu) -> bool:
    return gpu is not None and hasattr(gpu, "start_profiling")


def _profile_in(context, x: np.ndarray, repeat: int) -> tuple[list[dict], dict]:
    """Per-kernel seconds of each of ``repeat`` runs in ``context``, and launch counts."""
    gpu = context.backends.get("gpu")  # the context's stream: its queue is profiled
    event_based = _event_based(gpu)
    runs: list[dict[tuple[str, str], float]] = []
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for i in range(max(repeat, 1)):
        spent: dict[tuple[str, str], float] = defaultdict(float)
        context.run([x])  # inputs in place; then the launches one by one
        if event_based:
            gpu.start_profiling()
        for step, launch in zip(context.steps, context.launches, strict=True):
            name = step.kernel if step.kind == "kernel" else "device copy"
            device = step.device if step.kind == "kernel" else "copy"
            start = time.perf_counter()
            launch()
            if device == "gpu" and not event_based:  # e.g. CUDA: wait for the launch
                gpu.synchronize()
            if device != "gpu" or not event_based:  # else timed by their events below
                spent[(name, device)] += time.perf_counter() - start
            if i == 0:
                counts[(name, device)] += 1
        if event_based:
            for kernel, _, seconds in gpu.stop_profiling():
                spent[(kernel, "gpu")] += seconds
        runs.append(spent)
    return runs, counts
