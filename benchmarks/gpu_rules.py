"""Per-layer times of edgecv's default GPU schedule rules against dlight and the CPU build.

    python benchmarks/gpu_rules.py                       # every layer, Intel's runtime
    python benchmarks/gpu_rules.py --layers dw32 pw512 --skip-dlight --repeat 20
    python benchmarks/gpu_rules.py --subgroup          # 1x1 convs: Intel-subgroup variant

Each layer is a conv + bias + ReLU as LegalizeOps/FuseOps/FuseTIR produce it from a
Relax graph, scheduled three ways: edgecv's rule (``default_rules``), TVM's dlight
defaults (what ``schedule_gpu`` does today), both built for the ``deeplens`` profile and
run on an OpenCL device (Intel's CPU runtime by default), and edgecv's LLVM CPU build of
the same kernel. Times are the median wall time of one launch plus ``clFinish`` (OpenCL)
or TVM's ``time_evaluator`` (CPU) after a warm-up run.

``--subgroup`` compares, on the 1x1 layers, the conv alone (no epilogue) under
edgecv's rule with its Intel-subgroup variant (``benchmarks/subgroup_pointwise.py``),
the two run alternately.

Not a test: numbers depend on the machine and its load. The OpenCL device here is a CPU
runtime standing in for an integrated GPU: compare the rows with each other.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import tvm
from subgroup_pointwise import subgroup_pointwise
from tvm import relax

from edgecv.bench.harness import alternate, median_time
from edgecv.board.runtime.opencl import OpenCLBackend
from edgecv.codegen.llvm import build_cpu
from edgecv.codegen.opencl import build_opencl
from edgecv.lowering import lower
from edgecv.profiles import load_profile
from edgecv.schedules.gpu import default_rules
from edgecv.testing import assert_close

# name -> (in channels, out channels, height, width, kernel, stride, groups)
LAYERS = {
    "dw32": (32, 32, 112, 112, 3, 1, 32),  # MobileNet1.0 conv_dw 1
    "pw32_64": (32, 64, 112, 112, 1, 1, 1),  # MobileNet1.0 conv_pw 1
    "pw512": (512, 512, 14, 14, 1, 1, 1),  # MobileNet1.0 conv_pw 7-11
    "r3x3_64": (64, 64, 56, 56, 3, 1, 1),  # ResNet-50 stage 1, 3x3
    "r1x1_256_64": (256, 64, 56, 56, 1, 1, 1),  # ResNet-50 stage 1, 1x1 reduce
    "stem7x7": (3, 64, 224, 224, 7, 2, 1),  # ResNet-50 stem
}


def layer_kernel(
    c: int, o: int, h: int, w: int, k: int, s: int, g: int, epilogue: bool = True
) -> tvm.tirx.PrimFunc:
    """The fused conv + bias + ReLU PrimFunc of one layer (the conv alone without
    ``epilogue``)."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c, h, w), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            weight = relax.const(rng.standard_normal((o, c // g, k, k)).astype("float32"))
            bias = relax.const(rng.standard_normal((1, o, 1, 1)).astype("float32"))
            y = bb.emit(relax.op.nn.conv2d(x, weight, strides=s, padding=k // 2, groups=g))
            if epilogue:
                y = bb.emit(relax.op.nn.relu(relax.op.add(y, bias)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    kernels = lower(bb.get()).kernels
    (func,) = kernels.functions.values()
    return func


def schedule_with_rules(func, target) -> tvm.tirx.PrimFunc:
    for rule in default_rules(target):
        sch = rule.apply(func, target, False)
        if sch is not None:
            return sch.mod["main"]
    raise RuntimeError("no rule applies")


def opencl_runner(func, profile, arrays, device: str):
    """``(run, result)``: one launch of ``func`` on its arguments, finished on return."""
    target = profile.tvm_target()
    kernels = build_opencl(tvm.IRModule({"main": func}), target, profile.intel_subgroup_size)
    backend = OpenCLBackend(device, kernels.source, kernels.launches, kernels.requires)
    tensors = []
    for array in arrays:
        tensor = backend.view(backend.alloc(array.nbytes), array.shape, str(array.dtype))
        backend.upload(tensor, array)
        tensors.append(tensor)
    launch = backend.bind("main", tensors)

    def run() -> None:
        launch()
        backend.synchronize()

    run()
    return run, lambda: backend.download(tensors[-1])


def time_opencl(func, profile, arrays, device: str, repeat: int):
    run, result = opencl_runner(func, profile, arrays, device)
    return median_time(run, repeat, warmup=0), result()


def compare_subgroup(name: str, profile, device: str, repeat: int) -> None:
    """A 1x1 layer's conv under edgecv's rule and as the Intel-subgroup variant."""
    c, o, h, w, k, s, g = LAYERS[name]
    func = layer_kernel(c, o, h, w, k, s, g, epilogue=False)
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal([int(d) for d in b.shape]).astype("float32") for b in func.params]
    variants = {"rule": schedule_with_rules(func, profile.tvm_target())}
    for tile in (8, 16):
        variants[f"subgroup, {tile} channels"] = subgroup_pointwise(c, o, h, w, tile)
    runners = {n: opencl_runner(f, profile, arrays, device) for n, f in variants.items()}
    timed = alternate({n: run for n, (run, _) in runners.items()}, repeat)
    for n, (_, result) in runners.items():
        assert_close(result(), runners["rule"][1](), f"{name} {n}")
        ratio = timed[n].median / timed["rule"].median
        least = float(np.min(timed[n].seconds))
        print(
            f"| {name} {LAYERS[name]} | {n} | {timed[n].median * 1e3:.2f} | "
            f"{least * 1e3:.2f} | {ratio:.2f}x |",
            flush=True,
        )


def time_cpu(func, arrays, repeat: int):
    target = load_profile("cpu").tvm_target()
    module = build_cpu(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target)
    tensors = [tvm.runtime.tensor(a) for a in arrays]
    timer = module.time_evaluator("main", tvm.cpu(), number=1, repeat=repeat)
    return statistics.median(timer(*tensors).results), tensors[-1].numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", nargs="*", default=list(LAYERS))
    parser.add_argument("--device", default="intel", help="OpenCL device query")
    parser.add_argument("--repeat", type=int, default=12)
    parser.add_argument("--skip-dlight", action="store_true")
    parser.add_argument("--subgroup", action="store_true", help="1x1: subgroup variant vs rule")
    args = parser.parse_args()
    profile = load_profile("deeplens")
    target = profile.tvm_target()
    if args.subgroup:
        print("| layer | kernel | median ms | min ms | / rule |")
        print("|---|---|---|---|---|")
        for name in args.layers:
            if LAYERS[name][4] == 1 and LAYERS[name][5] == 1 and LAYERS[name][6] == 1:
                compare_subgroup(name, profile, args.device, args.repeat)
        return
    print("| layer | GFLOP | edgecv rule (ms) | dlight (ms) | CPU LLVM (ms) | rule / CPU |")
    print("|---|---|---|---|---|---|")
    for name in args.layers:
        c, o, h, w, k, s, g = LAYERS[name]
        func = layer_kernel(c, o, h, w, k, s, g)
        rng = np.random.default_rng(1)
        arrays = [
            rng.standard_normal([int(d) for d in b.shape]).astype("float32") for b in func.params
        ]
        flop = 2 * o * (h // s) * (w // s) * (c // g) * k * k / 1e9
        cpu_s, expected = time_cpu(func, arrays, args.repeat)
        rule_s, got = time_opencl(
            schedule_with_rules(func, target), profile, arrays, args.device, args.repeat
        )
        assert_close(got, expected, name)
        dlight = "-"
        if not args.skip_dlight:  # up to seconds per launch: few repeats
            dlight_s, _ = time_opencl(func, profile, arrays, args.device, 3)
            dlight = f"{dlight_s * 1e3:.1f}"
        print(
            f"| {name} {LAYERS[name]} | {flop:.3f} | {rule_s * 1e3:.2f} | {dlight} | "
            f"{cpu_s * 1e3:.2f} | {rule_s / cpu_s:.1f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
