"""CPU rule: INT8 convolution (uint8 data x int8 weights -> int32) on the CPU's
dot-product instructions, through TVM tensor intrinsics.

The INT8 step of the CPU pipeline (:mod:`edgecv.pipelines.int8`) leaves NCHW
convolutions ``conv2d(uint8, int8, out_dtype=int32)`` with their requantization,
BatchNorm, activation and the next layer's quantization fused after them. Written as
they are, LLVM multiplies them in int32 lanes: 8 products per AVX2 instruction where
float32 has 8 fused multiply-adds, so an INT8 package ran about 2x *slower* than the
float32 one (MobileNet1.0 on Zen 3: 86 ms vs 40 ms). The instructions made for it
multiply four u8 x s8 pairs and add them into each int32 lane:

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
(:func:`dot_product_of` says how many: measured on MobileNet1.0, the logit error
grew from 4.30% to 4.40% rms of the output's scale).

Those two instructions are both multiplies, and the CPU has two multiply ports: 32
u8 x s8 products per two multiplies. With 7-bit data as well (0..127), two steps'
int16 pair sums add up without overflow (2 x 2 x 127 x 63 = 32,004), so a packed
kernel can sum the pair sums of two steps with one ``vpaddw`` and widen them with one
``vpmaddwd``: three multiplies per 64 products instead of four (the ``*_PAIRS``
intrinsics, weights packed ``[O/L, C/8, KH, KW, 2, L, 4]`` by the legalization's
``int8_pairs``). Zen 3, one kernel alternating with the one-step kernel: 3x3
convolutions 1.14-1.39x faster (ResNet-50's 256 -> 256 at 14x14 0.830 -> 0.726 ms,
512 -> 512 at 7x7 1.023 -> 0.736), 1x1 1.04-1.07x, a stride-2 1x1 unchanged. The INT8
step therefore gives 7 bits to the tensors spatial convolutions read
(:func:`edgecv.lowering.legalize.sums_in_pairs`) and keeps 8 for the 1x1s: with 7 bits
everywhere MobileNet1.0 (whose 3x3s are depthwise) gained 3% and its logit error grew
from 4.84% to 5.08% rms.

The schedule is :mod:`.conv2d`'s register tile with the input channel split in fours:
the data is repacked ``[N, C/4, H, W, 4]`` (the padding written straight into that
layout when there is any), the weights ``[O/L, C/4, KH, KW, L, 4]`` (at build time by
the legalization, :func:`edgecv.lowering.legalize.conv2d_int8_packed`, for a deploy;
else as the kernel runs: packing at build time took MobileNet1.0 from 0.90x to 1.01x of
FP32's speed, ResNet-50 from 0.95x to 1.20x), and the
innermost ``L x 4`` multiply-accumulate of each (output channels, input channels) step
is replaced by the intrinsic. Depthwise convolutions, signed (int8) inputs and channel
counts that do not divide stay with the generic rules (the INT8 step gives the small
ones exact float32 arithmetic instead: :mod:`edgecv.pipelines.int8`).
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import s_tir
from tvm.s_tir.schedule import SBlockRV
from tvm.script import tirx as T
from tvm.target.codegen import target_has_features

from .base import OneReductionRule
from .conv2d import pixel_tile
from .conv2d_packed import _pad_rows, _rows_outer, _store_vectors
from .loop_nest import (
    PARALLEL_CHUNKS,
    NotApplicable,
    Simd,
    accumulate_locally,
    extent,
    has_conditional,
    inline_plain_producers,
    iter_kinds,
    largest_divisor,
    nest,
    read_index,
    refuse_grouped,
    unroll,
)

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


def int8_lowering(target: tvm.target.Target, precision: str) -> tuple[int | None, bool]:
    """The lowering's ``int8_block`` and ``int8_pairs`` for a build of ``precision``:
    the int32 lanes of ``target``'s dot product, the block its uint8 x int8
    convolutions are lowered and laid out for (None but in an ``int8`` build on a CPU
    with one), and whether their packed weights come in pairs of steps summed in int16
    (7-bit data). One answer for the graph tuner and the lowering."""
    dot = dot_product_of(target) if precision == "int8" else None
    return (dot.lanes, dot.pairs is not None) if dot else (None, False)


def runs_on_dot_product(
    weight_shape: tuple[int, ...], groups: int, input_dtype: str, dot: DotProduct
) -> bool:
    """Whether a quantized conv2d (OIHW ``weight_shape``) will be scheduled by
    :class:`Conv2DInt8` with ``dot``: the INT8 step quantizes the weights of exactly
    these to ``dot.weight_max``."""
    out_channels, in_channels = weight_shape[0], weight_shape[1]
    return (
        groups == 1
        and input_dtype == "uint8"
        and out_channels % dot.lanes == 0
        and in_channels % 4 == 0
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
    package registers every target's intrinsics, 35-48 s on these machines."""
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


