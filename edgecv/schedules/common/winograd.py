"""What the CPU and GPU Winograd rules share: the block names of the kernel
:mod:`edgecv.lowering.winograd` builds (not imported: the rules depend on TVM alone)
and its fused epilogue, applied as the output transform writes each pixel."""

from __future__ import annotations

from tvm import s_tir

INPUT_ROWS = "winograd_input_rows"
INPUT = "winograd_input"
GEMM = "winograd_gemm"
OUTPUT_COLS = "winograd_output_cols"
OUTPUT = "winograd_output"
NAMES = (INPUT_ROWS, INPUT, GEMM, OUTPUT_COLS, OUTPUT)


def take_epilogue(sch: s_tir.Schedule, blocks: list, names: list[str]) -> bool:
    """Inline the blocks after the output transform (bias, activation, residual add)
    into it: one nest, as the one-reduction rules make it. False, leaving ``sch`` as it
    was, when one of them changes the shape (a reshaping consumer: not a Winograd
    kernel's epilogue)."""
    at = names.index(OUTPUT)
    shape = [int(d) for d in sch.get(blocks[at]).writes[0].source.shape]
    epilogue = blocks[at + 1 :]
    if any([int(d) for d in sch.get(b).writes[0].source.shape] != shape for b in epilogue):
        return False
    for block in epilogue[:-1]:
        sch.compute_inline(block)
    if epilogue:
        sch.reverse_compute_inline(epilogue[-1])
    return True
