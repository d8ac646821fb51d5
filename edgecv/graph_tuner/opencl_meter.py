"""The OpenCL meter: kernels scheduled and lowered as an OpenCL deploy does them, built
into one program on the profile's device here, and timed by OpenCL event profiling
(device time of each launch, the sum over a kernel's launches), in rounds as the CPU
meter does (:mod:`.measure`)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from tvm import tirx

from ..board.errors import EdgecvError
from ..codegen.contained import compile_contained
from ..codegen.gpu_lowering import lower_to_file
from ..codegen.opencl import program_of
from ..profiles import Profile
from ..schedules.database import TuningDatabase
from ..schedules.orders import gpu_order
from .costs import work_folder
from .measure import ROUNDS, Progress, memory_groups


def opencl_meter(profile: Profile, options, database: TuningDatabase | None):
    """(meter, why not): the meter is None when no device of the profile's kind is here."""
    from ..board.runtime.opencl_devices import opencl_devices
    from ..board.runtime.opencl_program import is_simulator

    named = getattr(options, "check_on", None)
    # the device the build is checked on when one is named (`tune --on pocl`), else the
    # profile's default: layout costs measured where the kernels will be timed and run
    query = named if named not in (None, "auto") else profile.default_opencl_device
    found = [d for d in opencl_devices() if d.matches(query) and not is_simulator(d.platform)]
    if not found:
        return None, f"no OpenCL device matching `{query or 'any'}` here to time kernels on"
    device = found[0]
    target = profile.tvm_target()
    order = gpu_order(target, profile.intel_subgroup_size, database)
    return OpenCLMeter(profile, target, order, device, options), ""


class OpenCLMeter:
    """Times GPU kernels on a local OpenCL device (see the module docstring)."""

    def __init__(self, profile: Profile, target, order, device, options):
        self.profile = profile
        self.target = target
        self.order = order
        self.database = order.database
        self.query = device.platform  # device names repeat across CPU runtimes
        self.time_limit_s = options.kernel_time_limit_s
        self.workers = options.workers
        self.device_key = (
            f"opencl:{target.attrs.get('device', 'generic')}:sg{profile.intel_subgroup_size or 0}"
            f":{device.platform}:{device.name}:{device.version}"
        )
        self.costs_key = self.device_key

    def time(self, kernels: dict[str, tirx.PrimFunc], progress: Progress) -> dict[str, float]:
        from ..board.runtime.opencl import OpenCLBackend

        names = {key: f"k{i}" for i, key in enumerate(kernels)}
        times = dict.fromkeys(kernels, math.inf)
        with work_folder("edgecv-layout-costs-") as work:
            compiled = compile_contained(
                {names[key]: f for key, f in kernels.items()},
                self.order,
                lower_to_file(self.target),
                Path(work),
                time_limit_s=self.time_limit_s,
                workers=self.workers,
            )
            ok = [key for key in kernels if compiled[names[key]].facts]
            launches = {names[key]: compiled[names[key]].facts["launches"] for key in ok}
            source, requires = program_of(
                [compiled[names[key]].facts for key in ok],
                self.target,
                self.profile.intel_subgroup_size,
            )
        if not ok:
            return times
        progress(f"graph tuner: building {len(ok)} kernels on {self.query}")
        backend = OpenCLBackend(self.query, source, launches, requires)
        compiled, pieces = backend.pieces_compiled
        progress(f"graph tuner: {compiled} of {pieces} compiled ({backend.build_s:.0f} s), timing")
        for group in memory_groups({key: kernels[key] for key in kernels if key in ok}):
            with backend.allocation_scope():  # a group's buffers go when it is timed
                _time_group(backend, {key: (names[key], kernels[key]) for key in group}, times)
        return times


def _time_group(backend, group: dict[str, tuple[str, tirx.PrimFunc]], times: dict) -> None:
    """Time the kernels of ``group`` (key -> name in the program, function) in rounds
    into ``times``; their buffers are released when this returns."""
    runs = {}
    for key, (name, func) in group.items():
        try:
            runs[key] = _bind(backend, name, func)
        except EdgecvError:  # out of device memory: this candidate is not an option
            continue
    for _ in range(ROUNDS):
        for key, run in runs.items():
            backend.start_profiling()
            run()
            seconds = sum(s for _, _, s in backend.stop_profiling())
            times[key] = min(times[key], seconds)


def _bind(backend, name: str, func: tirx.PrimFunc):
    """The kernel bound to random inputs, run once (warm-up)."""
    rng = np.random.default_rng(0)
    tensors = []
    for param in func.params:
        shape = tuple(int(d) for d in param.shape)
        dtype = str(param.dtype)
        tensor = backend.view(
            backend.alloc(int(np.prod(shape)) * np.dtype(dtype).itemsize), shape, dtype
        )
        backend.upload(tensor, rng.uniform(-1, 1, shape).astype(dtype))
        tensors.append(tensor)
    run = backend.bind(name, tensors)
    run()  # warm-up: first-touch pages, the runtime's own compilation
    backend.synchronize()
    return run
