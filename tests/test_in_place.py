"""Outputs written over inputs: which inputs a kernel allows (edgecv.lowering.in_place)
and where the memory plan takes them up."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax, te, tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from edgecv.lowering import lower
from edgecv.lowering.in_place import concat_pieces, elementwise_inputs

N, K = 8, 16


def matmul(a, b):
    k = te.reduce_axis((0, K), name="k")
    return te.compute((N, N), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="mm")


def residual_func(shortcut_read, shortcut_shape=(N, N)):
    """``relu(a @ b + f(shortcut))`` as one PrimFunc: params (a, b, shortcut, out)."""
    a, b = te.placeholder((N, K), name="a"), te.placeholder((K, N), name="b")
    shortcut = te.placeholder(shortcut_shape, name="shortcut")
    product = matmul(a, b)
    added = te.compute((N, N), lambda i, j: product[i, j] + shortcut_read(shortcut, i, j))
    out = te.compute((N, N), lambda i, j: te.max(added[i, j], tirx.const(0.0)), name="out")
    return te.create_prim_func([a, b, shortcut, out])


def test_a_residual_add_may_be_written_over_its_shortcut():
    assert elementwise_inputs(residual_func(lambda s, i, j: s[i, j])) == [2]


@pytest.mark.parametrize(
    "read, shape",
    [
        (lambda s, i, j: s[i, j] + s[i, te.max(j - 1, 0)], (N, N)),  # a neighbour too
        (lambda s, i, j: s[j, i], (N, N)),  # transposed
        (lambda s, i, j: s[0, j], (1, N)),  # broadcast: another shape
    ],
    ids=["neighbour", "transposed", "broadcast"],
)
def test_a_shortcut_read_elsewhere_than_the_element_written_is_not(read, shape):
    assert elementwise_inputs(residual_func(read, shape)) == []


def test_an_input_also_reduced_is_not():
    a, b = te.placeholder((N, K), name="a"), te.placeholder((K, N), name="b")
    shortcut = te.placeholder((N, N), name="shortcut")
    k = te.reduce_axis((0, N), name="k")
    total = te.compute((N,), lambda i: te.sum(shortcut[i, k], axis=k), name="total")
    product = matmul(a, b)
    out = te.compute((N, N), lambda i, j: product[i, j] + shortcut[i, j] + total[i], name="out")
    assert elementwise_inputs(te.create_prim_func([a, b, shortcut, out])) == []


def test_the_input_of_a_matmul_of_the_output_shape_is_not():
    """``b`` has the output's shape but is read along a reduction."""
    a, b = te.placeholder((N, N), name="a"), te.placeholder((N, N), name="b")
    k = te.reduce_axis((0, N), name="k")
    out = te.compute((N, N), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="out")
    assert elementwise_inputs(te.create_prim_func([a, b, out])) == []


def test_two_inputs_of_an_add_both_may_be_written_over():
    a, b = te.placeholder((N, N), name="a"), te.placeholder((N, N), name="b")
    out = te.compute((N, N), lambda i, j: a[i, j] + b[i, j], name="out")
    assert elementwise_inputs(te.create_prim_func([a, b, out])) == [0, 1]


def test_a_kernel_of_plain_loops_gives_none():
    a = te.placeholder((N, N), name="a")

    def body(ins, outs):
        with IRBuilder() as ib:
            with T.serial(0, N * N) as i:
                T.buffer_store(outs[0], ins[0][i // N, i % N], [i // N, i % N])
        return ib.get()

    out = te.extern((N, N), [a], body, name="copy", dtype="float32")
    assert elementwise_inputs(te.create_prim_func([a, out])) == []


def residual_module(shortcut_used_later: bool) -> relax.Function:
    """conv -> relu -> conv + shortcut -> relu (-> conv + shortcut: the shortcut read by
    a later kernel too)."""
    bb = relax.BlockBuilder()
    x = relax.Var("data", relax.TensorType((1, 8, 16, 16), "float32"))
    w = relax.const(np.random.RandomState(0).normal(size=(8, 8, 3, 3)).astype(np.float32))
    with bb.function("main", [x]):
        with bb.dataflow():
            shortcut = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=1)))
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(shortcut, w, padding=1)))
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(y, w, padding=1)))
            y = bb.emit(relax.op.nn.relu(relax.op.add(y, shortcut)))
            if shortcut_used_later:
                y = bb.emit(relax.op.add(relax.op.nn.conv2d(y, w, padding=1), shortcut))
            gv = bb.emit_output(y)
        bb.emit_func_output(gv)
    return bb.get()


