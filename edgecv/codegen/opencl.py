"""OpenCL C for a model: one program holding every kernel, plus its launch lists.

The lowering is shared with CUDA (:mod:`.gpu_lowering`); this module runs TVM's OpenCL
code generator over the device functions and records what the program needs from a
device (:func:`required_extensions`), so a runtime can refuse a device that lacks it
before compiling anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import tvm

from ..board.plan import Launch
from ..schedules.orders import gpu_order
from ..schedules.stage import KernelChoice, ScheduleOrder
from .gpu_lowering import device_module, lower_device

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
    return _finished(source, subgroup_kernels, subgroup)


def _finished(
    source: str, subgroup_kernels: list[str], subgroup: int | None
) -> tuple[str, list[str]]:
    """TVM's OpenCL C as a program: the subgroup sizes fixed, and the extensions it
    needs."""
    # TVM widens work-item ids with convert_long(), a call Intel's vectorizer does not
    # look through (every access becomes a gather); a C cast means the same to it
    source = source.replace("convert_long(get_", "((long)get_")
    source = require_subgroup_size(source, subgroup_kernels, subgroup)
    return source, required_extensions(source)


def program_of(
    facts: list[dict], target: tvm.target.Target, subgroup: int | None
) -> tuple[str, list[str]]:
    """The OpenCL program (source, extensions it needs) of kernels compiled by
    :func:`~.gpu_lowering.lower_to_file` (their facts): joined from their own code
    (:func:`join_opencl`), else generated from their device functions."""
    if not facts:
        return "", []
    subgroups = sorted(k for f in facts for k in f["subgroup_kernels"])
    if all("source" in f for f in facts):
        texts = [Path(f["source"]).read_text() for f in facts]
        joined = join_opencl(texts, subgroups, subgroup)
        if joined is not None:
            return joined
    return generate_opencl(device_module([f["device"] for f in facts]), target, subgroups, subgroup)


def join_opencl(
    sources: list[str], subgroup_kernels: list[str], subgroup: int | None
) -> tuple[str, list[str]] | None:
    """One program from kernels' own OpenCL C, as :func:`generate_opencl` makes it from
    their device functions together, without loading and generating them again (the
    kernels' code was generated where each was compiled, :func:`~.gpu_lowering.lower_to_file`:
    for the graph tuner's 179 candidates of SSD-512 ResNet-50, loading their device
    functions and generating the program took 42 s). Each kernel's header (extension
    pragmas) comes once, at the top. ``None`` when a header holds more than preprocessor
    groups and declarations: then generate it from the device functions."""
    groups: dict[str, None] = {}
    bodies = []
    for text in sources:
        lines = text.splitlines()
        first = next((i for i, line in enumerate(lines) if line.startswith("__kernel")), len(lines))
        header = _header_groups([line for line in lines[:first] if not line.startswith("//")])
        if header is None:
            return None
        groups.update(dict.fromkeys(header))
        bodies.append("\n".join(lines[first:]))
    return _finished("\n".join([*groups, *bodies]) + "\n", subgroup_kernels, subgroup)


def _header_groups(lines: list[str]) -> list[str] | None:
    """A kernel's header as its preprocessor groups (``#if`` to ``#endif``, or one
    directive) and one-line declarations; ``None`` for anything else."""
    groups, current, depth = [], [], 0
    for line in lines:
        text = line.strip()
        if not text:
            continue
        if not text.startswith("#") and not (depth and text) and not text.endswith(";"):
            return None
        current.append(line)
        if text.startswith(("#if", "#ifdef", "#ifndef")):
            depth += 1
        elif text.startswith("#endif"):
            depth -= 1
        if depth == 0:
            groups.append("\n".join(current))
            current = []
    return None if depth or current else groups


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
    "join_opencl",
    "program_of",
    "generate_opencl",
    "require_subgroup_size",
    "required_extensions",
]
