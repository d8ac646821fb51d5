"""The one-dimensional GPU launch the operators' stages are written in."""

from __future__ import annotations

from tvm.script.ir_builder import tirx as T

__all__ = ["launch"]


def launch(groups: int, items: int):
    """``(group frame, item frame, group index, item index)`` of a launch of ``groups``
    work-groups (at least one) of ``items`` work-items: enter both frames, index with
    the two variables."""
    bx, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.x")
    return T.launch_thread(bx, max(1, groups)), T.launch_thread(tx, items), bx, tx
