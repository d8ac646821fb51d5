"""Intel-subgroup builtins as TIR calls, for the subgroup variants of the GPU operators.

A subgroup is the set of work-items the device runs in one SIMD instruction stream (16
on the Intel Graphics of the deeplens profile). OpenCL exposes it with
``cl_intel_subgroups`` (shuffles) and ``cl_khr_subgroups`` (scans, reductions,
broadcast, any): data moves between the work-items of a subgroup in registers, with
no local memory and no barrier. The variants that use these calls are chosen only for
OpenCL targets whose profile says ``"intel_subgroups": true`` (see
:mod:`edgecv.codegen.op_versions`), and their kernels are compiled for exactly the
profile's subgroup size (``intel_reqd_sub_group_size``, added by
:func:`edgecv.codegen.opencl.build_opencl`), so the emitters may unroll over it.

Rules every emitter here follows, because these are collective operations:

- call them where every work-item of the subgroup is active (never under a branch
  that depends on the work-item), and keep them out of ``Select`` arms (TVM may turn a
  ``Select`` with calls into a branch); store the result in a local first;
- a work-group of a 1-D launch is cut into subgroups of consecutive local ids, so
  work-item ``tx`` is lane ``tx % size`` of subgroup ``tx // size`` (Intel's
  extension defines this mapping) and ``tx ^ m`` for ``m < size`` is in the same
  subgroup.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

__all__ = [
    "any_of",
    "barrier",
    "broadcast",
    "check_subgroup",
    "lane",
    "reduce_add",
    "scan_exclusive_add",
    "scan_inclusive_add",
    "shuffle_xor",
]

GLOBAL_FENCE = 2  # CLK_GLOBAL_MEM_FENCE
LOCAL_FENCE = 1  # CLK_LOCAL_MEM_FENCE


def check_subgroup(subgroup: int | None, threads: int, what: str) -> None:
    """``subgroup`` is None or a power of two dividing the work-group size."""
    if subgroup is None:
        return
    if subgroup < 2 or subgroup & (subgroup - 1) or threads % subgroup:
        raise ValueError(
            f"{what}: subgroup size {subgroup} must be a power of two >= 2 dividing the "
            f"work-group size {threads}"
        )


def _dtype(value) -> str:
    return str(value.ty)


def lane():
    """This work-item's index in its subgroup."""
    return T.call_extern("int32", "get_sub_group_local_id")


def scan_inclusive_add(value):
    return T.call_extern(_dtype(value), "sub_group_scan_inclusive_add", value)


def scan_exclusive_add(value):
    return T.call_extern(_dtype(value), "sub_group_scan_exclusive_add", value)


def reduce_add(value):
    return T.call_extern(_dtype(value), "sub_group_reduce_add", value)


def broadcast(value, source_lane):
    """``value`` of lane ``source_lane`` (the same on every work-item) to all lanes."""
    return T.call_extern(_dtype(value), "sub_group_broadcast", value, source_lane)


def shuffle_xor(value, mask):
    """``value`` of lane ``lane ^ mask`` (Intel's shuffle: any lane, in registers)."""
    mask = tirx.Cast("uint32", mask)
    return T.call_extern(_dtype(value), "intel_sub_group_shuffle_xor", value, mask)


def any_of(flag):
    """1 on every lane when ``flag`` (int32) is non-zero on some lane, else 0."""
    return T.call_extern("int32", "sub_group_any", flag)


def barrier(fence: int = GLOBAL_FENCE) -> None:
    """Order the subgroup's memory accesses (``fence``: 1 local, 2 global, 3 both)."""
    T.evaluate(T.call_extern("void", "sub_group_barrier", tirx.const(fence, "uint32")))