@pytest.mark.parametrize("later", [False, True], ids=["dies", "read-later"])
def test_the_plan_writes_a_residual_add_over_its_shortcut_where_it_dies(later):
    plan = lower(residual_module(later)).plan
    add = next(s for s in plan.steps if s.kernel.endswith("conv2d_relu_add_relu"))
    shortcut, out = add.args[add.elementwise_inputs[0]], add.args[-1]
    assert plan.buffers[shortcut].id == plan.steps[0].args[-1]  # the first conv's output
    shared = plan.buffers[shortcut].storage == plan.buffers[out].storage
    assert shared is not later


# -- concatenations written in place ------------------------------------------------


def concat_module(shape=(1, 4, 8, 8), axis=1, fused=False, later=False, twice=False):
    """Three kernels of different kinds (a conv, a pool, a conv of 3 outputs) joined by
    a concat; ``fused``: the input doubled instead of the last conv (computed in the
    concat's kernel); ``later``: the
    pool's output read again after the concat; ``twice``: the concat's output joined
    again with the input's conv (a concat of a concat)."""
    bb = relax.BlockBuilder()
    x = relax.Var("data", relax.TensorType(shape, "float32"))
    rng = np.random.RandomState(0)
    c = shape[1]
    w1 = relax.const(rng.normal(size=(2, c, 1, 1)).astype(np.float32))
    w3 = relax.const(rng.normal(size=(3, c, 3, 3)).astype(np.float32))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.conv2d(x, w1))
            b = bb.emit(relax.op.nn.max_pool2d(x, (3, 3), padding=1))
            d = bb.emit(relax.op.nn.conv2d(x, w3, padding=1))
            if fused:  # an input scaled on the way: FuseOps puts it in the concat's kernel
                d = bb.emit(relax.op.multiply(x, relax.const(2.0)))
            y = bb.emit(relax.op.concat([a, b, d], axis=axis))
            if later:
                y = bb.emit(relax.op.add(relax.op.sum(y), relax.op.sum(b)))
            gv = bb.emit_output(y)
        bb.emit_func_output(gv)
    return bb.get()


def concat_kernel(lowered):
    return next(f for gv, f in lowered.kernels.functions.items() if "concat" in gv.name_hint)


def test_a_channel_concat_of_batch_one_gives_each_input_its_byte_offset():
    # 2, 4 and 3 channels of 8x8 floats
    assert concat_pieces(concat_kernel(lower(concat_module()))) == [0, 512, 1536]


def pools_concat(axis, shape=(1, 4, 6, 6)):
    bb = relax.BlockBuilder()
    x = relax.Var("data", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.max_pool2d(x, (3, 3), padding=1))
            b = bb.emit(relax.op.nn.avg_pool2d(x, (3, 3), padding=1))
            gv = bb.emit_output(relax.op.concat([a, b], axis=axis))
        bb.emit_func_output(gv)
    return bb.get()


def test_a_concat_along_rows_of_a_map_of_one_channel_gives_offsets():
    assert concat_pieces(concat_kernel(lower(pools_concat(2, (1, 1, 6, 6))))) == [0, 144]


