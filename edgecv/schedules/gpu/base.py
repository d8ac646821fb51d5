"""What edgecv's GPU schedule rules share: the rule base class, target limits, and
inlining of the injective blocks around a kernel's main block."""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight import ScheduleRule
from tvm.target import Target

# The function attribute dlight's ApplyDefaultSchedule sets on what it scheduled and
# checks to skip functions already scheduled (TVM 0.27).
SCHEDULED = "tirx.is_scheduled"


class GPURule(ScheduleRule):
    """A rule for OpenCL and CUDA targets; ``apply`` returns None on other targets."""

    def is_target_available(self, target: Target) -> bool:
        return "gpu" in target.keys

    @staticmethod
    def new_schedule(func: tirx.PrimFunc) -> s_tir.Schedule:
        """A schedule of ``func`` whose result is marked scheduled (schedule primitives
        keep function attributes), so a later dlight pass leaves it alone."""
        return s_tir.Schedule(func.with_attr(SCHEDULED, True))


def max_threads(target: Target) -> int:
    """The work-group size limit of ``target`` (its ``max_num_threads``)."""
    for name in ("max_threads_per_block", "max_num_threads"):
        value = target.attrs.get(name)
        if value is not None:
            return int(value)
    return 1024 if target.kind.name == "cuda" else 256


def extent(sch: s_tir.Schedule, loop) -> int:
    """A loop's constant extent (the rules only take static shapes)."""
    value = sch.get(loop).extent
    if not isinstance(value, tirx.IntImm):
        raise ValueError(f"loop extent {value} is not a constant")
    return int(value)


def iter_kinds(sch: s_tir.Schedule, block) -> str:
    """``"SSSSRRR"``: each block iterator spatial (S), reduction (R) or other (O)."""
    kinds = {tirx.IterVar.DataPar: "S", tirx.IterVar.CommReduce: "R"}
    return "".join(kinds.get(int(v.iter_type), "O") for v in sch.get(block).iter_vars)


def blocks(sch: s_tir.Schedule) -> list:
    """The root block's children, in program order."""
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def is_spatial(sch: s_tir.Schedule, block) -> bool:
    return set(iter_kinds(sch, block)) <= {"S"}


def inline_around(sch: s_tir.Schedule, main, found: list, keep_input: bool = False):
    """Inline every block before ``main`` into its consumers (padding, casts) and every
    block after it but the last into the last (bias, BatchNorm affine, activations,
    residual adds). Returns ``(input, output)``: with ``keep_input`` the block that
    writes ``main``'s first input (the padding, kept so it can be staged in
    registers), and the last block (it writes the output); each None when there is
    none (``main`` reads a parameter, writes the output itself). Raises when a block
    will not inline."""
    index = [sch.get(b).same_as(sch.get(main)) for b in found].index(True)
    before, after = found[:index], found[index + 1 :]
    data = sch.get(main).reads[0].source
    kept = None
    for block in reversed(before):
        if keep_input and kept is None and sch.get(block).writes[0].source.same_as(data):
            kept = block
        else:
            sch.compute_inline(block)
    for block in after[:-1]:
        sch.compute_inline(block)
    return kept, (after[-1] if after else None)
