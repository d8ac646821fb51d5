"""What a CPU can do for INT8: its 8-bit dot-product instruction, described once for the
INT8 step (:mod:`edgecv.pipelines.int8`), the graph tuner, the lowering and the rule
that schedules on it (:mod:`.conv2d_int8`); their tensor intrinsics are
:mod:`.tensor_intrin` (as TVM keeps ``tir/tensor_intrin/x86.py`` apart from its rules).

Written as they are, ``conv2d(uint8, int8, out_dtype=int32)`` convolutions multiply in
int32 lanes: 8 products per AVX2 instruction where float32 has 8 fused multiply-adds,
so an INT8 package ran at about half the float32 one's speed
(benchmarks/results/int8_cpu-2026-11-26-zen3.md). The instructions made for it multiply
four u8 x s8 pairs and add them into each int32 lane:

=====================  =========================================  ==================
target features        instructions (one int32 lane += 4 pairs)   lanes (int32)
=====================  =========================================  ==================
avx512vnni             ``vpdpbusd`` (one instruction)             16
avx512bw               ``vpmaddubsw`` + ``vpmaddwd`` (ones)        16
avxvnni (Alder Lake)   ``vpdpbusd`` (VEX, 256 bits)               8
avx2 (Zen 3)           ``vpmaddubsw`` + ``vpmaddwd`` (ones)        8
aarch64 dotprod        ``sdot`` (one instruction, s8 x s8)         4
=====================  =========================================  ==================

ARM's ``sdot`` (Cortex-A76/A78, Neoverse N1 and later: the Jetson Orin's CPU; not the
Cortex-A57/A72 of the Jetson Nano and the AI-Sage board, which keep the generic rules)
multiplies signed bytes by signed bytes: the INT8 step gives every tensor such a kernel
reads 7-bit data (0..127), whose bytes read the same as uint8 or int8, and the weights
keep 8 bits (no int16 step to saturate).

``vpmaddubsw`` adds each two u8 x s8 products in int16 with saturation: with weights
of 7 bits (|w| <= 63) two products stay within it (2 x 255 x 63 = 32130 < 32767), so on
targets without VNNI the INT8 step quantizes weights to 7 bits
(:func:`dot_product_of` says how many; the bit lost barely moves MobileNet1.0's
logits: benchmarks/results/int8_cpu-2026-11-26-zen3.md).

Those two instructions are both multiplies, and the CPU has two multiply ports: 32
u8 x s8 products per two multiplies. With 7-bit data as well (0..127), two steps'
int16 pair sums add up without overflow (2 x 2 x 127 x 63 = 32,004), so a packed
kernel can sum the pair sums of two steps with one ``vpaddw`` and widen them with one
``vpmaddwd``: three multiplies per 64 products instead of four (the ``*_PAIRS``
intrinsics, weights packed ``[O/L, C/8, KH, KW, 2, L, 4]`` by the legalization's
``int8_pairs``). The 3x3 convolutions gain most from it, the 1x1s little, and 7-bit data
costs accuracy (benchmarks/results/int8_cpu-2026-11-27-zen3.md, section 3), so the INT8
step gives 7 bits to the tensors spatial convolutions read
(:func:`edgecv.lowering.legalize.sums_in_pairs`) and keeps 8 for the 1x1s.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm.target.codegen import target_has_features

# the tensor intrinsics' names (registered by edgecv.schedules.cpu.tensor_intrin)
AVX2_DOT = "edgecv_dot_8x4_u8i8i32_avx2"
AVX512_DOT = "edgecv_dot_16x4_u8i8i32_avx512"
VNNI_DOT = "edgecv_dot_16x4_u8i8i32_vnni"
AVX_VNNI_DOT = "edgecv_dot_8x4_u8i8i32_avxvnni"
AVX2_PAIRS = "edgecv_dot_8x2x4_u7i7i32_avx2"
AVX512_PAIRS = "edgecv_dot_16x2x4_u7i7i32_avx512"
NEON_SDOT = "edgecv_dot_4x4_u7i8i32_sdot"


@dataclass(frozen=True)
class DotProduct:
    """The int8 dot-product instruction a target has: its tensor intrinsic, int32
    lanes, the largest weight magnitude it multiplies without saturating, and the
    intrinsic that sums two steps in int16 before widening them (``vpmaddubsw``
    targets; None with VNNI), exact for data of 7 bits (0..127); ``signed_bytes``: the
    instruction multiplies the data as int8 (``sdot``), so every kernel on it reads
    7-bit data."""

    intrinsic: str
    lanes: int
    weight_max: int
    pairs: str | None = None
    signed_bytes: bool = False

    @property
    def data_max(self) -> int:
        """The largest uint8 value the INT8 step gives the data of the kernels that need
        7 bits (:meth:`seven_bit_data`); 255 when none does."""
        return 127 if self.pairs or self.signed_bytes else 255

    def seven_bit_data(self, in_pairs: bool) -> bool:
        """Whether a kernel on this instruction reads data of 7 bits: every kernel where
        the instruction multiplies signed bytes, those that sum two steps in int16
        (``in_pairs``: :func:`edgecv.lowering.legalize.sums_in_pairs`) where it pairs."""
        return self.signed_bytes or (self.pairs is not None and in_pairs)


def dot_product_of(target: tvm.target.Target) -> DotProduct | None:
    """The dot product of ``target`` (see the module docstring), None when it has none
    edgecv uses (the generic rules then compute in int32 lanes)."""
    if str(target.kind.name) != "llvm":
        return None
    with target:
        if target_has_features("avx512vnni", target):
            return DotProduct(VNNI_DOT, 16, 127)
        if target_has_features("avx512bw", target):
            return DotProduct(AVX512_DOT, 16, 63, AVX512_PAIRS)
        if target_has_features("avxvnni", target):  # Alder Lake and its Atoms (N100)
            return DotProduct(AVX_VNNI_DOT, 8, 127)
        if target_has_features("avx2", target):
            return DotProduct(AVX2_DOT, 8, 63, AVX2_PAIRS)
        if target_has_features("dotprod", target):  # AArch64 (ARMv8.2's optional sdot)
            return DotProduct(NEON_SDOT, 4, 127, signed_bytes=True)
    return None


def int8_lowering(dot: DotProduct | None) -> tuple[int | None, bool]:
    """The lowering's ``int8_block`` and ``int8_pairs`` for a build whose uint8 x int8
    convolutions run on ``dot`` (None: a float32 build, or a CPU without one): the block
    they are lowered and laid out for (its int32 lanes), and whether their packed
    weights come in pairs of steps summed in int16 (7-bit data). One answer for the
    graph tuner and the lowering."""
    return (dot.lanes, dot.pairs is not None) if dot else (None, False)


def runs_on_dot_product(
    weight_shape: tuple[int, ...], groups: int, input_dtype: str, dot: DotProduct
) -> bool:
    """Whether a quantized conv2d (OIHW ``weight_shape``) will be scheduled by
    :class:`~.conv2d_int8.Conv2DInt8` with ``dot``: the INT8 step quantizes the weights
    of exactly these to ``dot.weight_max``."""
    out_channels, in_channels = weight_shape[0], weight_shape[1]
    return (
        groups == 1
        and input_dtype == "uint8"
        and out_channels % dot.lanes == 0
        and in_channels % 4 == 0
    )
