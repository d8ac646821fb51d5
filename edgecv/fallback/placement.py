"""Pass 1: tag every launch of a plan GPU or CPU, each CPU tag with its reason.

A launch is one fused kernel (``conv2d + multiply + add + relu`` run as one), so it is
placed as a whole: it runs on the GPU when every operator fused into it is on the
device profile's GPU list and nothing else sends it to the CPU. The reasons, in the
order they are checked (the first that applies is reported):

``forced``          the user named one of its operators in ``--cpu-ops``
``not-on-gpu-list`` an operator is missing from the profile's ``gpu_ops`` (data in
                    ``device_profiles/*.json``, not code)
``no-gpu-kernel``   edgecv cannot lower it for the GPU (host code that sorts, ...)
``gpu-build-failed`` the device's compiler rejected its kernel (found by compiling on a
                    local device at deploy time; the package is then rebuilt)
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..board.errors import EdgecvError
from ..board.plan import Plan

REASONS = {
    "forced": "forced onto the CPU by --cpu-ops",
    "not-on-gpu-list": "operator not on the profile's GPU list",
    "no-gpu-kernel": "no GPU implementation",
    "gpu-build-failed": "its GPU kernel failed to compile on the device",
}


@dataclass
class CpuNode:
    """One launch placed on the CPU, and why."""

    step: int
    kernel: str
    ops: list[str]
    reason: str  # a key of REASONS
    detail: str = ""

    def describe(self) -> str:
        text = f"{self.kernel} ({', '.join(self.ops)}): {REASONS[self.reason]}"
        return f"{text} [{self.detail}]" if self.detail else text


@dataclass
class Placement:
    devices: list[str]  # per step: "gpu" | "cpu"
    cpu_nodes: list[CpuNode] = field(default_factory=list)

    def on(self, device: str) -> int:
        return sum(d == device for d in self.devices)


class GpuOnlyError(EdgecvError):
    """``--gpu-only`` was asked for and some launches cannot run on the GPU."""


def place(
    plan: Plan,
    kernel_ops: dict[str, list[str]],
    gpu_ops: str | Iterable[str],
    no_gpu_kernel: dict[str, str] | None = None,
    gpu_build_failed: dict[str, str] | None = None,
    cpu_ops: Iterable[str] = (),
    gpu_only: bool = False,
) -> Placement:
    """Tag each step of ``plan``; see the module docstring for the rules.

    ``gpu_ops`` is ``"all"`` or the operator names the profile allows on the GPU;
    ``no_gpu_kernel`` / ``gpu_build_failed`` map kernel names to the reason detail.
    """
    allowed = None if gpu_ops == "all" else set(gpu_ops)
    forced = set(cpu_ops)
    present = {op for step in plan.steps for op in kernel_ops.get(step.kernel, [step.kernel])}
    if forced - present:  # a typo, or an MXNet name (`Pooling`) for a fused operator's
        warnings.warn(
            f"--cpu-ops: {', '.join(f'`{op}`' for op in sorted(forced - present))} names no "
            f"operator of this model, so it moves nothing to the CPU; its operators: "
            f"{', '.join(sorted(present))} (the names `deploy --explain` prints)",
            stacklevel=2,
        )
    no_gpu_kernel = no_gpu_kernel or {}
    gpu_build_failed = gpu_build_failed or {}
    placement = Placement([])
    for index, step in enumerate(plan.steps):
        ops = kernel_ops.get(step.kernel, [step.kernel])
        reason, detail = None, ""
        if forced & set(ops):
            reason, detail = "forced", ", ".join(sorted(forced & set(ops)))
        elif allowed is not None and not set(ops) <= allowed:
            reason, detail = "not-on-gpu-list", ", ".join(sorted(set(ops) - allowed))
        elif step.kernel in no_gpu_kernel:
            reason, detail = "no-gpu-kernel", no_gpu_kernel[step.kernel][:160]
        elif step.kernel in gpu_build_failed:
            reason, detail = "gpu-build-failed", gpu_build_failed[step.kernel][:160]
        placement.devices.append("gpu" if reason is None else "cpu")
        if reason is not None:
            placement.cpu_nodes.append(CpuNode(index, step.kernel, ops, reason, detail))
    if gpu_only and placement.cpu_nodes:
        listed = "\n  ".join(node.describe() for node in placement.cpu_nodes)
        raise GpuOnlyError(
            f"--gpu-only: {len(placement.cpu_nodes)} launch(es) cannot run on the GPU:\n  {listed}"
            "\nDrop --gpu-only to run them on the CPU, or deploy for a profile that has them."
        )
    return placement
