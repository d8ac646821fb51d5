"""CUDA for a model: TVM's CUDA C++ for every kernel, compiled here with nvcc.

The lowering and the launch lists are shared with OpenCL (:mod:`.gpu_lowering`). The source is
compiled to a cubin for the profile's architecture (``sm_87``) plus PTX for its
virtual architecture (``compute_87``), which newer GPUs' drivers JIT-compile. When the
nvcc on the deploying machine cannot target the architecture (nvcc 13 dropped
Maxwell, so no ``sm_53`` for the Jetson Nano) the package carries the source alone and
the runtime compiles it on the device, with that device's nvcc; the manifest says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm

from ..board.plan import Launch
from ..board.runtime.nvcc import (
    CudaCompileError,
    compile_source,
    find_nvcc,
    nvcc_architectures,
    nvcc_version,
)
from ..schedules.orders import gpu_order
from ..schedules.stage import KernelChoice, ScheduleOrder
from .gpu_lowering import lower_device


@dataclass
class CudaKernels:
    source: str
    arch: str  # "sm_87"
    launches: dict[str, list[Launch]] = field(default_factory=dict)
    unsupported: dict[str, str] = field(default_factory=dict)
    cubin: bytes | None = None
    ptx: str | None = None
    not_compiled_because: str | None = None  # set when only the source ships
    choices: dict[str, KernelChoice] = field(default_factory=dict)


def generate_cuda(
    device_mod: tvm.IRModule, target: tvm.target.Target, compile_binaries: bool = True
) -> CudaKernels:
    """CUDA C++ for the device functions, compiled when this nvcc supports the arch."""
    arch = str(target.attrs.get("arch", "sm_75"))
    source = tvm.get_global_func("target.build.cuda")(device_mod, target).inspect_source()
    result = CudaKernels(source, arch)
    if not compile_binaries:
        result.not_compiled_because = "compilation was not asked for"
        return result
    nvcc = find_nvcc()
    virtual = "compute_" + arch.removeprefix("sm_")
    if nvcc is None:
        result.not_compiled_because = "no nvcc on the deploying machine"
    elif virtual not in nvcc_architectures(nvcc):
        result.not_compiled_because = (
            f"nvcc {nvcc_version(nvcc)} on the deploying machine does not support {arch} "
            f"(it supports {', '.join(sorted(nvcc_architectures(nvcc)))})"
        )
    else:
        result.cubin = compile_source(result.source, arch, "cubin", nvcc)
        result.ptx = compile_source(result.source, arch, "ptx", nvcc).decode()
    return result


def build_cuda(
    kernels: tvm.IRModule,
    target: tvm.target.Target,
    compile_binaries: bool = True,
    order: ScheduleOrder | None = None,
) -> CudaKernels:
    """Schedule and lower every kernel in this process, generate CUDA, and compile it
    when this nvcc supports the arch (tests; deploy runs :mod:`edgecv.pipelines.cuda`)."""
    if order is None:
        order = gpu_order(target, None)
    lowered = lower_device(kernels, order)
    result = generate_cuda(lowered.device_mod, target, compile_binaries)
    result.launches, result.unsupported = lowered.launches, lowered.unsupported
    result.choices = lowered.choices
    return result


__all__ = [
    "CudaCompileError",
    "CudaKernels",
    "build_cuda",
    "compile_source",
    "generate_cuda",
    "find_nvcc",
]
