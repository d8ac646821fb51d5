"""Heterogeneous execution: GPU-unfriendly launches run on the CPU, with device copies.

Two passes over a lowered plan: :func:`~.placement.place` tags each launch GPU or CPU
(with the reason for every CPU tag), then :func:`~.copies.insert_copies` puts each
buffer on a device and inserts one copy per tensor and destination device wherever an
edge crosses. The executor runs the result as one static plan over two backends.
"""

from .copies import Copy, insert_copies, widened_constants
from .placement import REASONS, CpuNode, GpuOnlyError, Placement, place

__all__ = [
    "REASONS",
    "Copy",
    "CpuNode",
    "GpuOnlyError",
    "Placement",
    "insert_copies",
    "place",
    "widened_constants",
]
