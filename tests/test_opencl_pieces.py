"""An OpenCL program compiles in pieces, one per step kernel, named by content
(:mod:`edgecv.board.runtime.opencl_pieces`): TVM's sources split so each piece compiles alone,
the same code under other names is the same piece, and a piece compiled for one
program is loaded from the cache for another."""

from __future__ import annotations

import re

import pytest
from test_opencl import device_or_skip
from tvm import relax
from tvm.script import relax as R

from edgecv.board.errors import EdgecvError
from edgecv.board.runtime import opencl_program
from edgecv.board.runtime.opencl import OpenCLBackend
from edgecv.board.runtime.opencl_pieces import split_program
from edgecv.board.runtime.opencl_program import ProgramBuildError
from edgecv.codegen.opencl import build_opencl
from edgecv.lowering import lower
from edgecv.profiles import load_profile


@pytest.fixture(scope="module")
def program():
    """A TVM-generated program of three step kernels (a reduction holds two device
    kernels on the GPU rules) and its launches."""

    @R.function
    def main(x: R.Tensor((4, 256), "float32"), w: R.Tensor((8, 256), "float32")):
        with R.dataflow():
            y = R.matmul(x, R.permute_dims(w))
            s = R.nn.softmax(y, axis=1)
            z = R.add(s, R.const(1.0, "float32"))
            R.output(z)
        return z

    lowered = lower(tvm_module(main))
    return build_opencl(lowered.kernels, load_profile("aisage").tvm_target())


def tvm_module(func: relax.Function):
    import tvm

    return tvm.IRModule({"main": func})


def definitions(source: str) -> list[str]:
    return re.findall(r"(?m)^__kernel\b.*?\bvoid\s+(\w+)\s*\(.*\{\s*$", source)


def test_a_tvm_program_splits_into_a_piece_per_step_kernel(program):
    source = program.source
    pieces = split_program(source)
    kernels = definitions(source)
    assert sorted(n for p in pieces for n in p.names) == sorted(kernels)
    steps = {launch.kernel: step for step, ls in program.launches.items() for launch in ls}
    assert len(pieces) == len(set(steps.values())) >= 2
    for piece in pieces:  # one step's device kernels, renamed, each defined once
        assert len({steps[name] for name in piece.names}) == 1
        assert sorted(definitions(piece.source)) == sorted(piece.names.values())
        assert all(re.fullmatch(r"edgecv_[0-9a-f]{16}_\d+", n) for n in piece.names.values())


def test_the_same_code_under_other_names_is_the_same_piece(program):
    (first, *_) = split_program(program.source)
    name = next(iter(first.names))
    # the program another model (or the graph tuner's candidates) would hold: the
    # kernel and its parameters named otherwise
    renamed = program.source.replace(name, "other_model_step_kernel")
    for param in re.findall(r"__global \w+\* restrict (\w+)", program.source):
        renamed = re.sub(rf"\b{param}\b", f"{param}_elsewhere", renamed)
    again = {p.source: p for p in split_program(renamed)}
    assert first.source in again
    assert again[first.source].names == {"other_model_step_kernel": first.names[name]}


def test_a_source_it_does_not_recognize_stays_one_piece():
    source = (
        "float helper(float v) { return v * 2.0f; }\n"
        "__kernel void a(__global float* y) { y[0] = helper(y[0]); }\n"
    )
    (piece,) = split_program(source)
    assert piece.source == source and piece.names == {"a": "a"}


def test_pieces_run_and_are_shared_through_the_cache(program, tmp_path, monkeypatch):
    device = device_or_skip("intel(r) opencl")
    monkeypatch.setenv("EDGECV_CACHE_DIR", str(tmp_path / "cache"))
    pieces = split_program(program.source)
    backend = OpenCLBackend(device, program.source, program.launches)
    assert not backend.program_cached
    entries = sorted((tmp_path / "cache").iterdir())
    assert len(entries) == len({p.source for p in pieces})
    # the program of a model holding the same kernels under other names: loaded from
    # the pieces cached for the first, nothing compiled
    opencl_program._programs.clear()
    renamed = program.source
    for i, name in enumerate(dict.fromkeys(definitions(program.source))):
        renamed = re.sub(rf"\b{name}\b", f"renamed{i}_kernel", renamed)
    other = OpenCLBackend(device, renamed, {})
    assert other.program_cached and sorted((tmp_path / "cache").iterdir()) == entries
    # a kernel is found by the name the package gives it, under its name by content
    (name, *_) = definitions(program.source)
    own = backend.cl_kernel(name).function_name
    assert own != name and re.fullmatch(r"edgecv_[0-9a-f]{16}_\d+", own)
    with pytest.raises(EdgecvError, match="no OpenCL kernel `no_such_kernel`"):
        backend.cl_kernel("no_such_kernel")


