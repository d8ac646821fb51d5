"""Run one PrimFunc on the CPU (LLVM) or an OpenCL device: arguments in, arrays out.

``arrays`` holds every parameter in order, outputs included (their contents are the
starting values); the run returns all of them afterwards. Built kernels are cached per
(function, device) for the test session.
"""

from __future__ import annotations

import numpy as np
import tvm

from edgecv.codegen.opencl import build_opencl
from edgecv.profiles import load_profile

_CPU: dict = {}
_OPENCL: dict = {}


def run_cpu(func, arrays: list[np.ndarray]) -> list[np.ndarray]:
    key = func.script()
    if key not in _CPU:
        func = func.with_attr("global_symbol", "main")
        _CPU[key] = tvm.tirx.build(
            tvm.IRModule({"main": func}), target=tvm.target.Target({"kind": "llvm"}), pipeline=None
        )
    tensors = [tvm.runtime.tensor(a) for a in arrays]
    _CPU[key]["main"](*tensors)
    return [t.numpy() for t in tensors]


def run_opencl(
    func, arrays: list[np.ndarray], device: str = "intel", profile: str = "aisage"
) -> list[np.ndarray]:
    from edgecv.board.runtime.opencl import OpenCLBackend

    key = (func.script(), device, profile)
    if key not in _OPENCL:
        prof = load_profile(profile)
        kernels = build_opencl(
            tvm.IRModule({"main": func}), prof.tvm_target(), prof.intel_subgroup_size
        )
        assert not kernels.unsupported, kernels.unsupported
        _OPENCL[key] = OpenCLBackend(device, kernels.source, kernels.launches, kernels.requires)
    backend = _OPENCL[key]
    tensors = []
    for array in arrays:
        tensor = backend.view(backend.alloc(max(array.nbytes, 4)), array.shape, str(array.dtype))
        backend.upload(tensor, array)
        tensors.append(tensor)
    backend.bind("main", tensors)()
    backend.synchronize()
    return [backend.download(t) for t in tensors]
