"""OpenCL C for a model: one program holding every kernel, plus its launch lists.

The lowering is shared with CUDA (:mod:`.gpu_lowering`); this module runs TVM's OpenCL
code generator over the device functions and records what the program needs from a
device (:func:`required_extensions`), so a runtime can refuse a device that lacks it
before compiling anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import tvm

from ..package_format import Launch
from ..schedules.orders import gpu_order
from ..schedules.stage import KernelChoice, ScheduleOrder
from .gpu_lowering import lower_device

# OpenCL C identifiers that need a device extension, and the extension.
_EXTENSION_USES = {
    "cl_intel_subgroups": re.compile(r"\bintel_sub_group_\w+|\bintel_reqd_sub_group_size\b"),
    "cl_khr_subgroups": re.compile(r"\b(sub_group_\w+|get_sub_group_\w+)\s*\("),
    "cl_khr_fp16": re.compile(r"\bhalf\d*\b"),
    "cl_khr_fp64": re.compile(r"\bdouble\d*\b"),
}


@dataclass
class OpenCLKernels:
    source: str
    launches: dict[str, list[Launch]] = field(default_factory=dict)
    unsupported: dict[str, str] = field(default_factory=dict)  # PrimFunc -> why not
    requires: list[str] = field(default_factory=list)  # device extensions the source uses
    choices: dict[str, KernelChoice] = field(default_factory=dict)


def required_extensions(source: str) -> list[str]:
    """Device extensions the OpenCL C ``source`` uses (Intel subgroups imply khr ones)."""
    found = {ext for ext, pattern in _EXTENSION_USES.items() if pattern.search(source)}
    if "cl_intel_subgroups" in found:
        found.discard("cl_khr_subgroups")  # intel's extension provides the khr builtins too
    return sorted(found)


def require_subgroup_size(source: str, kernels: list[str], size: int | None) -> str:
    """Give each kernel in ``kernels`` the attribute fixing its subgroup size to ``size``
    (``intel_reqd_sub_group_size``: the variants unroll over it)."""
    if kernels and size is None:
        raise ValueError(
            f"kernels {', '.join(kernels)} use subgroups: build them with the device's "
            "subgroup size (build_opencl(..., subgroup=N))"
        )
    for name in kernels:
        pattern = re.compile(rf"__kernel\s+void\s+{re.escape(name)}\s*\(")
        if not pattern.search(source):  # declared and defined: both get the attribute
            raise RuntimeError(f"kernel {name} is not in the OpenCL source")
        attribute = f"__kernel __attribute__((intel_reqd_sub_group_size({int(size)}))) void {name}("
        source = pattern.sub(attribute, source)
    return source


def generate_opencl(
    device_mod: tvm.IRModule,
    target: tvm.target.Target,
    subgroup_kernels: list[str],
    subgroup: int | None,
) -> tuple[str, list[str]]:
    """OpenCL C for the device functions, with ``subgroup_kernels`` compiled for the
    subgroup size ``subgroup``; returns the source and the extensions it needs."""
    if not device_mod.functions:
        return "", []
    source = tvm.get_global_func("target.build.opencl")(device_mod, target).inspect_source()
    # TVM widens work-item ids with convert_long(), a call Intel's vectorizer does not
    # look through (every access becomes a gather); a C cast means the same to it
    source = source.replace("convert_long(get_", "((long)get_")
    source = require_subgroup_size(source, subgroup_kernels, subgroup)
    return source, required_extensions(source)


def build_opencl(
    kernels: tvm.IRModule,
    target: tvm.target.Target,
    subgroup: int | None = None,
    order: ScheduleOrder | None = None,
) -> OpenCLKernels:
    """Schedule, lower and generate OpenCL for every kernel that supports it, in this
    process (tests and benchmarks; ``edgecv deploy`` runs :mod:`edgecv.pipelines.opencl`).

    ``subgroup``: the device's Intel subgroup size; kernels that call subgroup builtins
    are compiled for exactly that size. ``order``: the schedule candidates (default:
    edgecv's GPU rules for ``target``, no tuning database).
    """
    if order is None:
        order = gpu_order(target, subgroup)
    lowered = lower_device(kernels, order)
    text, requires = generate_opencl(lowered.device_mod, target, lowered.subgroup_kernels, subgroup)
    return OpenCLKernels(text, lowered.launches, lowered.unsupported, requires, lowered.choices)


__all__ = [
    "OpenCLKernels",
    "build_opencl",
    "generate_opencl",
    "require_subgroup_size",
    "required_extensions",
]