def test_every_piece_that_fails_names_its_kernels(tmp_path, monkeypatch):
    device = device_or_skip("intel(r) opencl")
    monkeypatch.setenv("EDGECV_CACHE_DIR", str(tmp_path / "cache"))
    source = "\n".join(
        [
            "__kernel void good_kernel(__global float* restrict y) {",
            "  y[0] = 1.0f;",
            "}",
            "__kernel void bad_kernel(__global float* restrict y) {",
            "  y[0] = no_such_name;",
            "}",
            "__kernel void worse_kernel(__global float* restrict y) {",
            "  y[0] = nor_this_one;",
            "}",
        ]
    )
    with pytest.raises(ProgramBuildError) as err:
        OpenCLBackend(device, source, {})
    assert sorted(err.value.kernels) == ["bad_kernel", "worse_kernel"]
    message = str(err.value)
    assert "kernel bad_kernel failed" in message and "no_such_name" in message
    assert "nor_this_one" in message and "good_kernel" not in message
    assert not err.value.crashed
    # the good piece was compiled and cached all the same
    assert len(list((tmp_path / "cache").iterdir())) == 1


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_program_joined_from_kernels_is_the_one_generated_from_them(tmp_path, dtype):
    """A deploy joins the program from each kernel's own code (written where it was
    compiled) instead of generating it again from their device functions: the same
    kernels, the extension pragmas of an fp16 program once, at the top."""

    from edgecv.codegen.contained import compile_in_process
    from edgecv.codegen.gpu_lowering import device_module, lower_to_file
    from edgecv.codegen.opencl import generate_opencl, program_of
    from edgecv.schedules.orders import gpu_order

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 256), dtype))
    w = relax.Var("w", relax.TensorType((8, 256), dtype))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.op.permute_dims(w)))
            s = bb.emit(relax.op.nn.softmax(y, axis=1))
            head = relax.op.strided_slice(x, axes=[1], begin=[0], end=[8])
            z = bb.emit_output(relax.op.add(s, head))
        bb.emit_func_output(z)
    target = load_profile("deeplens").tvm_target()
    kernels = lower(bb.get()).kernels
    functions = {gv.name_hint: f for gv, f in kernels.functions.items()}
    compiled = compile_in_process(functions, gpu_order(target, 16), lower_to_file(target), tmp_path)
    facts = [c.facts for _, c in sorted(compiled.items())]
    assert len(facts) >= 2 and all(facts)
    joined, requires = program_of(facts, target, 16)
    subgroups = sorted(k for f in facts for k in f["subgroup_kernels"])
    parts = [f["device"] for f in facts]
    generated, generated_requires = generate_opencl(device_module(parts), target, subgroups, 16)
    assert requires == generated_requires
    assert {p.source for p in split_program(joined)} == {p.source for p in split_program(generated)}
    if dtype == "float16":
        assert requires == ["cl_khr_fp16"]
        assert joined.count("#pragma OPENCL EXTENSION cl_khr_fp16 : enable") == 1
        assert joined.index("#pragma") < joined.index("__kernel")


def test_a_piece_is_the_same_in_a_program_that_needs_subgroups(tmp_path, monkeypatch):
    """Options go with the pieces that need them (OpenCL C 3.0 for subgroup builtins):
    a plain kernel compiled in a program with a subgroup kernel is found in the cache
    by a program without one."""
    from edgecv.codegen.opencl import required_extensions

    device = device_or_skip("intel(r) opencl")
    monkeypatch.setenv("EDGECV_CACHE_DIR", str(tmp_path / "cache"))
    plain = [
        "__kernel void plain_kernel(__global float* restrict y) {",
        "  y[get_global_id(0)] *= 2.0f;",
        "}",
    ]
    shuffle = [
        "__kernel void shuffle_kernel(__global float* restrict y) {",
        "  y[get_global_id(0)] = intel_sub_group_shuffle(y[get_global_id(0)], 0);",
        "}",
    ]
    both = "\n".join(plain + shuffle)
    first = OpenCLBackend(device, both, {}, required_extensions(both))
    assert first.pieces_compiled == (2, 2)
    opencl_program._programs.clear()
    alone = "\n".join(plain).replace("plain_kernel", "other_kernel")
    second = OpenCLBackend(device, alone, {}, required_extensions(alone))
    assert second.pieces_compiled == (0, 1)