def _tile(out_channels: int, lanes: int, height: int, width: int, simd: Simd):
    """(output-channel vectors, pixels, whether the pixels span whole rows) of the
    register tile: the most accumulators within half the registers, then the fewest
    loads per step (vectors of weights + broadcast pixels). Late layers have narrow
    rows: at 7x7, 2 vectors x 1 pixel (every weight read once per pixel) took 7.3 ms
    for ResNet-50's 3x3 512 -> 512, where 1 vector x 7 pixels reuses each 7 times."""
    budget = simd.registers // 2
    best = None
    for rows in (4, 2, 1):
        if out_channels % (rows * lanes) or rows > budget:
            continue
        pixels, across_rows = pixel_tile(height, width, budget // rows)
        key = (rows * pixels, -(rows + pixels))
        if best is None or key > best[0]:
            best = (key, rows, pixels, across_rows)
    return best[1:]


def schedule_conv2d_int8(
    sch: s_tir.Schedule, conv: SBlockRV, epilogue: SBlockRV | None, simd: Simd, dot: DotProduct
) -> set[str]:
    """A uint8 x int8 NCHW conv2d (groups 1) on the dot-product intrinsic ``dot``.

    Returns the names of the producers it placed (the padding, written in the packed
    layout inside this kernel)."""
    n, co, h, w, rc, ry, rx = nest(sch, conv, "SSSSRRR")
    stmt = sch.get(conv)
    # weights packed [O/L, I/4, KH, KW, L, 4] at build time (edgecv.lowering.legalize,
    # conv2d_int8) or plain OIHW, repacked here as the kernel runs
    prepacked = [i for i, r in enumerate(stmt.reads) if len(r.region) == 6]
    if prepacked:
        weight = prepacked[0]
        if int(stmt.reads[weight].source.shape[4]) != dot.lanes:
            raise NotApplicable("weights packed for another vector width")
    else:
        weight = read_index(sch, conv, (1, 4, 5, 6))
    data_index = next(i for i in range(len(stmt.reads)) if i != weight)
    data = stmt.reads[data_index]
    dtypes = (
        str(data.source.dtype),
        str(stmt.reads[weight].source.dtype),
        str(stmt.writes[0].source.dtype),
    )
    if dtypes != ("uint8", "int8", "int32"):
        raise NotApplicable(f"operands {dtypes}, not uint8 x int8 -> int32")
    refuse_grouped(sch, conv, data)
    out_channels, in_channels = extent(sch, co), extent(sch, rc)
    lanes = dot.lanes
    if out_channels % lanes or in_channels % 4:
        raise NotApplicable(f"{out_channels} -> {in_channels} channels: not in {lanes}s and 4s")
    rows, pixels, across_rows = _tile(out_channels, lanes, extent(sch, h), extent(sch, w), simd)
    block_channels = rows * lanes
    if across_rows:
        w = sch.fuse(h, w)
        h = None

    placed = inline_plain_producers(sch, conv)
    pad = [p for p in sch.get_producers(conv) if has_conditional(sch.get(p))]
    to_quads = lambda b, c, y, x: (b, c // 4, y, x, c % 4)  # noqa: E731
    data_index = next(
        i for i, r in enumerate(sch.get(conv).reads) if str(r.source.dtype) == "uint8"
    )
    if pad:  # the padding writes the packed layout directly: one pass over the input
        packed_data = pad[0]
        sch.transform_layout(packed_data, ("write", 0), to_quads)
    else:
        packed_data = sch.cache_read(conv, data_index, "global")
        sch.transform_layout(packed_data, ("write", 0), to_quads)
    packed_weight = None
    if not prepacked:
        weight = next(i for i, r in enumerate(sch.get(conv).reads) if str(r.source.dtype) == "int8")
        packed_weight = sch.cache_read(conv, weight, "global")
        sch.transform_layout(
            packed_weight,
            ("write", 0),
            lambda o, i, kh, kw: (o // lanes, i // 4, kh, kw, o % lanes, i % 4),
        )
    write_back = accumulate_locally(sch, conv, epilogue)
    sch.transform_layout(
        conv,
        ("write", 0),
        lambda b, c, y, x: (b, c // block_channels, y, x, c % block_channels),
    )
    co_o, co_r, co_v = sch.split(co, [None, rows, lanes])
    rc_o, rc_i = sch.split(rc, [None, 4])
    w_o, w_i = sch.split(w, [None, pixels])
    spatial_outer = [n, co_o] + ([h] if h is not None else []) + [w_o]
    sch.reorder(*spatial_outer, rc_o, ry, rx, co_r, w_i, co_v, rc_i)
    chunks = extent(sch, n) * extent(sch, co_o)
    if chunks >= PARALLEL_CHUNKS:
        parallel = sch.fuse(n, co_o)
        tile = sch.fuse(*spatial_outer[2:]) if len(spatial_outer) > 3 else spatial_outer[2]
    else:
        parallel = tile = sch.fuse(*spatial_outer)
    sch.parallel(parallel)
    unroll(sch, co_r)
    unroll(sch, w_i)
    init = sch.decompose_reduction(conv, rc_o)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.reverse_compute_at(write_back, tile)
    *_, tile_channel, tile_pixel = sch.get_loops(write_back)
    unroll(sch, tile_channel)
    sch.vectorize(tile_pixel)

    # the repacked operands: the weights per block of output channels, in the thread
    # that uses them; the data once, every thread a share of its rows
    if packed_weight is not None:
        _schedule_weight_repack(sch, packed_weight, parallel, chunks, lanes)
    loops = sch.get_loops(packed_data)
    sch.parallel(sch.fuse(*loops[:2]))
    placed.add(sch.get(packed_data).name_hint)
    sch.tensorize(co_v, dot.intrinsic)  # last: the loops it replaces are gone after it
    return placed


def _schedule_weight_repack(sch, packed_weight, parallel, chunks: int, lanes: int) -> None:
    """OIHW weights repacked as the kernel runs (when they were not at build time)."""
    if chunks >= PARALLEL_CHUNKS:
        sch.compute_at(packed_weight, parallel)
        inner = sch.get_loops(packed_weight)[1:]
    else:
        first, *inner = sch.get_loops(packed_weight)
        sch.parallel(first)
    # L x 4 weights are contiguous in the packed layout: one vector per step (the
    # loops compute_at leaves may be fused longer: vectorized whole, LLVM took 110 s
    # over a 8192-lane vector)
    _, vector = sch.split(sch.fuse(*inner) if len(inner) > 1 else inner[0], [None, 4 * lanes])
    sch.vectorize(vector)


# the compute name of edgecv.lowering.legalize.conv2d_int8_nchwc
PACKED = "conv2d_int8_NCHWc"


def _packed_tile(simd: Simd, chunks: int, height: int, width: int) -> tuple[int, int, int]:
    """(channel blocks, rows, columns) of a packed INT8 tile: the most int32
    accumulators beside the tile's weight vectors, the broadcast input and the two
    registers the product steps need (``vpmaddubsw``'s int16 pairs, the ones of
    ``vpmaddwd``); more channel blocks on a tie."""
    best = (0, 0, 0, 0)
    for blocks in (1, 2) if chunks % 2 == 0 else (1,):
        cap = (simd.registers - 3 - blocks) // blocks
        for columns in range(1, min(width, cap) + 1):
            # whole tiles only: a predicated tile leaves the intrinsic's loads and
            # stores guarded element by element (ResNet-50's 3x3 512 -> 512 at 7x7:
            # 5 predicated columns x 2 blocks 13.6 ms, 7 columns x 1 block 2.8)
            if width % columns == 0:
                rows = largest_divisor(height, cap // columns)
                best = max(best, (rows * columns * blocks, blocks, rows, columns))
    return best[1:]


def schedule_conv2d_int8_nchwc(
    sch: s_tir.Schedule, conv: SBlockRV, epilogue: SBlockRV | None, simd: Simd, dot: DotProduct
) -> set[str]:
    """``conv2d_int8_NCHWc`` (:func:`edgecv.lowering.legalize.conv2d_int8_nchwc`): the
    register tile of :func:`.conv2d_packed.schedule_conv2d_nchwc` (output pixels times
    one or two channel blocks, threads over blocks and rows) with each step's
    ``L x 4`` multiply-accumulate on the dot-product intrinsic. Data, weights and
    output are already in the layouts the instruction reads: nothing is repacked."""
    kinds = iter_kinds(sch, conv)
    if kinds not in ("SSSSSRRRRR", "SSSSSRRRRRR"):
        raise NotApplicable("not a conv2d_int8_NCHWc nest")

    stmt = sch.get(conv)
    dtypes = tuple(str(r.source.dtype) for r in stmt.reads[-2:]) + (
        str(stmt.writes[0].source.dtype),
    )
    if dtypes != ("uint8", "int8", "int32"):
        raise NotApplicable(f"operands {dtypes}, not uint8 x int8 -> int32")
    # weights packed in pairs of steps (int8_pairs) add the step of the pair
    n, co, h, w, lane, rco, ry, rx, rcq, *step, rc4 = sch.get_loops(conv)
    if step and dot.pairs is None:
        raise NotApplicable("weights packed in pairs: this CPU's dot product has no int16 step")
    if extent(sch, lane) != dot.lanes or extent(sch, rc4) != 4:
        raise NotApplicable(f"a block of {extent(sch, lane)} channels, not {dot.lanes}")
    write_back = accumulate_locally(sch, conv, epilogue)
    blocks, rows, columns = _packed_tile(simd, extent(sch, co), extent(sch, h), extent(sch, w))
    rows_outer = _rows_outer(sch, conv, blocks)
    co_o, co_i = sch.split(co, [None, blocks])
    h_o, h_i = sch.split(h, [None, rows])
    w_o, w_i = sch.split(w, [None, columns])
    outer = [n, h_o, co_o] if rows_outer else [n, co_o, h_o]
    inner = [*step, lane, rc4]
    sch.reorder(*outer, w_o, rco, ry, rx, rcq, h_i, w_i, co_i, *inner)
    parallel = sch.fuse(*outer)
    sch.parallel(parallel)
    for loop in (h_i, w_i, co_i):
        unroll(sch, loop)
    init = sch.decompose_reduction(conv, rco)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.reverse_compute_at(write_back, w_o)
    _store_vectors(sch, write_back, simd)
    placed = _pad_rows(sch, conv)
    # last: the loops it replaces are gone after it
    sch.tensorize(inner[0], dot.pairs if step else dot.intrinsic)
    return placed


class Conv2DInt8(OneReductionRule):
    """uint8 x int8 NCHW conv2d on the target's dot-product instructions."""

    def apply(self, func, target, tunable):
        dot = dot_product_of(target)
        if dot is None:
            return None
        register_intrinsics()
        self._dot = dot
        return super().apply(func, target, tunable)

    def schedule(self, sch, main, epilogue, simd):
        if sch.get(main).name_hint.startswith(PACKED):
            return schedule_conv2d_int8_nchwc(sch, main, epilogue, simd, self._dot)
        return schedule_conv2d_int8(sch, main, epilogue, simd, self._dot)
