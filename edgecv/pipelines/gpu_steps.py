"""Steps of the GPU pipelines (OpenCL, CUDA): placement, per-kernel schedule and
lowering, the device check, copies, the CPU fallback kernels and the package files."""

from __future__ import annotations

import warnings
from collections.abc import Callable

from ..board.errors import EdgecvError
from ..board.plan import Launch, Plan, launches_to_json
from ..board.precision import Precision
from ..codegen.contained import Compiled
from ..codegen.gpu_lowering import device_module, lower_to_file
from ..codegen.host import check_cross_linker, host_of
from ..fallback import Placement, insert_copies, place
from ..lowering import Lowered
from ..lowering.precision import widen_kernels
from ..profiles import Profile
from ..schedules.orders import gpu_order, tuning_database
from .steps import (
    BuildOptions,
    Progress,
    compile_cpu_kernels,
    compile_kernels,
    schedule_facts,
    subset,
)


def place_launches(
    lowered: Lowered,
    profile: Profile,
    options: BuildOptions,
    no_gpu_kernel: dict[str, str] | None = None,
    gpu_build_failed: dict[str, str] | None = None,
) -> Placement:
    """GPU or CPU for each launch: first from the profile's declared capabilities and
    ``--cpu-ops`` alone, then again with the kernels the GPU could not take."""
    return place(
        lowered.plan,
        lowered.kernel_ops,
        profile.gpu_ops,
        no_gpu_kernel=no_gpu_kernel,
        gpu_build_failed=gpu_build_failed,
        cpu_ops=options.cpu_ops,
        gpu_only=options.gpu_only,
    )


def kernels_on(lowered: Lowered, placement: Placement, device: str) -> set[str]:
    steps = lowered.plan.steps
    return {s.kernel for s, d in zip(steps, placement.devices, strict=True) if d == device}


def schedule_gpu_kernels(
    lowered: Lowered, profile: Profile, options: BuildOptions, progress: Progress
) -> tuple[set[str], dict[str, Compiled], object]:
    """Placement, pass 1 (from the profile's declared capabilities and ``--cpu-ops``),
    then schedule and lower the kernels it puts on the GPU (edgecv's operators in their
    GPU versions), each contained and time-limited. Returns the GPU kernels' names, what
    each compiled to, and the work folder holding it."""
    names = kernels_on(lowered, place_launches(lowered, profile, options), "gpu")
    progress(f"scheduling and lowering {len(names)} kernels for {profile.name}")
    target = profile.tvm_target()
    subgroup = profile.intel_subgroup_size
    kernels = options.op_versions.replace(subset(lowered.kernels, names), target, subgroup)
    order = gpu_order(target, subgroup, tuning_database(options.tuning))
    compiled, work = compile_kernels(
        kernels, order, lower_to_file(target), lowered, options, progress, profile.runtime
    )
    return names, compiled, work


def no_gpu_kernel(compiled: dict[str, Compiled]) -> dict[str, str]:
    """Kernels no GPU candidate could lower, with the last reason."""
    return {
        name: (c.choice.passed_over[-1][1] if c.choice.passed_over else "no rule applies")
        for name, c in compiled.items()
        if c.choice.rule is None
    }


def device_code_of(compiled: dict[str, Compiled], names: set[str]):
    """The device module, launches and subgroup kernels of the kernels ``names``."""
    parts = [compiled[n].facts["device"] for n in sorted(names)]
    launches: dict[str, list[Launch]] = {n: compiled[n].facts["launches"] for n in sorted(names)}
    subgroup_kernels = sorted(k for n in names for k in compiled[n].facts["subgroup_kernels"])
    return device_module(parts), launches, subgroup_kernels


def warn_fallbacks(placement: Placement) -> None:
    for node in placement.cpu_nodes:
        if node.reason in ("gpu-build-failed", "no-gpu-kernel") and node.detail:
            warnings.warn(
                f"{node.kernel} ({', '.join(node.ops)}) runs on the CPU: {node.detail}",
                stacklevel=3,
            )


def check_forced_cpu_link(lowered: Lowered, profile: Profile, options: BuildOptions) -> None:
    """Operators of the model forced onto the CPU (``--cpu-ops``) of a profile whose host
    is another architecture: their library needs the cross linker, so a missing one is
    refused before the GPU kernels compile (minutes on a large model), not at the link."""
    present = {op for ops in lowered.kernel_ops.values() for op in ops}
    if set(options.cpu_ops or ()) & present:
        check_cross_linker(host_of(profile.host_target()))


