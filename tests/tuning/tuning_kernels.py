"""Tiny kernels and models for the tuning tests (seconds to tune, not minutes)."""

from __future__ import annotations

from pathlib import Path

import tvm
from tvm import s_tir, te

from edgecv.schedules.database import workload
from edgecv.tuning.tasks import Task


def matmul_task(n: int = 128) -> Task:
    """``C = A @ B`` (n x n x n) as a tuning task."""
    a = te.placeholder((n, n), "float32", name="A")
    b = te.placeholder((n, n), "float32", name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    func = te.create_prim_func([a, b, c]).with_attr("global_symbol", "matmul")
    return Task("matmul", workload(func), 1, ["matmul"])


def packed_conv_task(channels: int = 32, size: int = 14, block: int = 16, kernel: int = 3) -> Task:
    """A ``kernel`` x ``kernel`` conv2d + ReLU in ``NCHW{block}c`` (weights a parameter),
    lowered as deploy lowers it, as a tuning task whose default rule
    (``gpu.PackedConv2D`` on OpenCL) has tiles to offer."""
    from tvm import relax

    from edgecv.graph_tuner.apply import desired_layouts
    from edgecv.lowering import lower

    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float32"))
    w = relax.Var("w", relax.TensorType((channels, channels, kernel, kernel), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=kernel // 2)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)

    def packed(call) -> dict:
        if call.op.name != "relax.nn.conv2d":
            return {}
        return {"relax.nn.conv2d": desired_layouts(call, f"NCHW{block}c")}

    kernels = lower(relax.transform.ConvertLayout({}, packed)(bb.get())).kernels
    name, func = next(
        (gv.name_hint, f) for gv, f in kernels.functions.items() if "conv" in gv.name_hint
    )
    return Task(name, workload(func), 1, [name])


def serial(task: Task, gpu: bool) -> s_tir.Schedule:
    """A slow schedule: the whole kernel in one thread (one work-item on a GPU)."""
    sch = s_tir.Schedule(task.mod)
    block = sch.get_sblock("C")
    if gpu:
        fused = sch.fuse(*sch.get_loops(block)[:2])
        one, thread, rest = sch.split(fused, [1, 1, None])
        sch.bind(one, "blockIdx.x")
        sch.bind(thread, "threadIdx.x")
    return sch


def rows_and_columns(task: Task) -> s_tir.Schedule:
    """A fast GPU schedule: a work-group per row, a work-item per column."""
    sch = s_tir.Schedule(task.mod)
    block = sch.get_sblock("C")
    i, j, _ = sch.get_loops(block)
    sch.bind(i, "blockIdx.x")
    sch.bind(j, "threadIdx.x")
    # the sum in a register, written once
    sch.reverse_compute_at(sch.cache_write(block, 0, "local"), j)
    return sch


def export_tiny(folder: Path) -> Path:
    """A conv + relu + pool + dense MXNet graph exported to ``folder``; its symbol file."""
    from edgecv._mxnet import import_mxnet

    mx = import_mxnet()
    from mxnet import gluon

    net = gluon.nn.HybridSequential()
    net.add(
        gluon.nn.Conv2D(16, 3, padding=1, activation="relu"),
        gluon.nn.MaxPool2D(2),
        gluon.nn.Dense(10),
    )
    net.initialize(mx.init.Xavier(rnd_type="gaussian"))
    net.hybridize()
    net(mx.nd.ones((1, 8, 16, 16)))
    folder.mkdir(parents=True, exist_ok=True)
    net.export(str(folder / "tiny"))
    return folder / "tiny-symbol.json"


def target_of(kind: str) -> tvm.target.Target:
    from edgecv.profiles import load_profile

    return load_profile({"llvm": "cpu", "intel": "deeplens", "pocl": "aisage"}[kind]).tvm_target()
