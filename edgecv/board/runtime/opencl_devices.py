"""Finding OpenCL devices, including the CPU runtimes installed from PyPI, with no setup.

Two OpenCL runtimes install with pip and stand in for integrated GPUs on machines
without one: Intel's CPU runtime (``intel-opencl-rt``, with Intel subgroups) and
PoCL (``pocl-binary-distribution``, bundled with pyopencl's ICD loader, found as is).
Intel's package ships an ``.icd`` file naming a path from its build machine, so the
loader never finds it; :func:`register_pip_runtimes` writes a correct one into a
cache folder and points the loader at it (``OCL_ICD_VENDORS``) before the first
platform query. A user who set ``OCL_ICD_VENDORS`` keeps their own setting.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ..durable import write_bytes

_REGISTERED = False


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "edgecv" / "icd"


def _intel_runtime() -> Path | None:
    """``libintelocl.so`` of the Intel CPU runtime in this Python environment, if any."""
    for lib in (Path(sys.prefix) / "lib").glob("libintelocl.so*"):
        if lib.suffix not in (".py", ".pyc") and lib.is_file():
            return lib.resolve()
    return None


def register_pip_runtimes() -> None:
    """Make pip-installed OpenCL runtimes visible to the ICD loader (idempotent)."""
    global _REGISTERED
    if _REGISTERED or "OCL_ICD_VENDORS" in os.environ:
        _REGISTERED = True
        return
    intel = _intel_runtime()
    if intel is not None:
        folder = _cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        icd = folder / "intel-cpu.icd"
        if not icd.is_file() or icd.read_text().strip() != str(intel):
            # replaced whole, never rewritten in place: another process starting now
            # reads the old file or the new one, never an empty one
            write_bytes(icd, f"{intel}\n".encode())
        os.environ["OCL_ICD_VENDORS"] = str(folder)
    _REGISTERED = True


@dataclass(frozen=True)
class OpenCLDevice:
    """What edgecv needs to know of one OpenCL device."""

    platform: str
    vendor: str
    name: str
    version: str
    intel_subgroups: bool
    compute_units: int
    global_memory_bytes: int
    local_memory_bytes: int
    max_work_group_size: int
    fp16: bool = False  # cl_khr_fp16: float16 arithmetic (an fp16 package needs it)

    @property
    def label(self) -> str:
        return f"{self.platform} / {self.name}"

    def matches(self, query: str) -> bool:
        """Case-insensitive match of ``query`` against platform, vendor and device names."""
        return query.lower() in f"{self.platform} / {self.vendor} / {self.name}".lower()


def opencl_devices() -> list[OpenCLDevice]:
    """Every OpenCL device on this machine (empty when there is no platform)."""
    register_pip_runtimes()
    import pyopencl as cl

    try:
        platforms = cl.get_platforms()
    except cl.Error:  # "no platforms": the ICD loader found no runtime
        return []
    found = []
    for platform in platforms:
        for dev in platform.get_devices():
            found.append(
                OpenCLDevice(
                    platform=platform.name.strip(),
                    vendor=platform.vendor.strip(),
                    name=dev.name.strip(),
                    version=dev.version.strip(),
                    intel_subgroups="cl_intel_subgroups" in dev.extensions,
                    compute_units=int(dev.max_compute_units),
                    global_memory_bytes=int(dev.global_mem_size),
                    local_memory_bytes=int(dev.local_mem_size),
                    max_work_group_size=int(dev.max_work_group_size),
                    fp16="cl_khr_fp16" in dev.extensions,
                )
            )
    return found
