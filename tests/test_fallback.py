"""The two-pass CPU fallback: placement reasons, copy insertion, and mixed execution."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import mxnet_forward
from test_parity import depth_loosening

from edgecv.board.plan import Buffer, Plan, Step
from edgecv.fallback import GpuOnlyError, insert_copies, place
from edgecv.fallback.placement import Placement
from edgecv.testing import assert_close


def chain_plan() -> Plan:
    """x -> a -> t1 -> b -> t2 -> c -> out, plus d(t1) -> t3 and a parameter w read by a, b."""
    buffers = [
        Buffer(0, (4,), "float32", "input", "x"),
        Buffer(1, (4,), "float32", "const", "w"),
        Buffer(2, (4,), "float32", "temp"),  # t1 = a(x, w)
        Buffer(3, (4,), "float32", "temp"),  # t2 = b(t1, w)
        Buffer(4, (4,), "float32", "temp"),  # t3 = d(t1)
        Buffer(5, (2, 2), "float32", "view", view_of=3),  # reshape of t2
        Buffer(6, (2, 2), "float32", "temp"),  # out = c(view, t3)
    ]
    steps = [
        Step("a", [0, 1, 2]),
        Step("b", [2, 1, 3]),
        Step("d", [2, 4]),
        Step("c", [5, 4, 6]),
    ]
    return Plan(buffers, steps, inputs=[0], outputs=[6])


def test_copies_only_on_edges_that_cross_devices():
    plan = chain_plan()
    result, copies = insert_copies(plan, Placement(["gpu", "cpu", "cpu", "gpu"]))
    kinds = [(s.kind, s.kernel, s.device) for s in result.steps]
    assert kinds == [
        ("kernel", "a", "gpu"),
        ("copy", "copy", "cpu"),  # t1 to the CPU, once for both CPU readers b and d
        ("kernel", "b", "cpu"),
        ("kernel", "d", "cpu"),
        ("copy", "copy", "gpu"),  # the view of t2 back to the GPU
        ("copy", "copy", "gpu"),  # t3 to the GPU
        ("kernel", "c", "gpu"),
    ]
    t1_cpu = result.steps[1].args[1]
    assert result.steps[1].args[0] == 2 and result.buffers[t1_cpu].device == "cpu"
    assert result.steps[2].args[0] == t1_cpu and result.steps[3].args[0] == t1_cpu
    # the parameter is read on both devices: uploaded twice, never copied at run time
    w_cpu = result.steps[2].args[1]
    assert w_cpu != 1 and result.buffers[w_cpu].kind == "const"
    assert result.buffers[w_cpu].name == "w" and result.buffers[w_cpu].device == "cpu"
    assert [(c.from_device, c.to_device, c.shape) for c in copies] == [
        ("gpu", "cpu", (4,)),
        ("cpu", "gpu", (2, 2)),
        ("cpu", "gpu", (4,)),
    ]
    assert sum(c.nbytes for c in copies) == 16 + 16 + 16
    assert plan.steps[1].args == [2, 1, 3]  # the input plan is left as it was


def test_no_copies_when_every_launch_is_on_one_device():
    for device in ("gpu", "cpu"):
        result, copies = insert_copies(chain_plan(), Placement([device] * 4))
        assert copies == [] and [s.kind for s in result.steps] == ["kernel"] * 4
        assert {b.device for b in result.buffers} == {device}


def test_memory_slots_are_never_shared_across_devices():
    result, _ = insert_copies(chain_plan(), Placement(["gpu", "cpu", "cpu", "gpu"]))
    for buf in result.buffers:
        if buf.kind == "temp":
            assert result.storage_devices[buf.storage] == buf.device
    assert set(result.storage_devices) == {"gpu", "cpu"}


def test_input_read_first_on_the_cpu_lives_there():
    result, copies = insert_copies(chain_plan(), Placement(["cpu", "gpu", "gpu", "gpu"]))
    assert result.buffers[0].device == "cpu"
    assert [(c.source, c.to_device) for c in copies] == [(2, "gpu")]


def test_a_constant_output_of_a_gpu_plan_stays_on_the_gpu():
    """An output no step computes (a constant: anchors a cut graph returns) lives where
    the plan runs, so an all-GPU package needs no CPU kernels to hold it."""
    plan = chain_plan()
    plan.buffers.append(Buffer(7, (3,), "float32", "const", "anchors"))
    plan.outputs.append(7)
    result, copies = insert_copies(plan, Placement(["gpu"] * 4))
    assert copies == [] and {b.device for b in result.buffers} == {"gpu"}
    result, _ = insert_copies(plan, Placement(["cpu"] * 4))
    assert result.buffers[7].device == "cpu"


def test_placement_reasons_in_order():
    plan = chain_plan()
    ops = {"a": ["conv2d", "relu"], "b": ["box_nms"], "c": ["argsort"], "d": ["relu"]}
    placement = place(
        plan,
        ops,
        gpu_ops=["conv2d", "relu", "box_nms", "argsort", "erf"],
        no_gpu_kernel={"b": "host code sorts"},
        gpu_build_failed={"c": "kernel c failed to compile"},
        cpu_ops=["relu"],
    )
    assert placement.devices == ["cpu", "cpu", "cpu", "cpu"]
    reasons = {(n.kernel, n.reason, n.detail) for n in placement.cpu_nodes}
    assert reasons == {
        ("a", "forced", "relu"),
        ("b", "no-gpu-kernel", "host code sorts"),
        ("c", "gpu-build-failed", "kernel c failed to compile"),
        ("d", "forced", "relu"),
    }
    listed = place(plan, ops, gpu_ops=["conv2d", "relu"])
    assert listed.devices == ["gpu", "cpu", "gpu", "cpu"]  # steps run a, b, d, c
    assert [(n.kernel, n.reason, n.detail) for n in listed.cpu_nodes] == [
        ("b", "not-on-gpu-list", "box_nms"),
        ("c", "not-on-gpu-list", "argsort"),
    ]
    assert place(plan, ops, gpu_ops="all").devices == ["gpu"] * 4


def test_cpu_ops_naming_no_operator_of_the_model_warns_with_its_operators():
    """`--cpu-ops Pooling` (MXNet's name; the fused operator is `max_pool2d`) would
    otherwise move nothing, silently."""
    ops = {"a": ["conv2d", "relu"], "b": ["max_pool2d"], "c": ["add"], "d": ["relu"]}
    with pytest.warns(UserWarning, match=r"`Pooling` names no operator .* max_pool2d"):
        placement = place(chain_plan(), ops, "all", cpu_ops=["Pooling", "max_pool2d"])
    assert [n.kernel for n in placement.cpu_nodes] == ["b"]


def test_gpu_only_refuses_with_the_offending_launches():
    ops = {"a": ["conv2d"], "b": ["box_nms"], "c": ["add"], "d": ["relu"]}
    with pytest.raises(GpuOnlyError) as err:
        place(chain_plan(), ops, "all", no_gpu_kernel={"b": "host code sorts"}, gpu_only=True)
    message = str(err.value)
    assert "1 launch(es)" in message and "b (box_nms): no GPU implementation" in message
    assert place(chain_plan(), ops, "all", gpu_only=True).on("gpu") == 4


def _tiny_model(tmp_path):
    from test_bad_input import small_net, small_params

    from edgecv._mxnet import import_mxnet

    mx = import_mxnet()
    prefix = tmp_path / "tiny"
    small_net().save(f"{prefix}-symbol.json")
    mx.nd.save(f"{prefix}-0000.params", {k: mx.nd.array(v) for k, v in small_params().items()})
    return f"{prefix}-symbol.json", f"{prefix}-0000.params"


def test_operator_left_off_the_gpu_list_runs_on_the_cpu(tmp_path, capsys):
    """A profile without `relu` on its GPU list: that launch falls back, with copies."""
    from test_opencl import device_or_skip

    from edgecv.board.model import load
    from edgecv.cli import main
    from edgecv.profiles import load_profile

    device_or_skip("intel(r) opencl")
    symbol, params = _tiny_model(tmp_path)
    raw = dict(load_profile("deeplens").raw, name="no_relu")
    raw["gpu_ops"] = ["conv2d", "add", "matmul", "dense", "permute_dims", "multiply"]
    (tmp_path / "no_relu.json").write_text(json.dumps(raw))
    out = tmp_path / "pkg"
    argv = [
        "deploy",
        symbol,
        "--device",
        str(tmp_path / "no_relu.json"),
        "--input-shape",
        "1,2,5,5",
        "-o",
        str(out),
        "--explain",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    placement = manifest["build"]["placement"]
    assert placement["launches"]["cpu"] >= 1
    assert all(n["reason"] == "not-on-gpu-list" for n in placement["cpu_nodes"])
    assert any("relu" in n["ops"] for n in placement["cpu_nodes"])
    assert len(placement["copies"]) >= 1 and "operator not on the profile's GPU list" in printed
    assert f"copies: {len(placement['copies'])}" in printed
    model = load(out, on="intel")
    assert set(model.executor.backends) == {"gpu", "cpu"}
    x = np.random.RandomState(0).normal(size=(1, 2, 5, 5)).astype(np.float32)
    from edgecv.testing import assert_close

    assert_close(model.run(x)[0], mxnet_forward(symbol, params, x)[0], "tiny with CPU relu")
    assert main([*argv[:-3], "-o", str(tmp_path / "gpu-only"), "--gpu-only"]) == 2
    assert "--gpu-only" in capsys.readouterr().err
    assert not (tmp_path / "gpu-only").exists()  # a failed deploy leaves nothing behind


@pytest.mark.heavy  # two squeezenet deploys measuring layouts on Intel's runtime: 10-20 min
def test_forced_cpu_ops_give_the_same_outputs_as_all_gpu(tmp_path, exported):
    """squeezenet with every max_pool2d forced onto the CPU vs the all-GPU package, both
    with their concatenations written in place (the mechanism on a tiny model: the
    default suite's tests above)."""
    from test_opencl import device_or_skip

    from edgecv.board.model import load
    from edgecv.deploy import deploy

    device_or_skip("intel(r) opencl")
    model = exported("squeezenet1.0")
    symbol, params = str(model.symbol_path), str(model.params_path)
    gpu = deploy(symbol, tmp_path / "gpu", "deeplens", params=params, input_shape=model.input_shape)
    mixed = deploy(
        symbol,
        tmp_path / "mixed",
        "deeplens",
        params=params,
        input_shape=model.input_shape,
        cpu_ops=["max_pool2d"],
    )
    build = json.loads((mixed / "manifest.json").read_text())["build"]
    facts = build["placement"]
    assert facts["launches"]["cpu"] == 3 and len(facts["copies"]) == 6
    # the fire modules' 8 concatenations are written in place in both packages: their
    # inputs (expand convolutions) stay on the GPU, at offsets of 128-byte multiples
    gpu_build = json.loads((gpu / "manifest.json").read_text())["build"]
    assert build["concats_in_place"] == gpu_build["concats_in_place"] == 8
    x = np.random.RandomState(2).uniform(0, 1, model.input_shape).astype(np.float32)
    all_gpu, with_cpu = load(gpu, on="intel").run(x)[0], load(mixed, on="intel").run(x)[0]
    assert_close(with_cpu, all_gpu, "max_pool2d on the CPU vs on the GPU")
    ref = mxnet_forward(model.symbol_path, model.params_path, x)[0]
    # Both against MXNet, the independent reference, number by number.
    assert_close(with_cpu, ref, "mixed vs MXNet", loosen=depth_loosening(model))
    assert_close(all_gpu, ref, "all-GPU vs MXNet", loosen=depth_loosening(model))


@pytest.mark.heavy
@pytest.mark.parametrize(
    "name", ["ssd_512_mobilenet1.0_voc", "ssd_512_resnet50_v1_voc", "yolo3_mobilenet1.0_coco"]
)
def test_detector_with_nms_on_the_cpu_matches_all_gpu_and_mxnet(tmp_path, exported, name):
    """On Intel's OpenCL device: the all-GPU package (GPU box_nms) and the one with
    --cpu-ops box_nms give the same detections, and both match MXNet."""
    from conftest import random_input
    from test_opencl import device_or_skip
    from test_parity import depth_loosening

    from edgecv.board.model import load
    from edgecv.deploy import deploy
    from edgecv.testing import match_detections

    device_or_skip("intel(r) opencl")
    model = exported(name)
    common = dict(params=str(model.params_path), input_shape=model.input_shape)
    symbol = str(model.symbol_path)
    gpu = deploy(symbol, tmp_path / "gpu", "deeplens", **common)
    mixed = deploy(symbol, tmp_path / "mixed", "deeplens", cpu_ops=["box_nms"], **common)
    facts = json.loads((gpu / "manifest.json").read_text())["build"]["placement"]
    assert facts["launches"]["cpu"] == 0 and facts["copies"] == []
    facts = json.loads((mixed / "manifest.json").read_text())["build"]["placement"]
    assert [(n["ops"], n["reason"]) for n in facts["cpu_nodes"]] == [(["box_nms"], "forced")]
    assert len(facts["copies"]) == 2  # boxes to the CPU, kept boxes back
    x = random_input(model.input_shape)
    all_gpu = load(gpu, on="intel").run(x)
    with_cpu = load(mixed, on="intel").run(x)
    ref = mxnet_forward(model.symbol_path, model.params_path, x)
    scale = max(model.input_shape[2:])
    assert match_detections(all_gpu, with_cpu, 1.0, scale) > 0
    assert match_detections(all_gpu, ref, depth_loosening(model), scale) > 0
    assert match_detections(with_cpu, ref, depth_loosening(model), scale) > 0


def test_kernel_source_ships_gzipped_and_plain_packages_still_load(tmp_path):
    """The OpenCL C of a GPU package is written gzipped; a package of the earlier format
    (plain ``opencl.cl``) loads to the same answer, and a corrupt gzip is one line."""
    import gzip

    from test_opencl import device_or_skip

    from edgecv.board.errors import PackageError
    from edgecv.board.model import load
    from edgecv.board.package import sha256
    from edgecv.deploy import deploy

    device_or_skip("intel(r) opencl")
    symbol, params = _tiny_model(tmp_path)
    pkg = deploy(symbol, tmp_path / "pkg", "deeplens", params=params, input_shape=(1, 2, 5, 5))
    manifest = json.loads((pkg / "manifest.json").read_text())
    assert manifest["build"]["kernels"]["opencl"] == "kernels/opencl.cl.gz"
    packed = (pkg / "kernels" / "opencl.cl.gz").read_bytes()
    text = gzip.decompress(packed)
    assert b"__kernel" in text and len(packed) < len(text) / 3
    x = np.random.RandomState(0).normal(size=(1, 2, 5, 5)).astype(np.float32)
    expected = load(pkg, on="intel").run(x)[0]

    def rewrite(name: str, data: bytes) -> None:
        (pkg / "kernels" / "opencl.cl.gz").unlink(missing_ok=True)
        (pkg / "kernels" / name).write_bytes(data)
        sources = ("kernels/opencl.cl", "kernels/opencl.cl.gz")
        files = {k: v for k, v in manifest["files"].items() if k not in sources}
        files[f"kernels/{name}"] = sha256(pkg / "kernels" / name)
        manifest["files"], manifest["build"]["kernels"]["opencl"] = files, f"kernels/{name}"
        (pkg / "manifest.json").write_text(json.dumps(manifest))

    rewrite("opencl.cl", text)  # as packages before the gzipped source
    np.testing.assert_array_equal(load(pkg, on="intel").run(x)[0], expected)
    (pkg / "kernels" / "opencl.cl").unlink()
    rewrite("opencl.cl.gz", packed[: len(packed) // 2])
    with pytest.raises(PackageError, match="cannot read .*opencl.cl.gz.*redeploy"):
        load(pkg, on="intel")
