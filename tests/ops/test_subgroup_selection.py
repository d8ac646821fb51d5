"""Which GPU versions a build picks: the Intel-subgroup variants only for profiles whose
device has Intel subgroups, kernels pinned to that subgroup size, and clear errors."""

from __future__ import annotations

import json

import pytest
import tvm
from tvm import te

from edgecv.board.errors import ProfileError
from edgecv.codegen.op_versions import OpVersions
from edgecv.codegen.opencl import build_opencl
from edgecv.ops.scan import scan_gpu
from edgecv.profiles import _missing_vector_features, load_profile


def tagged_box_nms(shape=(1, 10, 6)):
    """A kernel as the importer tags it: the GPU build replaces it by edgecv's version."""
    data = te.placeholder(shape, "float32", name="data")
    out = te.compute(shape, lambda *i: data(*i), name="out")
    tag = json.dumps({"op": "box_nms", "shape": list(shape), "dtype": "float32"})
    return te.create_prim_func([data, out]).with_attr("edgecv.op", tag)


def test_profiles_name_their_intel_subgroup_size():
    assert load_profile("deeplens").intel_subgroup_size == 16
    assert load_profile("aisage").intel_subgroup_size is None  # Mali: none
    assert load_profile("local").intel_subgroup_size is None  # "auto": not known at build
    assert load_profile("jetson_nano").intel_subgroup_size is None  # CUDA


@pytest.mark.parametrize(
    "profile, field, value",
    [("deeplens", "subgroup_size", 12), ("aisage", "mem_base_addr_align_bits", 1000)],
)
def test_a_bad_gpu_field_in_a_profile_is_named(profile, field, value, tmp_path):
    raw = json.loads(json.dumps(load_profile(profile).raw))
    raw["gpu"][field] = value
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ProfileError, match=f"{field} must be a power of two"):
        load_profile(path)


@pytest.mark.parametrize(
    "field, value, said",
    [("gpu_ops", "conv2d", "gpu_ops must be"), ("tuning_class", 7, "tuning_class must be")],
)
def test_a_bad_top_level_field_in_a_profile_is_named(field, value, said, tmp_path):
    raw = json.loads(json.dumps(load_profile("aisage").raw))
    raw[field] = value
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ProfileError, match=said):
        load_profile(path)


def test_profiles_read_their_tuning_class_and_gpu_operators():
    assert load_profile("aisage").tuning_class.startswith("opencl-mali-")
    assert load_profile("cpu").tuning_class is None  # this machine's class
    assert load_profile("aisage").gpu_ops == "all"


def test_profiles_say_where_a_concat_input_may_start_on_their_gpu():
    assert load_profile("deeplens").piece_alignments == {"cpu": 64, "gpu": 128}
    assert load_profile("jetson_nano").piece_alignments["gpu"] == 512  # not said: 4096 bits


def test_subgroup_variant_only_when_asked_and_on_opencl():
    func = tagged_box_nms()
    deeplens = load_profile("deeplens").tvm_target()
    default = OpVersions()
    assert "sub_group_" in default.gpu_version(func, deeplens, 16).script()
    assert "sub_group_" not in default.gpu_version(func, deeplens, None).script()
    work_group = OpVersions(subgroups=False)  # benchmarks compare the work-group version
    assert "sub_group_" not in work_group.gpu_version(func, deeplens, 16).script()
    cuda = load_profile("jetson_orin_nano").tvm_target()
    assert "sub_group_" not in default.gpu_version(func, cuda, 16).script()


def test_unknown_operator_versions_are_named():
    from edgecv.board.errors import EdgecvError

    with pytest.raises(EdgecvError, match="no GPU version box_nms=fast; known: box_nms=naive"):
        OpVersions({"box_nms": "fast"})


def test_subgroup_kernels_get_the_required_size_attribute():
    target = load_profile("deeplens").tvm_target()
    kernels = build_opencl(tvm.IRModule({"scan": scan_gpu(2, 100, subgroup=16)}), target, 16)
    assert kernels.source.count("intel_reqd_sub_group_size(16)") >= 1
    assert kernels.requires == ["cl_intel_subgroups"]
    plain = build_opencl(tvm.IRModule({"scan": scan_gpu(2, 100)}), target, 16)
    assert "intel_reqd_sub_group_size" not in plain.source and plain.requires == []


def test_subgroup_kernels_without_a_size_are_refused():
    target = load_profile("deeplens").tvm_target()
    with pytest.raises(ValueError, match="use subgroups: build them with the device's"):
        build_opencl(tvm.IRModule({"scan": scan_gpu(2, 100, subgroup=16)}), target)


def test_subgroups_need_opencl():
    from edgecv.ops.box_nms import box_nms_gpu

    with pytest.raises(ValueError, match="Intel subgroups are an OpenCL feature"):
        box_nms_gpu((1, 10, 6), target_kind="cuda", subgroup=16)


def test_native_cpu_drops_vector_features_the_machine_does_not_report(tmp_path):
    masked = tmp_path / "cpuinfo"  # a VM that names a Zen 4 but hides AVX-512
    masked.write_text("processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma f16c\n")
    missing = _missing_vector_features("znver4", str(masked))
    assert "avx512f" in missing and "avx2" not in missing and "fma" not in missing
    full = tmp_path / "full"
    full.write_text(
        "flags\t: avx avx2 fma f16c avx512f avx512dq avx512cd avx512bw avx512vl "
        "avx512_bf16 avx512_bitalg avx512ifma avx512vbmi avx512_vbmi2 "
        "avx512_vnni avx512_vpopcntdq gfni vaes vpclmulqdq\n"
    )
    assert _missing_vector_features("znver4", str(full)) == []
    assert _missing_vector_features("znver4", str(tmp_path / "absent")) == []
