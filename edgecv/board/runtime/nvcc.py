"""nvcc, as both sides run it: the workstation compiling a package's CUDA kernels, and a
Jetson compiling the source a package ships for an architecture the workstation's nvcc
no longer targets (nvcc 13 dropped Maxwell's sm_53), with the board's own nvcc."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..errors import EdgecvError

# Warnings TVM's generated code always triggers (unused CSE temporaries): not news.
NVCC_FLAGS = ("-O3", "-std=c++17", "-diag-suppress", "177,550")


class CudaCompileError(EdgecvError):
    """nvcc rejected the generated source."""


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
