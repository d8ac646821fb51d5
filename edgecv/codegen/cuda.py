"""CUDA for a model: TVM's CUDA C++ for every kernel, compiled here with nvcc.

The lowering and the launch lists are shared with OpenCL (:mod:`.gpu_lowering`). The source is
compiled to a cubin for the profile's architecture (``sm_87``) plus PTX for its
virtual architecture (``compute_87``), which newer GPUs' drivers JIT-compile. When the
nvcc on the deploying machine cannot target the architecture (nvcc 13 dropped
Maxwell, so no ``sm_53`` for the Jetson Nano) the package carries the source alone and
the runtime compiles it on the device, with that device's nvcc; the manifest says so.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import tvm

from ..errors import EdgecvError
from ..package_format import Launch
from ..schedules.stage import KernelChoice, ScheduleOrder
from .gpu_lowering import lower_device

# Warnings TVM's generated code always triggers (unused CSE temporaries): not news.
NVCC_FLAGS = ("-O3", "-std=c++17", "-diag-suppress", "177,550")


class CudaCompileError(EdgecvError):
    """nvcc rejected the generated source."""


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


def find_nvcc() -> str | None:
    return shutil.which("nvcc")


@functools.cache
def nvcc_architectures(nvcc: str) -> frozenset[str]:
    """The virtual architectures (``compute_75``...) this nvcc can compile for."""
    out = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, check=False)
    return frozenset(re.findall(r"compute_\d+[a-z]?", out.stdout))


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False)
    found = re.search(r"release ([\d.]+)", out.stdout)
    return found.group(1) if found else "unknown"


def compile_source(source: str, arch: str, kind: str, nvcc: str | None = None) -> bytes:
    """nvcc ``source`` to a ``cubin`` (for ``arch``) or ``ptx`` (its virtual arch)."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise CudaCompileError("nvcc is not on PATH; install the CUDA toolkit to compile CUDA")
    number = arch.removeprefix("sm_")
    arch_flag = f"-arch=sm_{number}" if kind == "cubin" else f"-arch=compute_{number}"
    with tempfile.TemporaryDirectory(prefix="edgecv-nvcc-") as tmp:
        src, out = Path(tmp) / "kernels.cu", Path(tmp) / f"kernels.{kind}"
        src.write_text(source)
        done = subprocess.run(
            [nvcc, f"--{kind}", arch_flag, *NVCC_FLAGS, "-o", str(out), str(src)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise CudaCompileError(
                f"nvcc failed to compile the CUDA kernels for {arch} "
                f"({_failing_kernels(source, done.stderr)}):\n{done.stderr.strip()[-3000:]}"
            )
        return out.read_bytes()


def _failing_kernels(source: str, log: str) -> str:
    """Kernel names holding the lines nvcc complains about (``kernels.cu(123): error``)."""
    lines = source.splitlines()
    names = []
    for number in sorted({int(n) for n in re.findall(r"\.cu\((\d+)\): error", log)}):
        for text in reversed(lines[:number]):
            found = re.search(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", text)
            if found:
                names.append(found.group(1))
                break
    return "kernel " + ", ".join(dict.fromkeys(names)) if names else "see the log"


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
        from ..pipelines.orders import gpu_order

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
