"""CUDA: every kernel of a model compiled here with nvcc; run only where a GPU is.

The machines this suite runs on usually have nvcc but no GPU: compilation is tested
everywhere nvcc is, execution (marked ``cuda``) only where the driver finds a device.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import mxnet_forward, random_input
from test_parity import depth_loosening

from edgecv.board.package import read_package_text
from edgecv.board.runtime.cuda import CudaDevice, CudaImages, choose_image, cuda_devices
from edgecv.board.runtime.nvcc import CudaCompileError, compile_source
from edgecv.codegen.cuda import build_cuda
from edgecv.frontend.mxnet.importer import from_mxnet
from edgecv.frontend.mxnet.mxnet_graph import load_params, load_symbol
from edgecv.lowering import lower
from edgecv.profiles import load_profile
from edgecv.testing import assert_close

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
needs_gpu = pytest.mark.skipif(not cuda_devices(), reason="no CUDA GPU/driver on this machine")


def lowered_model(exported, name: str):
    model = exported(name)
    graph = load_symbol(model.symbol_path)
    imported = from_mxnet(graph, load_params(model.params_path), {"data": model.input_shape})
    return model, lower(imported.mod)


@needs_nvcc
def test_every_kernel_of_a_model_compiles_with_nvcc(exported):
    _, lowered = lowered_model(exported, "squeezenet1.0")
    kernels = build_cuda(lowered.kernels, load_profile("jetson_orin_nano").tvm_target())
    assert not kernels.unsupported
    assert kernels.cubin[:4] == b"\x7fELF" and ".target sm_87" in kernels.ptx
    names = {launch.kernel for items in kernels.launches.values() for launch in items}
    assert len(kernels.launches) == len(lowered.kernels.functions)
    for name in names:  # each launched kernel is a symbol of the cubin and an entry of the PTX
        assert name.encode() in kernels.cubin, name
        assert f".entry {name}(" in kernels.ptx, name
    for items in kernels.launches.values():
        for launch in items:
            block = int(np.prod(launch.local_size))
            assert 1 <= block <= 1024, launch
            assert all(
                g % b == 0 for g, b in zip(launch.global_size, launch.local_size, strict=True)
            ), launch


@needs_nvcc
def test_jetson_nano_package_carries_source_for_on_device_compilation(tmp_path, exported):
    from test_bad_input import small_net, small_params

    from edgecv._mxnet import import_mxnet
    from edgecv.deploy import deploy

    mx = import_mxnet()
    prefix = tmp_path / "tiny"
    small_net().save(f"{prefix}-symbol.json")
    mx.nd.save(f"{prefix}-0000.params", {k: mx.nd.array(v) for k, v in small_params().items()})
    symbol = f"{prefix}-symbol.json"
    nano = deploy(symbol, tmp_path / "nano", "jetson_nano", input_shape=(1, 2, 5, 5))
    manifest = json.loads((nano / "manifest.json").read_text())
    cuda = manifest["build"]["cuda"]
    assert cuda["arch"] == "sm_53" and cuda["compile_on_device"] is True
    assert cuda["binaries"] == [] and "sm_53" in cuda["why_source_only"]
    assert "__global__" in read_package_text(nano / manifest["build"]["kernels"]["cuda"])
    orin = deploy(
        f"{prefix}-symbol.json", tmp_path / "orin", "jetson_orin_nano", input_shape=(1, 2, 5, 5)
    )
    manifest = json.loads((orin / "manifest.json").read_text())
    assert manifest["build"]["cuda"]["binaries"] == ["cubin", "ptx"]
    assert (orin / manifest["build"]["kernels"]["cuda_cubin"]).read_bytes()[:4] == b"\x7fELF"


@needs_nvcc
def test_nvcc_error_names_the_failing_kernel():
    source = (
        'extern "C" __global__ void fine(float* y) { y[0] = 1.0f; }\n'
        'extern "C" __global__ void __launch_bounds__(32) broken(float* y) {\n'
        "  y[0] = no_such_name;\n}\n"
    )
    with pytest.raises(CudaCompileError) as err:
        compile_source(source, "sm_87", "cubin")
    message = str(err.value)
    assert "kernel broken" in message and "no_such_name" in message
    assert "fine" not in message.split(":")[0]


def test_module_image_choice_follows_the_gpu_architecture():
    images = CudaImages("sm_87", "source", cubin=b"cubin", ptx="ptx")
    orin = CudaDevice(0, "Orin", 87, 8 << 30)
    hopper = CudaDevice(0, "H100", 90, 80 << 30)
    turing = CudaDevice(0, "T4", 75, 16 << 30)
    assert choose_image(images, orin) == ("cubin", b"cubin")
    assert choose_image(images, hopper) == ("ptx", b"ptx\0")  # the driver JITs newer GPUs
    with pytest.raises(Exception, match="built for sm_87 and cuda:0 T4 \\(sm_75\\) is older"):
        choose_image(images, turing)


def test_cuda_package_on_a_machine_without_gpu_is_refused_clearly(tmp_path):
    if cuda_devices():
        pytest.skip("this machine has a CUDA GPU")
    from edgecv.board.runtime.cuda import CUDABackend, CudaUnavailable

    with pytest.raises(CudaUnavailable, match="CUDA"):
        CUDABackend("", CudaImages("sm_87", "source"), {})


@needs_gpu
@pytest.mark.cuda
def test_classifier_on_cuda_matches_mxnet(exported):
    from edgecv.board.runtime.cuda import CUDABackend
    from edgecv.board.runtime.executor import Executor

    gpu = cuda_devices()[0]
    model, lowered = lowered_model(exported, "squeezenet1.0")
    target = load_profile("jetson_orin_nano").tvm_target()
    kernels = build_cuda(lowered.kernels, target, compile_binaries=False)
    images = CudaImages(gpu.arch, kernels.source)  # compiled for the GPU at hand, cached
    backend = CUDABackend("", images, kernels.launches)
    x = random_input(model.input_shape, seed=1)
    ours = Executor(lowered.plan, backend, lowered.constants).run([x])
    ref = mxnet_forward(model.symbol_path, model.params_path, x)
    assert_close(ours[0], ref[0], "squeezenet1.0 on CUDA", loosen=depth_loosening(model))


@needs_nvcc
def test_vision_operator_kernels_compile_with_nvcc():
    """The same TIR that runs on OpenCL lowers to CUDA: every kernel of edgecv's own
    operators (the sort, the scan, NMS, ROIAlign, the class rows) compiles for the Orin's sm_87."""
    import tvm

    from edgecv.ops.box_nms import box_nms_gpu
    from edgecv.ops.class_rows import top_class_rows_gpu
    from edgecv.ops.multibox import multibox_detection_gpu
    from edgecv.ops.roi_align import roi_align_gpu
    from edgecv.ops.scan import scan_gpu
    from edgecv.ops.segmented_argsort import segmented_argsort_gpu

    funcs = {
        "scan": scan_gpu(2, 1000, "int32", True, 256),
        "segmented_argsort": segmented_argsort_gpu(5000, 3, "float32", True, 256),
        "box_nms": box_nms_gpu((1, 6132, 6), "float32", "cuda", 256, id_index=0, topk=400),
        "roi_align": roi_align_gpu(
            (1, 16, 32, 32), (100, 5), "float32", 256, pooled_size=(7, 7), spatial_scale=0.0625
        ),
        "multibox_detection": multibox_detection_gpu(
            (1, 21, 1000), (1, 4000), (1, 1000, 4), "float32", "cuda", 256
        ),
        "top_class_rows": top_class_rows_gpu((1, 12288, 80), (1, 12288, 4), 400, 0.01),
    }
    kernels = build_cuda(tvm.IRModule(funcs), load_profile("jetson_orin_nano").tvm_target())
    assert not kernels.unsupported
    assert set(kernels.launches) == set(funcs)
    for items in kernels.launches.values():
        for launch in items:
            assert f".entry {launch.kernel}(" in kernels.ptx, launch.kernel
