"""Outputs written over inputs: which inputs a kernel allows (edgecv.lowering.in_place)
and where the memory plan takes them up."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax, te, tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from edgecv.lowering import lower
from edgecv.lowering.in_place import elementwise_inputs

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
