"""What a plan may ask of the memory it runs in (issue 49, item 9).

:meth:`Plan.check` is what keeps a damaged or hand-edited plan from writing outside the
memory it was given. It also refuses a launch that writes a constant (the weights every
stream shares: a race that changes them for every later call) and a CPU tensor placed at
an offset TVM's kernels cannot take (they assume 64-byte alignment: such a plan crashed
the process). On the GPU no argument check in the kernel stands between a launch and
memory, so the build records the bytes each kernel reads or writes through each
argument, and the runtime refuses a plan whose buffers are smaller. Plans crafted from
real ones (a lowered Relax chain, a deployed OpenCL package), each of which the checks
let through before.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_plan import chain_module
from test_run_faults import quick_package, x_of

import edgecv
from edgecv.board.errors import PackageError
from edgecv.board.package import sha256
from edgecv.board.plan import Buffer, FormatError, Plan, launches_from_json
from edgecv.lowering import lower


@pytest.fixture(scope="module")
def chain() -> Plan:
    """A real CPU plan: two conv + ReLU launches reading the weights ``p0``."""
    plan = lower(chain_module(2)).plan
    plan.check()
    assert [b.kind for b in plan.buffers] == ["input", "const", "temp", "temp", "view"]
    return plan


def test_a_launch_writing_a_constant_is_refused(chain):
    plan = copy.deepcopy(chain)
    plan.steps[1].args[-1] = 1  # its output: the weights the first launch read
    with pytest.raises(FormatError, match=r"step 1: output buffer 1 should be .*not a constant"):
        plan.check()
    plan = copy.deepcopy(chain)  # through a view of the weights
    weights = plan.buffers[1]
    plan.buffers.append(Buffer(5, (weights.nbytes // 4,), "float32", "view", view_of=1))
    plan.steps[0].args[-1] = 5
    with pytest.raises(FormatError, match=r"step 0: output buffer 5 .*a view of constant `p0`"):
        plan.check()


def test_a_cpu_tensor_off_the_64_byte_alignment_is_refused(chain):
    plan = copy.deepcopy(chain)
    temp = plan.buffers[2]
    plan.storage_sizes[temp.storage] += 64  # room for it at any offset below 64
    temp.offset = 64
    plan.check()  # aligned: accepted
    for offset in (4, 32):
        temp.offset = offset
        with pytest.raises(FormatError, match="buffer 2: offset should be a multiple of 64"):
            plan.check()
    raw = json.loads(plan.to_json())  # what a package's plan.json holding it gives
    with pytest.raises(FormatError, match="buffer 2: offset"):
        Plan.from_json(json.dumps(raw))


def misplaced(raw: dict) -> None:  # the small tensor of slot 1 moved 4 bytes on
    buf = raw["buffers"][13]
    assert (buf["kind"], buf["storage"], buf["offset"]) == ("temp", 1, 0)
    buf["offset"] = 4


def writes_weights(raw: dict) -> None:  # a launch's output swapped for a weight
    step = raw["steps"][1]
    assert raw["buffers"][6]["kind"] == "const" and step["args"][-1] == 7
    step["args"][-1] = 6


@pytest.mark.parametrize(
    ("edit", "fragments"),
    [
        (misplaced, ["buffer 13: offset should be a multiple of 64", "found 4"]),
        (writes_weights, ["step 1: output buffer 6", "not a constant", "`p4`"]),
    ],
    ids=["misaligned", "writes-weights"],
)
def test_a_package_whose_plan_breaks_either_is_refused_at_load(
    tmp_path_factory, tmp_path, edit, fragments
):
    """On a deployed CPU package: the plan edited (its checksum with it) is refused by
    edgecv.load in one line, before any kernel runs (a misaligned tensor crashed the
    process in its first launch)."""
    edited = edited_copy(quick_package("cpu", tmp_path_factory), tmp_path, "plan.json", edit)
    with pytest.raises(PackageError) as err:
        edgecv.load(edited)
    message = str(err.value)
    assert "\n" not in message and "plan.json" in message and "redeploy" in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


# -- GPU buffers against what the compiled kernels read and write --------------------------


@pytest.fixture(scope="module")
def opencl_package(tmp_path_factory) -> Path:
    from test_opencl import device_or_skip

    device_or_skip("intel")
    return quick_package("deeplens", tmp_path_factory)


def edited_copy(package: Path, folder: Path, relative: str, edit) -> Path:
    """A copy of ``package`` with the JSON file ``relative`` changed by ``edit`` (its
    checksum updated, as a hand edit or a buggy writer would leave it)."""
    copied = Path(shutil.copytree(package, folder / "edited"))
    path = copied / relative
    raw = json.loads(path.read_text())
    edit(raw)
    path.write_text(json.dumps(raw))
    manifest = json.loads((copied / "manifest.json").read_text())
    manifest["files"][relative] = sha256(path)
    (copied / "manifest.json").write_text(json.dumps(manifest))
    return copied


def test_every_gpu_launch_records_the_bytes_of_its_arguments(opencl_package):
    plan = Plan.from_json((opencl_package / "plan.json").read_text())
    launches = launches_from_json((opencl_package / "kernels/opencl_launches.json").read_text())
    for step in plan.steps:
        if step.kind != "kernel" or step.elided:
            continue
        for launch in launches[step.kernel]:
            assert launch.buffers == [plan.buffers[a].nbytes for a in step.args], step.kernel


def test_a_gpu_buffer_smaller_than_its_kernel_writes_is_refused_at_load(opencl_package, tmp_path):
    plan = Plan.from_json((opencl_package / "plan.json").read_text())
    step = next(s for s in plan.steps if s.kind == "kernel" and s.device == "gpu")
    out = plan.buffers[step.args[-1]]
    assert out.kind == "temp" and out.shape[1] > 1

    def halve(raw: dict) -> None:  # the same slot and offset, half the channels
        shape = raw["buffers"][out.id]["shape"]
        shape[1] //= 2

    edited = edited_copy(opencl_package, tmp_path, "plan.json", halve)
    Plan.from_json((edited / "plan.json").read_text())  # a plan that fits its memory
    with pytest.raises(PackageError) as err:
        edgecv.load(edited, on="intel")
    message = str(err.value)
    assert "\n" not in message
    assert f"kernel `{step.kernel}`" in message and "redeploy" in message
    half = out.nbytes // 2
    assert f"argument {len(step.args) - 1} is {half} bytes" in message, message
    assert f"reads or writes {out.nbytes}" in message, message
    x = x_of(1)
    assert np.isfinite(edgecv.load(opencl_package, on="intel").run(x)[0]).all()


def test_launches_recorded_before_their_argument_bytes_still_load(opencl_package, tmp_path):
    def forget(raw: dict) -> None:
        for launches in raw.values():
            for launch in launches:
                launch.pop("buffers", None)

    relative = "kernels/opencl_launches.json"
    edited = edited_copy(opencl_package, tmp_path, relative, forget)
    x = x_of(2)
    want = edgecv.load(opencl_package, on="intel").run(x)
    got = edgecv.load(edited, on="intel").run(x)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_runtime_refuses_argument_tensors_smaller_than_their_kernel_reads():
    from edgecv.board.runtime.backend import planned_arguments
    from edgecv.board.runtime.opencl import CLTensor

    tensors = [CLTensor(None, (n,), "float32") for n in (16, 8)]  # 64 and 32 bytes
    assert planned_arguments("k", tensors, [64, 32]) == tensors
    assert planned_arguments("k", tensors, [64, 0]) == tensors  # a scalar parameter
    assert planned_arguments("k", tensors, []) == tensors  # launches recorded before
    for sizes, fragment in (
        ([64, 36], "argument 1 is 32 bytes"),
        ([128, 32], "argument 0 is 64 bytes"),
        ([64], "2 arguments, its launches 1"),
    ):
        with pytest.raises(PackageError, match=fragment):
            planned_arguments("k", tensors, sizes)
