"""The CPU's INT8 tensor intrinsics (edgecv/schedules/cpu/tensor_intrin.py) are registered
by the INT8 rule only for a kernel that is its own: registering parses their TVMScript
(seconds), and a deploy schedules each kernel in a child process of its own, so a float
kernel that came down the rules past the INT8 rule paid it once per kernel. Checked in a
fresh interpreter: in the test process an earlier INT8 test has registered them already.
That the INT8 rule still tensorizes its kernels: tests/test_int8.py, tests/test_onnx_qdq.py."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
from tvm import s_tir, te

from edgecv.profiles import load_profile
from edgecv.schedules.cpu.dot_product import dot_product_of
from edgecv.schedules.cpu.tensor_intrin import AVX2_DOT
from edgecv.schedules.orders import cpu_order

target = load_profile("cpu").tvm_target()
a = te.placeholder((16, 32), "float32", name="a")
b = te.placeholder((8, 32), "float32", name="b")
k = te.reduce_axis((0, 32), name="k")
dense = te.compute((16, 8), lambda i, j: te.sum(a[i, k] * b[j, k], axis=k), name="dense")
func = te.create_prim_func([a, b, dense])
order = cpu_order(target)
chosen = next(c for c in order.attempts(func) if c.func is not None)
registered = s_tir.TensorIntrin.get(AVX2_DOT, allow_missing=True) is not None
print(dot_product_of(target) is not None, registered, *order.names(func)[: chosen.index + 1])
"""


def test_a_float_kernel_does_not_register_the_int8_intrinsics():
    ran = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300
    )
    assert ran.returncode == 0, ran.stderr
    has_dot, registered, *asked = ran.stdout.split()
    assert has_dot == "True", "the cpu profile's target has a dot product: the rule is asked"
    assert "cpu.Conv2DInt8" in asked[:-1], asked  # the INT8 rule asked, not the chosen one
    assert registered == "False", asked
