"""OpenCL C for a model: one program holding every kernel, plus its launch lists.

The lowering is shared with CUDA (:mod:`.gpu`); this module runs TVM's OpenCL code
generator over the device functions and records what the program needs from a device
(:func:`required_extensions`), so a runtime can refuse a device that lacks it before
compiling anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import tvm

from .gpu import Launch, launches_from_json, launches_to_json, lower_device

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


def build_opencl(
    kernels: tvm.IRModule, target: tvm.target.Target, subgroup: int | None = None
) -> OpenCLKernels:
    """Schedule, lower and generate OpenCL for every kernel that supports it.

    ``subgroup``: the device's Intel subgroup size (profiles with ``intel_subgroups``);
    edgecv's operators then use their subgroup variants, whose kernels are compiled for
    exactly that size.
    """
    lowered = lower_device(kernels, target, subgroup)
    source = tvm.get_global_func("target.build.opencl")(lowered.device_mod, target)
    text = source.inspect_source()
    text = require_subgroup_size(text, lowered.subgroup_kernels, subgroup)
    return OpenCLKernels(text, lowered.launches, lowered.unsupported, required_extensions(text))


__all__ = [
    "Launch",
    "OpenCLKernels",
    "build_opencl",
    "launches_from_json",
    "launches_to_json",
    "require_subgroup_size",
    "required_extensions",
]
