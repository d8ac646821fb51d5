"""The tensor intrinsics of the CPU's 8-bit dot products (:mod:`.dot_product` says which
instruction a target has): each a TIR description of ``lanes`` int32 accumulators
adding four u8 x s8 products, and its implementation on the instruction, for the rule
(:mod:`.conv2d_int8`) to tensorize its innermost ``L x 4`` multiply-accumulate with.
"""

from __future__ import annotations

from tvm import s_tir
from tvm.script import tirx as T

from .dot_product import (
    AVX2_DOT,
    AVX2_PAIRS,
    AVX512_DOT,
    AVX512_PAIRS,
    AVX_VNNI_DOT,
    NEON_SDOT,
    VNNI_DOT,
)


def _description(lanes: int):
    @T.prim_func(s_tir=True)
    def description(
        A: T.Buffer((4,), "uint8", offset_factor=1),
        B: T.Buffer((lanes, 4), "int8", offset_factor=1),
        C: T.Buffer((lanes,), "int32", offset_factor=1, scope="local"),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:4], B[0:lanes, 0:4])
            T.writes(C[0:lanes])
            for i in T.serial(0, lanes):
                for k in T.serial(0, 4):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")

    return description


def _quad(A, offset: int, lanes: int):
    """The four data bytes at ``offset`` of ``A`` in every int32 lane, as bytes (what
    each step multiplies with ``lanes x 4`` weights; called while TVMScript parses)."""
    return T.reinterpret(
        T.broadcast(T.reinterpret(A.vload([offset], "uint8x4"), dtype="int32"), lanes),
        dtype=f"uint8x{4 * lanes}",
    )


def _madd_bytes(intrinsic: str, quad, B, index: list, lanes: int):
    """``vpmaddubsw``: u8 x s8 products of ``quad`` and the weights at ``index``, pairs
    of them summed in int16."""
    return T.call_llvm_pure_intrin(
        T.llvm_lookup_intrinsic_id(intrinsic),
        quad,
        B.vload(index, dtype=f"int8x{4 * lanes}"),
        dtype=f"int16x{2 * lanes}",
    )


def _widen(intrinsic: str, pairs, lanes: int):
    """``vpmaddwd`` by ones: each two int16 pair sums added into an int32 lane."""
    return T.call_llvm_pure_intrin(
        T.llvm_lookup_intrinsic_id(intrinsic),
        pairs,
        T.broadcast(T.int16(1), 2 * lanes),
        dtype=f"int32x{lanes}",
    )


def _pmaddubsw(lanes: int, madd_bytes: str, madd_words: str):
    """u8 x s8 pairs summed in int16 (``vpmaddubsw``), int16 pairs summed into int32
    with a multiply by ones (``vpmaddwd``), added to the accumulator."""

    @T.prim_func(s_tir=True)
    def implementation(
        A: T.Buffer((4,), "uint8", offset_factor=1),
        B: T.Buffer((lanes, 4), "int8", offset_factor=1),
        C: T.Buffer((lanes,), "int32", offset_factor=1, scope="local"),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:4], B[0:lanes, 0:4])
            T.writes(C[0:lanes])
            pairs = _madd_bytes(madd_bytes, _quad(A, 0, lanes), B, [0, 0], lanes)
            C[T.ramp(T.int32(0), 1, lanes)] += _widen(madd_words, pairs, lanes)

    return implementation


def _one_instruction(lanes: int, intrinsic: str, data: str = "uint8"):
    """One instruction that adds four byte products into each int32 lane of the
    accumulator: ``vpdpbusd`` (u8 x s8) in 512 bits (AVX-512 VNNI) or 256 (AVX-VNNI,
    whose VEX form LLVM emits for the 256-bit intrinsic when the target has no
    AVX-512), ARM's ``sdot`` (s8 x s8: ``data`` ``int8``, the 7-bit data's bytes read as
    int8)."""
    i32 = f"int32x{lanes}"

    @T.prim_func(s_tir=True)
    def implementation(
        A: T.Buffer((4,), "uint8", offset_factor=1),
        B: T.Buffer((lanes, 4), "int8", offset_factor=1),
        C: T.Buffer((lanes,), "int32", offset_factor=1, scope="local"),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:4], B[0:lanes, 0:4])
            T.writes(C[0:lanes])
            # LLVM 22 (TVM 0.27's) takes the bytes as <64 x i8>; TVM's own VNNI intrinsic
            # still passes <16 x i32> and fails LLVM's verifier
            C[T.ramp(T.int32(0), 1, lanes)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(intrinsic),
                C.vload([0], dtype=i32),
                T.reinterpret(_quad(A, 0, lanes), dtype=f"{data}x{4 * lanes}"),
                B.vload([0, 0], dtype=f"int8x{4 * lanes}"),
                dtype=i32,
            )

    return implementation