@pytest.mark.parametrize(
    "module",
    [lambda: concat_module(shape=(2, 4, 6, 6)), lambda: pools_concat(2)],
    ids=["batch-2", "rows-of-4-channels"],
)
def test_a_concat_of_scattered_pieces_gives_none(module):
    assert concat_pieces(concat_kernel(lower(module()))) == []


def test_a_concat_computing_more_gives_none():
    """One input doubled on its way into the concatenation's output."""
    a = te.placeholder((1, 2, 4, 4), name="a")
    b = te.placeholder((1, 3, 4, 4), name="b")
    out = te.compute(
        (1, 5, 4, 4),
        lambda n, c, h, w: tirx.if_then_else(c < 2, a[n, c, h, w], b[n, c - 2, h, w] * 2.0),
        name="out",
    )
    assert concat_pieces(te.create_prim_func([a, b, out])) == []


def test_fusion_leaves_a_concat_whose_pieces_can_be_written_in_place_alone():
    """FuseOps would put the doubling of the concat's last input in the concat's kernel;
    kept alone, the concat is elided and the doubling writes its piece in place."""
    lowered = lower(concat_module(fused=True))
    assert concat_pieces(concat_kernel(lowered)) == [0, 512, 1536]
    (concat,) = [s for s in lowered.plan.steps if s.pieces]
    assert concat.elided


def test_a_kernel_that_is_no_concat_gives_none():
    assert concat_pieces(residual_func(lambda s, i, j: s[i, j])) == []


@pytest.mark.parametrize(
    "kwargs, elided",
    [({}, True), ({"later": True}, True), ({"shape": (1, 4, 6, 6)}, False)],
    ids=["concat", "input-read-after", "unaligned-offsets"],
)
def test_a_plan_with_its_concat_written_in_place_computes_what_relax_computes(kwargs, elided):
    """The kernels (LLVM, unscheduled) run by the executor over the memory plan,
    against Relax's own VM on the same module. 6x6 maps put the second input 288 bytes
    in: not 64-byte aligned, so that concat runs."""
    import tvm

    from edgecv.board.runtime.cpu import CPUBackend
    from edgecv.board.runtime.executor import Executor

    module = concat_module(**kwargs)
    lowered = lower(module)
    plan = lowered.plan
    (concat,) = [s for s in plan.steps if s.pieces]
    assert concat.elided is elided
    out = plan.buffers[concat.args[-1]]
    for arg, offset in zip(concat.args[:-1], concat.pieces, strict=True):
        piece = plan.buffers[arg]
        assert (piece.piece_of, piece.storage) == (
            (out.id, out.storage) if elided else (None, piece.storage)
        )
        assert piece.offset == (out.offset + offset if elided else 0)
    executor = Executor(
        plan, CPUBackend(tvm.compile(lowered.kernels, target="llvm")), lowered.constants
    )
    assert executor.num_launches == len(plan.steps) - elided
    x = np.random.RandomState(0).normal(size=kwargs.get("shape", (1, 4, 8, 8))).astype(np.float32)
    vm = relax.VirtualMachine(tvm.compile(module, target="llvm"), tvm.cpu())
    want = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_array_equal(executor.run([x])[0], want)


def test_a_concat_fused_with_all_its_producers_stays_fused():
    """Both inputs computed in the concatenation's kernel (SSD's heads: a transpose
    each): taking it out would add two launches and save no memory."""
    bb = relax.BlockBuilder()
    x = relax.Var("data", relax.TensorType((1, 4, 8, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.multiply(x, relax.const(2.0)))
            b = bb.emit(relax.op.multiply(x, relax.const(3.0)))
            gv = bb.emit_output(relax.op.concat([a, b], axis=1))
        bb.emit_func_output(gv)
    lowered = lower(bb.get())
    assert len(lowered.plan.steps) == 1, [s.kernel for s in lowered.plan.steps]
    assert concat_pieces(concat_kernel(lowered)) == []
