"""The Intel-subgroup variant of a 1x1 conv, for measuring against edgecv's plain rule.

Work-items run along the output positions as in :mod:`edgecv.schedules.gpu.conv2d`,
each with a register tile of output channels; the difference is how the weights
arrive. The plain rule loads each weight as a uniform value (one broadcast load per
channel and input channel). Here the 16 lanes of a subgroup load 16 consecutive input
channels' weights of each output channel at once, one per lane (a contiguous vector),
and every FMA takes its weight from the right lane with ``intel_sub_group_shuffle``:
one vector load and 16 shuffles instead of 16 broadcast loads.

Kept out of the default rules: on Intel's CPU OpenCL runtime it measured slower than
the plain rule (``benchmarks/gpu_rules.py --subgroup``). It is the conv alone (no fused
epilogue), for ``C % 16 == 0``.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T


def i64(value: int):
    """A 64-bit index constant (OpenCL kernels index in 64 bits, see the codegen)."""
    return tirx.const(value, "int64")


def subgroup_pointwise(c: int, f: int, h: int, w: int, tile: int = 8, lanes: int = 16):
    """The PrimFunc ``main(x[1, c, h, w], weight[f, c, 1, 1], out[1, f, h, w])``."""
    if c % lanes or f % tile:
        raise ValueError(f"needs c % {lanes} == 0 and f % {tile} == 0 (c={c}, f={f})")
    positions = h * w
    threads = min(256, -(-positions // lanes) * lanes)  # whole subgroups
    groups = -(-positions // threads)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("main")
            T.func_attr({"tirx.is_scheduled": True, "global_symbol": "main", "tirx.noalias": True})
            x = T.match_buffer(T.arg("x", T.handle()), (1, c, h, w), "float32")
            weight = T.match_buffer(T.arg("weight", T.handle()), (f, c, 1, 1), "float32")
            out = T.match_buffer(T.arg("out", T.handle()), (1, f, h, w), "float32")
            xs = T.buffer_proxy(T.decl_buffer((c * positions,), "float32", data=x.data))
            ws = T.buffer_proxy(T.decl_buffer((f * c,), "float32", data=weight.data))
            outs = T.buffer_proxy(T.decl_buffer((f * positions,), "float32", data=out.data))
            bx, tx = T.env_thread("blockIdx.x", "int64"), T.env_thread("threadIdx.x", "int64")
            with T.launch_thread(bx, i64(groups * (f // tile))), T.launch_thread(tx, i64(threads)):
                first = bx // groups * tile
                p = bx % groups * threads + tx
                # lanes past the last position still take part in the shuffles
                at = p if positions % threads == 0 else T.min(p, i64(positions - 1))
                lane = tirx.Cast("int64", T.call_extern("uint32", "get_sub_group_local_id"))
                acc = T.buffer_proxy(T.alloc_buffer((tile,), "float32", scope="local"))
                mine = T.buffer_proxy(T.alloc_buffer((tile,), "float32", scope="local"))
                value = T.buffer_proxy(T.alloc_buffer((1,), "float32", scope="local"))
                for k in range(tile):
                    acc[k] = T.float32(0)
                with T.serial(i64(0), i64(c // lanes)) as step:
                    for k in range(tile):
                        mine[k] = ws[(first + k) * c + step * lanes + lane]
                    for j in range(lanes):
                        value[0] = xs[(step * lanes + j) * positions + at]
                        for k in range(tile):
                            weight_j = T.call_extern(
                                "float32", "intel_sub_group_shuffle", mine[k], T.uint32(j)
                            )
                            acc[k] = acc[k] + value[0] * weight_j
                with T.If(p < i64(positions)):
                    with T.Then():
                        for k in range(tile):
                            outs[(first + k) * positions + p] = acc[k]
    return ib.get()