def _pairs_description(lanes: int):
    @T.prim_func(s_tir=True)
    def description(
        A: T.Buffer((8,), "uint8", offset_factor=1),
        B: T.Buffer((2, lanes, 4), "int8", offset_factor=1),
        C: T.Buffer((lanes,), "int32", offset_factor=1, scope="local"),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:8], B[0:2, 0:lanes, 0:4])
            T.writes(C[0:lanes])
            for q in T.serial(0, 2):
                for i in T.serial(0, lanes):
                    for k in T.serial(0, 4):
                        with T.sblock("update"):
                            vi, vq, vk = T.axis.remap("SRR", [i, q, k])
                            C[vi] = C[vi] + T.cast(A[vq * 4 + vk], "int32") * T.cast(
                                B[vq, vi, vk], "int32"
                            )

    return description


def _pairs(lanes: int, madd_bytes: str, madd_words: str):
    """Two steps of :func:`_pmaddubsw` whose int16 pair sums are added in int16 before
    one ``vpmaddwd`` widens them: 3 multiplies per 8 input channels instead of 4. Exact
    when data <= 127 and weights <= 63 (2 x 2 x 127 x 63 = 32,004)."""

    @T.prim_func(s_tir=True)
    def implementation(
        A: T.Buffer((8,), "uint8", offset_factor=1),
        B: T.Buffer((2, lanes, 4), "int8", offset_factor=1),
        C: T.Buffer((lanes,), "int32", offset_factor=1, scope="local"),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:8], B[0:2, 0:lanes, 0:4])
            T.writes(C[0:lanes])
            pairs = _madd_bytes(madd_bytes, _quad(A, 0, lanes), B, [0, 0, 0], lanes) + _madd_bytes(
                madd_bytes, _quad(A, 4, lanes), B, [1, 0, 0], lanes
            )
            C[T.ramp(T.int32(0), 1, lanes)] += _widen(madd_words, pairs, lanes)

    return implementation


def register_intrinsics() -> None:
    """Register edgecv's dot-product intrinsics with TVM (once per process). TVM's own
    (``tvm.s_tir.tensor_intrin.x86``, no AVX2 one) are not imported: importing that
    package registers every target's intrinsics, which takes tens of seconds
    (benchmarks/results/int8_cpu-2026-11-26-zen3.md)."""
    if s_tir.TensorIntrin.get(AVX2_DOT, allow_missing=True) is not None:
        return
    s_tir.TensorIntrin.register(
        AVX2_DOT,
        _description(8),
        _pmaddubsw(8, "llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd"),
    )
    s_tir.TensorIntrin.register(
        AVX512_DOT,
        _description(16),
        _pmaddubsw(16, "llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512"),
    )
    for name, lanes, intrinsic, data in (
        (VNNI_DOT, 16, "llvm.x86.avx512.vpdpbusd.512", "uint8"),
        (AVX_VNNI_DOT, 8, "llvm.x86.avx512.vpdpbusd.256", "uint8"),
        (NEON_SDOT, 4, "llvm.aarch64.neon.sdot.v4i32.v16i8", "int8"),
    ):
        s_tir.TensorIntrin.register(
            name, _description(lanes), _one_instruction(lanes, intrinsic, data)
        )
    s_tir.TensorIntrin.register(
        AVX2_PAIRS,
        _pairs_description(8),
        _pairs(8, "llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd"),
    )
    s_tir.TensorIntrin.register(
        AVX512_PAIRS,
        _pairs_description(16),
        _pairs(16, "llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512"),
    )
