"""One pipeline per target kind: the place to read what runs, in order.

=========  =====================================================================
``cpu``    :mod:`.cpu`: passes -> schedule + LLVM code per kernel -> link
``opencl`` :mod:`.opencl`: passes -> placement -> schedule + lowering per kernel ->
           OpenCL C -> compile on a local device -> placement (fallback) -> copies ->
           CPU fallback kernels
``cuda``   :mod:`.cuda`: as OpenCL, with CUDA C++ and nvcc, no local device check
=========  =====================================================================

Each ``build(mod, profile, options, progress)`` returns a :class:`~.steps.Built`: the
plan, the constants, the facts for the manifest and how to write the kernels into a
package. The deploy command (:mod:`edgecv.deploy`) resolves the model before and writes
the package after; nothing here calls back into it.
"""

from __future__ import annotations

from types import ModuleType

from .steps import BuildOptions, Built


def pipeline_for(runtime: str) -> ModuleType:
    """The pipeline module of a profile's runtime (``cpu``, ``opencl``, ``cuda``)."""
    from . import cpu, cuda, opencl

    return {"cpu": cpu, "opencl": opencl, "cuda": cuda}[runtime]


__all__ = ["BuildOptions", "Built", "pipeline_for"]
