"""Target-independent lowering: Relax passes (with the legalization of packed and
Winograd convolutions, :mod:`.legalize`, :mod:`.winograd`), fused kernels and the
static plan."""

from .relax_passes import MAX_FUSION_DEPTH, Lowered, lower, op_name, relax_passes

__all__ = ["MAX_FUSION_DEPTH", "Lowered", "lower", "op_name", "relax_passes"]
