"""Default CPU schedules, layer by layer: unscheduled vs scheduled kernels.

    python benchmarks/cpu_schedule_bench.py                  # every layer, both targets
    python benchmarks/cpu_schedule_bench.py --only resnet --no-baseline --mcpu native

Each layer is the fused kernel edgecv builds for it (convolution + BatchNorm as
multiply/add + ReLU, or dense + bias), lowered through the same Relax passes as a
model. Prints the median kernel time unscheduled and scheduled, GFLOP/s and the
speed-up. Not a test: numbers vary with machine load. For reference, 2 cores of the
project machines peak at ~220 GFLOP/s FP32; MXNet runs mobilenet1.0 in ~25 ms and
resnet50_v1 in ~95 ms whole-model.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

import edgecv  # noqa: F401  (sets TVM_NUM_THREADS before TVM's thread pool starts)
from edgecv.lowering import lower
from edgecv.schedules.cpu import schedule_cpu


@dataclass(frozen=True)
class Layer:
    model: str
    name: str
    in_channels: int
    size: int  # input height = width
    out_channels: int
    kernel: int = 1
    stride: int = 1
    groups: int = 1
    dense: bool = False

    @property
    def out_size(self) -> int:
        return (self.size + 2 * (self.kernel // 2) - self.kernel) // self.stride + 1

    @property
    def flops(self) -> float:
        if self.dense:
            return 2.0 * self.in_channels * self.out_channels
        per_output = 2.0 * self.in_channels // self.groups * self.kernel**2
        return per_output * self.out_channels * self.out_size**2


LAYERS = [
    Layer("mobilenet1.0", "conv 3x3/2 3->32 @224", 3, 224, 32, 3, 2),
    Layer("mobilenet1.0", "dw 3x3 32 @112", 32, 112, 32, 3, 1, 32),
    Layer("mobilenet1.0", "pw 32->64 @112", 32, 112, 64),
    Layer("mobilenet1.0", "dw 3x3/2 64 @112", 64, 112, 64, 3, 2, 64),
    Layer("mobilenet1.0", "pw 64->128 @56", 64, 56, 128),
    Layer("mobilenet1.0", "dw 3x3 128 @56", 128, 56, 128, 3, 1, 128),
    Layer("mobilenet1.0", "pw 512->512 @14", 512, 14, 512),
    Layer("mobilenet1.0", "dw 3x3 512 @14", 512, 14, 512, 3, 1, 512),
    Layer("mobilenet1.0", "pw 1024->1024 @7", 1024, 7, 1024),
    Layer("mobilenet1.0", "dense 1024->1000", 1024, 1, 1000, dense=True),
    Layer("resnet50_v1", "conv 7x7/2 3->64 @224", 3, 224, 64, 7, 2),
    Layer("resnet50_v1", "conv 3x3 64->64 @56", 64, 56, 64, 3),
    Layer("resnet50_v1", "conv 1x1 256->64 @56", 256, 56, 64),
    Layer("resnet50_v1", "conv 1x1 64->256 @56", 64, 56, 256),
    Layer("resnet50_v1", "conv 3x3 128->128 @28", 128, 28, 128, 3),
    Layer("resnet50_v1", "conv 3x3 256->256 @14", 256, 14, 256, 3),
    Layer("resnet50_v1", "conv 1x1 1024->256 @14", 1024, 14, 256),
    Layer("resnet50_v1", "conv 3x3 512->512 @7", 512, 7, 512, 3),
    Layer("resnet50_v1", "dense 2048->1000", 2048, 1, 1000, dense=True),
]


def layer_module(layer: Layer) -> tvm.IRModule:
    """The layer with its epilogue as a Relax module (random constant weights)."""
    rng = np.random.RandomState(0)
    bb = relax.BlockBuilder()
    c = layer.out_channels
    if layer.dense:
        x = relax.Var("data", relax.TensorType((1, layer.in_channels), "float32"))
        w = rng.normal(size=(layer.in_channels, c)).astype(np.float32)
        bias = rng.normal(size=(c,)).astype(np.float32)
    else:
        shape = (1, layer.in_channels, layer.size, layer.size)
        x = relax.Var("data", relax.TensorType(shape, "float32"))
        w_shape = (c, layer.in_channels // layer.groups, layer.kernel, layer.kernel)
        w = rng.normal(size=w_shape).astype(np.float32)
        scale = rng.uniform(0.5, 1.5, (1, c, 1, 1)).astype(np.float32)
        shift = rng.normal(size=(1, c, 1, 1)).astype(np.float32)
    with bb.function("main", [x]):
        with bb.dataflow():
            if layer.dense:
                y = bb.emit(relax.op.add(relax.op.matmul(x, relax.const(w)), relax.const(bias)))
            else:
                pad = layer.kernel // 2
                conv = relax.op.nn.conv2d(x, relax.const(w), layer.stride, pad, groups=layer.groups)
                bn = relax.op.add(relax.op.multiply(conv, relax.const(scale)), relax.const(shift))
                y = bb.emit(relax.op.nn.relu(bn))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def time_kernel(func: tvm.tirx.PrimFunc, target: tvm.target.Target, seconds: float) -> float:
    """Median seconds per call of ``func`` on random arguments."""
    name = "kernel"
    lib = tvm.tirx.build(
        tvm.IRModule({name: func.with_attr("global_symbol", name)}), target=target, pipeline=None
    )
    rng = np.random.RandomState(1)
    args = [
        tvm.runtime.tensor(rng.normal(size=[int(d) for d in p.shape]).astype(p.dtype))
        for p in func.params
    ]
    once = lib.time_evaluator(name, tvm.cpu(), number=1, repeat=1)(*args).mean
    number = max(1, int(seconds / 3 / max(once, 1e-6)))
    return lib.time_evaluator(name, tvm.cpu(), number=number, repeat=3)(*args).median


def main_kernel(mod: tvm.IRModule) -> tvm.tirx.PrimFunc:
    """The layer's one kernel (the Relax passes fuse the whole layer into it)."""
    kernels = list(lower(mod).kernels.functions.values())
    if len(kernels) != 1:
        raise RuntimeError(f"expected one fused kernel, got {len(kernels)}")
    return kernels[0].without_attr("global_symbol")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run the layers whose model/name contain this")
    parser.add_argument("--mcpu", action="append", help="LLVM mcpu ('native' = this CPU)")
    parser.add_argument("--no-baseline", action="store_true", help="skip unscheduled timings")
    parser.add_argument("--seconds", type=float, default=0.3, help="time budget per measurement")
    args = parser.parse_args()
    mcpus = args.mcpu or ["", "native"]
    print(f"TVM threads: {tvm.runtime.num_threads()}")
    for mcpu in mcpus:
        spec = {"kind": "llvm"}
        if mcpu:
            native = mcpu == "native"
            spec["mcpu"] = tvm.target.codegen.llvm_get_system_cpu() if native else mcpu
        target = tvm.target.Target(spec)
        print(f"\ntarget: {target}")
        header = (
            f"{'model':<13} {'layer':<24} {'MFLOP':>7} {'before ms':>10} {'GFLOP/s':>8} "
            f"{'after ms':>9} {'GFLOP/s':>8} {'speed-up':>9}"
        )
        print(header)
        print("-" * len(header))
        totals: dict[str, float] = {}
        for layer in LAYERS:
            if args.only not in f"{layer.model} {layer.name}":
                continue
            func = main_kernel(layer_module(layer))
            scheduled = schedule_cpu(func, target)
            before = float("nan") if args.no_baseline else time_kernel(func, target, args.seconds)
            after = time_kernel(scheduled, target, args.seconds)
            totals[layer.model] = totals.get(layer.model, 0.0) + after
            gflops = layer.flops / 1e9
            print(
                f"{layer.model:<13} {layer.name:<24} {layer.flops / 1e6:>7.1f} "
                f"{before * 1e3:>10.2f} {gflops / before:>8.1f} {after * 1e3:>9.3f} "
                f"{gflops / after:>8.1f} {before / after:>9.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