def copies_and_cpu_kernels(
    lowered: Lowered,
    placement: Placement,
    profile: Profile,
    options: BuildOptions,
    progress: Progress,
    launches: dict[str, list[Launch]],
) -> tuple[Plan, dict, object]:
    """Insert the device copies and the GPU kernels' workspaces (from their
    ``launches``: temp buffers of the memory plan); compile the CPU launches for the
    profile's host CPU (in float32 in a float16 build: the copies convert). Returns the
    plan, the placement facts and how to write the CPU library (or None)."""
    half = options.precision is Precision.FP16
    # every launch of a kernel shares the workspaces of its first (gpu_lowering._read_host)
    workspaces = {name: items[0].workspaces for name, items in launches.items() if items}
    plan, copies = insert_copies(
        lowered.plan, placement, profile.piece_alignments, half, workspaces
    )
    progress(
        f"placement: {placement.on('gpu')} launches on the GPU, {placement.on('cpu')} on the "
        f"CPU, {len(copies)} device copies ({sum(c.nbytes for c in copies):,} bytes per run)"
    )
    host = profile.host_target()
    # the board's CPU, recorded whether or not code runs on it (checked where it does)
    facts = {"placement": placement_facts(plan, placement, copies), "host": host_of(host).to_json()}
    cpu_names = kernels_on(lowered, placement, "cpu")
    write_cpu = None
    if cpu_names:
        progress(f"compiling {len(cpu_names)} CPU fallback kernels for {host.attrs.get('mcpu')}")
        cpu_kernels = subset(lowered.kernels, cpu_names)
        if half:
            cpu_kernels = widen_kernels(cpu_kernels)
        write_cpu, cpu_facts = compile_cpu_kernels(cpu_kernels, host, lowered, options, progress)
        del cpu_facts["host"]
        facts["cpu_schedules"] = cpu_facts
    return plan, facts, write_cpu


def gpu_schedule_facts(compiled: dict[str, Compiled], lowered: Lowered) -> dict:
    return schedule_facts(compiled, lowered.kernel_ops)


def package_writer(kind: str, source: str, launches: dict, write_cpu, extra=None):
    """How to write a GPU package's kernel files (source, launches, CPU library)."""

    def write(writer) -> dict[str, str]:
        ext = "cl" if kind == "opencl" else "cu"
        files = {
            kind: f"kernels/{kind}.{ext}.gz",  # read by edgecv.board.package.read_package_text
            f"{kind}_launches": f"kernels/{kind}_launches.json",
        }
        writer.write_text(files[kind], source)
        writer.write_text(files[f"{kind}_launches"], launches_to_json(launches))
        if extra is not None:
            files.update(extra(writer))
        if write_cpu is not None:
            files.update(write_cpu(writer))
        return files

    return write


def placement_facts(plan: Plan, placement: Placement, copies) -> dict:
    return {
        "launches": {"gpu": placement.on("gpu"), "cpu": placement.on("cpu")},
        "cpu_nodes": [
            {"kernel": n.kernel, "ops": n.ops, "reason": n.reason, "detail": n.detail}
            for n in placement.cpu_nodes
        ],
        "copies": [
            {
                "shape": list(c.shape),
                "dtype": c.dtype,
                "bytes": c.nbytes,
                "from": c.from_device,
                "to": c.to_device,
                **({"to_dtype": c.to_dtype} if c.to_dtype else {}),
            }
            for c in copies
        ],
        "copy_bytes": sum(c.nbytes for c in copies),
        "intermediate_bytes": {
            device: sum(
                size
                for size, d in zip(plan.storage_sizes, plan.storage_devices, strict=True)
                if d == device
            )
            for device in ("gpu", "cpu")
        },
    }


# the OpenCL program of some kernels: source, required extensions, launches
ProgramOf = Callable[[set[str]], tuple[str, list[str], dict]]


def check_on_device(
    profile: Profile,
    source: str,
    requires: list[str],
    launches: dict,
    check_on: str | None,
    progress: Progress,
    program: ProgramOf,
) -> dict[str, str]:
    """Compile the OpenCL program on a local device; return the kernels its compiler
    rejects, or crashes on, with the reason. The kernels it crashes on are found by
    compiling ``program(kernels)`` (source, extensions, launches) of halves of them
    until each crashing one stands alone."""
    if profile.runtime != "opencl" or check_on is None or not launches:
        return {}
    from ..board.runtime.opencl_program import ProgramBuildError, compile_on_device

    query = profile.default_opencl_device if check_on == "auto" else check_on
    progress(f"compiling the OpenCL program on `{query or 'the first device'}`")
    try:
        progress(compile_on_device(query, source, requires))
    except ProgramBuildError as err:
        kernels = {
            name
            for name, items in launches.items()
            if any(launch.kernel in err.kernels for launch in items)
        }
        if err.crashed:
            reason = f"the OpenCL compiler of `{query}` crashed compiling it"
            if kernels:  # the program compiles in pieces: the error names the kernels
                progress(f"the OpenCL compiler of `{query}` crashed on {len(kernels)} kernel(s)")
                return dict.fromkeys(sorted(kernels), reason)
            progress(f"the OpenCL compiler of `{query}` crashed: finding the kernels it crashes on")
            return dict.fromkeys(_crashing(sorted(launches), program, query), reason)
        if not kernels:
            raise
        progress(f"{len(kernels)} kernel(s) failed to compile on `{query}`: moving to the CPU")
        return {name: str(err).splitlines()[0] for name in kernels}
    except EdgecvError as err:  # no such device here: nothing to check against
        progress(f"not compiled on a local device ({str(err).splitlines()[0][:120]})")
    return {}


def _crashing(names: list[str], program: ProgramOf, query: str) -> list[str]:
    """The kernels among ``names`` (whose program crashes the compiler) that crash it
    alone; all of ``names`` when only together they do."""
    if len(names) == 1:
        return names
    from ..board.runtime.opencl_program import ProgramBuildError, compile_on_device

    found = []
    for part in (names[: len(names) // 2], names[len(names) // 2 :]):
        source, requires, _ = program(set(part))
        try:
            compile_on_device(query, source, requires)
        except ProgramBuildError as err:
            if err.crashed:
                found += _crashing(part, program, query)
    return found or names
