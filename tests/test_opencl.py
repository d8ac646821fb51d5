"""Whole models on the OpenCL backend (TVM-generated OpenCL C run through pyopencl),
against MXNet's forward pass, on the pip-installed OpenCL devices."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import mxnet_forward, random_input
from test_parity import depth_loosening

from edgecv.board.package import read_package_text
from edgecv.board.runtime.executor import Executor
from edgecv.board.runtime.opencl import OpenCLBackend
from edgecv.board.runtime.opencl_devices import opencl_devices
from edgecv.codegen.opencl import build_opencl
from edgecv.frontend.mxnet.importer import from_mxnet
from edgecv.frontend.mxnet.mxnet_graph import load_params, load_symbol
from edgecv.lowering import lower, memory_plan
from edgecv.profiles import load_profile
from edgecv.testing import assert_close

heavy = pytest.mark.heavy


def device_or_skip(query: str) -> str:
    if not any(d.matches(query) for d in opencl_devices()):
        pytest.skip(f"no OpenCL device matching {query!r} on this machine")
    return query


def run_opencl(exported, profile: str, device: str, x: np.ndarray) -> list[np.ndarray]:
    graph = load_symbol(exported.symbol_path)
    imported = from_mxnet(graph, load_params(exported.params_path), {"data": exported.input_shape})
    lowered = lower(imported.mod)
    # the plan is the CPU's (no placement): place its tensors where the OpenCL device
    # can start sub-buffers, as a GPU package's plan does
    memory_plan.plan_memory(lowered.plan, {"cpu": load_profile(profile).piece_alignments["gpu"]})
    kernels = build_opencl(lowered.kernels, load_profile(profile).tvm_target())
    assert not kernels.unsupported
    backend = OpenCLBackend(device, kernels.source, kernels.launches)
    return Executor(lowered.plan, backend, lowered.constants).run([x])


@pytest.mark.parametrize(
    ("name", "profile"),
    [
        ("squeezenet1.0", "deeplens"),
        ("squeezenet1.0", "aisage"),
        pytest.param("mobilenet1.0", "deeplens", marks=heavy),
        pytest.param("mobilenet1.0", "aisage", marks=heavy),
        pytest.param("resnet50_v1", "deeplens", marks=heavy),
        pytest.param("resnet50_v1", "aisage", marks=heavy),
    ],
)
def test_classifier_on_intel_opencl_matches_mxnet(exported, name, profile):
    model = exported(name)
    x = random_input(model.input_shape, seed=1)
    ours = run_opencl(model, profile, device_or_skip("intel(r) opencl"), x)
    ref = mxnet_forward(model.symbol_path, model.params_path, x)
    assert_close(ours[0], ref[0], f"{name} on {profile}", loosen=depth_loosening(model))


def test_deploy_and_run_opencl_package(tmp_path, capsys):
    from test_bad_input import small_net, small_params

    from edgecv._mxnet import import_mxnet
    from edgecv.board.model import load
    from edgecv.cli import main

    device_or_skip("intel(r) opencl")
    mx = import_mxnet()
    prefix = tmp_path / "tiny"
    small_net().save(f"{prefix}-symbol.json")
    params = small_params()
    mx.nd.save(f"{prefix}-0000.params", {k: mx.nd.array(v) for k, v in params.items()})
    out = tmp_path / "pkg"
    argv = [
        "deploy",
        f"{prefix}-symbol.json",
        "--device",
        "deeplens",
        "--input-shape",
        "1,2,5,5",
        "-o",
        str(out),
    ]
    assert main(argv) == 0
    model = load(out, on="intel")
    x = np.random.RandomState(0).normal(size=(1, 2, 5, 5)).astype(np.float32)
    ref = mxnet_forward(prefix.with_name("tiny-symbol.json"), f"{prefix}-0000.params", x)
    assert_close(model.run(x)[0], ref[0])
    assert (
        main(["run", str(out), "--on", "no-such-device", "--input", str(tmp_path / "x.npy")]) == 2
    )
    assert "no OpenCL device matches" in capsys.readouterr().err


def test_gpu_workspaces_are_planned_per_stream_and_old_plans_still_run(tmp_path):
    """box_nms's device workspaces are temp buffers of the deployed plan, counted by the
    manifest's memory, in each stream's own storage (the device holds the plan's memory
    and nothing more); the same model's plan made without them (as a package built
    before they were planned) runs with workspaces the backend allocates per launch, to
    the same outputs."""
    import json

    from test_demo import tiny_detector

    from edgecv.board.model import load
    from edgecv.board.package import read_params
    from edgecv.board.plan import Plan, launches_from_json
    from edgecv.deploy import deploy

    device_or_skip("intel(r) opencl")
    symbol = tmp_path / "det-symbol.json"
    tiny_detector().save(str(symbol))
    pkg = deploy(str(symbol), tmp_path / "pkg", "deeplens", input_shape=(1, 3, 64, 64))
    build = json.loads((pkg / "manifest.json").read_text())["build"]
    launches = launches_from_json((pkg / "kernels" / "opencl_launches.json").read_text())
    model = load(pkg, on="intel", streams=2)
    plan, backend = model.executor.plan, model.executor.backend
    kernels = [s for s in plan.steps if s.kind == "kernel" and not s.elided]
    assert kernels and all(s.device == "gpu" for s in kernels)
    for step in kernels:
        planned = [plan.buffers[w].nbytes for w in step.workspaces]
        assert planned == launches[step.kernel][0].workspaces
    workspaces = [plan.buffers[w] for s in plan.steps for w in s.workspaces]
    assert any(s.kernel == "box_nms" and s.workspaces for s in plan.steps)
    assert build["workspace_bytes"] == sum(b.nbytes for b in workspaces) > 0
    assert build["intermediate_bytes"] == sum(plan.storage_sizes)
    assert build["live_bytes_lower_bound"] == memory_plan.live_bytes_lower_bound(plan)
    assert backend.allocated_bytes == model.executor.allocated_bytes
    x = np.random.RandomState(0).normal(size=(1, 3, 64, 64)).astype(np.float32)
    with model.executor.context() as first, model.executor.context() as second:
        for w in workspaces:
            assert first.tensors[w.id].buffer is not second.tensors[w.id].buffer
        outputs = first.run([x])
        for got, want in zip(second.run([x]), outputs, strict=True):
            np.testing.assert_array_equal(got, want)
    # the plan as the build made it before: no workspace buffers (added last), planned
    old = Plan.from_json(plan.to_json())
    old.buffers = old.buffers[: min(b.id for b in workspaces)]
    for step in old.steps:
        step.workspaces = []
    memory_plan.plan_memory(old, load_profile("deeplens").piece_alignments)
    old.check()
    before = backend.allocated_bytes
    executor = Executor(old, model.executor.backends, read_params(pkg))
    allocated = backend.allocated_bytes - before - executor.allocated_bytes
    assert allocated >= build["workspace_bytes"]  # the backend's own, per launch
    for got, want in zip(executor.run([x]), outputs, strict=True):
        np.testing.assert_array_equal(got, want)


def test_first_device_that_builds_is_used():
    """A package that names no device tries every device until one compiles it.

    PoCL's LLVM may not know the host CPU (it fails every build on AMD Zen 5); the
    program must then land on the next device, and asking for PoCL alone must fail
    with a message naming the device and its compiler log.
    """
    from edgecv.board.errors import EdgecvError

    device_or_skip("intel(r) opencl")
    source = "__kernel void f(__global float* y) { y[get_global_id(0)] += 1.0f; }"
    backend = OpenCLBackend("", source, {})
    y = backend.view(backend.alloc(16), (4,), "float32")
    backend.upload(y, np.zeros(4, np.float32))
    kernel = backend.cl_kernel("f")
    kernel.set_arg(0, y.buffer)
    backend.cl.enqueue_nd_range_kernel(backend.queue, kernel, (4,), None)
    np.testing.assert_array_equal(backend.download(y), np.ones(4, np.float32))
    # Which device: the first, in the order GPUs / CPU runtimes / simulators, whose
    # compiler builds the program when asked directly through pyopencl.
    import pyopencl as cl

    every = [(p, d) for p in cl.get_platforms() for d in p.get_devices()]
    every.sort(key=lambda pd: 2 if "oclgrind" in pd[0].name.lower() else 0 if pd[1].type & 4 else 1)
    expected = None
    for platform, device in every:
        try:
            cl.Program(cl.Context([device]), source).build()
        except cl.Error:
            continue
        expected = f"{platform.name.strip()} / {device.name.strip()}"
        break
    assert backend.label == expected
    if any(d.matches("pocl") for d in opencl_devices()):
        try:
            OpenCLBackend("pocl", source, {})
        except EdgecvError as err:
            assert "pthread" in str(err) and "build" in str(err)


def test_a_view_at_an_offset_is_a_sub_buffer_and_a_misaligned_one_a_clear_error():
    """Pieces of a concatenation written in place: a kernel writing a view 128 bytes
    into a buffer writes those bytes of it; 64 bytes in is below Intel's runtime's base
    address alignment (1024 bits): the package cannot run there, said plainly."""
    from edgecv.board.errors import PackageError

    device_or_skip("intel(r) opencl")
    source = "__kernel void f(__global float* y) { y[get_global_id(0)] = 7.0f; }"
    backend = OpenCLBackend("intel", source, {})
    slot = backend.alloc(256)
    whole = backend.view(slot, (64,), "float32")
    backend.upload(whole, np.zeros(64, np.float32))
    piece = backend.view(slot, (4,), "float32", offset=128)
    kernel = backend.cl_kernel("f")
    kernel.set_arg(0, piece.buffer)
    backend.cl.enqueue_nd_range_kernel(backend.queue, kernel, (4,), None)
    expected = np.zeros(64, np.float32)
    expected[32:36] = 7.0
    np.testing.assert_array_equal(backend.download(whole), expected)
    with pytest.raises(PackageError, match="multiples of 128 bytes"):
        backend.view(slot, (4,), "float32", offset=64)


def test_second_start_loads_the_program_from_the_binary_cache(tmp_path, monkeypatch):
    """A new process (the programs kept in memory forgotten) loads the binary cached on
    disk instead of compiling; a corrupt cache entry is compiled again."""
    from edgecv.board.runtime import kernel_cache, opencl_program

    device_or_skip("intel(r) opencl")
    monkeypatch.setenv("EDGECV_CACHE_DIR", str(tmp_path / "cache"))
    source = "__kernel void twice(__global float* y) { y[get_global_id(0)] *= 2.0f; }"
    cold = OpenCLBackend("intel", source, {})
    opencl_program._programs.clear()  # as in a new process
    warm = OpenCLBackend("intel", source, {})
    assert warm.programs["twice"][0] is not cold.programs["twice"][0]
    assert (cold.program_cached, warm.program_cached) == (False, True)
    (entry,) = (tmp_path / "cache").iterdir()
    for backend in (cold, warm):  # both programs compute the same thing
        y = backend.view(backend.alloc(16), (4,), "float32")
        backend.upload(y, np.arange(4, dtype=np.float32))
        kernel = backend.cl_kernel("twice")
        kernel.set_arg(0, y.buffer)
        backend.cl.enqueue_nd_range_kernel(backend.queue, kernel, (4,), None)
        np.testing.assert_array_equal(backend.download(y), [0, 2, 4, 6])
    entry.write_bytes(b"not a program binary")  # a corrupt entry is rebuilt, not fatal
    opencl_program._programs.clear()
    again = OpenCLBackend("intel", source, {})
    assert again.program_cached is False
    assert entry.read_bytes() != b"not a program binary"
    assert kernel_cache.cache_dir() == tmp_path / "cache"


def test_a_program_loaded_again_in_one_process_is_the_one_kept():
    """Loading the same kernels on the same device again reuses the built program and
    its context (no build; and pyopencl keeps memory for every kernel made from a new
    program, see benchmarks/results/soak-2026-11-26-zen3.md); other kernels get their own;
    the least recently used beyond PROGRAMS_KEPT are let go."""
    from edgecv.board.runtime import opencl_program

    device_or_skip("intel(r) opencl")
    source = "__kernel void thrice(__global float* y) { y[get_global_id(0)] *= 3.0f; }"
    first = OpenCLBackend("intel", source, {})
    again = OpenCLBackend("intel", source, {})
    assert again.programs is first.programs and again.context is first.context
    assert again.program_cached
    other = OpenCLBackend("intel", source.replace("3.0f", "4.0f"), {})
    assert other.programs is not first.programs
    for k in range(opencl_program.PROGRAMS_KEPT):  # pushes `thrice` out
        OpenCLBackend("intel", source.replace("3.0f", f"{k + 5}.0f"), {})
    assert OpenCLBackend("intel", source, {}).programs is not first.programs
    y = again.view(again.alloc(16), (4,), "float32")  # the kept program still runs
    again.upload(y, np.ones(4, np.float32))
    kernel = again.cl_kernel("thrice")
    kernel.set_arg(0, y.buffer)
    again.cl.enqueue_nd_range_kernel(again.queue, kernel, (4,), None)
    np.testing.assert_array_equal(again.download(y), np.full(4, 3.0, np.float32))


def test_program_using_intel_subgroups_refused_on_a_device_without_them():
    from edgecv.board.runtime.opencl_program import DeviceNotFoundError
    from edgecv.codegen.opencl import required_extensions

    source = (
        "__kernel void shuffle(__global float* y) {\n"
        "  y[get_global_id(0)] = intel_sub_group_shuffle(y[get_global_id(0)], 0);\n}\n"
    )
    requires = required_extensions(source)
    assert requires == ["cl_intel_subgroups"]
    plain = [d for d in opencl_devices() if not d.intel_subgroups]
    if not plain:
        pytest.skip("every OpenCL device here has Intel subgroups")
    with pytest.raises(DeviceNotFoundError) as err:
        OpenCLBackend(plain[0].name, source, {}, requires)
    message = str(err.value)
    assert "cl_intel_subgroups" in message and plain[0].name in message
    if any(d.intel_subgroups for d in opencl_devices()):
        assert "Intel(R) OpenCL" in message  # names the device that would do
        backend = OpenCLBackend("intel", source, {}, requires)  # and that one builds it
        assert backend.programs


def test_compile_error_names_the_failing_kernel():
    from edgecv.board.runtime.opencl_program import ProgramBuildError

    device_or_skip("intel(r) opencl")
    source = (
        "__kernel void fine(__global float* y) { y[0] = 1.0f; }\n\n"
        "__kernel void broken(__global float* y) {\n  y[0] = no_such_name;\n}\n"
    )
    with pytest.raises(ProgramBuildError) as err:
        OpenCLBackend("intel", source, {})
    message = str(err.value)
    assert "kernel broken failed to compile" in message
    assert "no_such_name" in message  # the compiler's own log follows
    assert "kernel fine" not in message


def test_buffer_larger_than_the_device_allows_is_a_clear_error():
    from edgecv.board.runtime.opencl import DeviceMemoryError

    device_or_skip("intel(r) opencl")
    backend = OpenCLBackend("intel", "__kernel void k(__global float* y) { }", {})
    too_big = int(backend.device.max_mem_alloc_size) + 1
    with pytest.raises(DeviceMemoryError) as err:
        backend.alloc(too_big)
    assert "cannot allocate one buffer" in str(err.value) and "MiB" in str(err.value)
    assert backend.allocated_bytes == 0


DETECTORS = [
    "ssd_512_mobilenet1.0_voc",
    "ssd_512_resnet50_v1_voc",
    "yolo3_mobilenet1.0_coco",
    "yolo3_darknet53_voc",
]


@heavy
@pytest.mark.parametrize(
    ("name", "profile", "device"),
    [(name, profile, "intel(r) opencl") for name in DETECTORS for profile in ("deeplens", "aisage")]
    + [("ssd_512_resnet50_v1_voc", "aisage", "portable computing")],  # PoCL: slow compiles
)
def test_detector_deployed_all_on_opencl_matches_mxnet(tmp_path, exported, name, profile, device):
    """Every launch of the package on the OpenCL device (box_nms included: the
    Intel-subgroup variants for deeplens, the work-group ones for aisage); ids exact,
    scores and boxes within tolerance of MXNet's forward pass."""
    import json

    from conftest import pocl_unusable

    from edgecv.board.model import load
    from edgecv.deploy import deploy
    from edgecv.testing import match_detections

    device_or_skip(device)
    if device.startswith("portable") and pocl_unusable():
        pytest.skip(pocl_unusable())
    model = exported(name)
    pkg = deploy(
        str(model.symbol_path),
        tmp_path / "pkg",
        profile,
        params=str(model.params_path),
        input_shape=model.input_shape,
    )
    placement = json.loads((pkg / "manifest.json").read_text())["build"]["placement"]
    assert placement["launches"]["cpu"] == 0 and placement["copies"] == []
    source = read_package_text(pkg / "kernels" / "opencl.cl.gz")
    assert ("intel_reqd_sub_group_size(16)" in source) == (profile == "deeplens")
    x = random_input(model.input_shape)
    ours = load(pkg, on=device).run(x)
    ref = mxnet_forward(model.symbol_path, model.params_path, x)
    scale = max(model.input_shape[2:])
    assert match_detections(ours, ref, depth_loosening(model), scale) > 0
