"""Greedy suppression on GPUs, shared by ``box_nms`` and ``MultiBoxDetection``.

Each batch row holds ``count(b)`` boxes already in score order. A box survives when no
earlier surviving box suppresses it (same class unless forced, overlap above the
threshold): a strictly sequential definition, so the parallelism is within a step.
Two versions, one result:

- work-group (any OpenCL or CUDA device): one work-group per row walks the boxes in
  order; for each box still alive, its work-items test every later box in parallel
  and kill those it overlaps. One barrier per box.
- Intel subgroup (``subgroup``: the device's subgroup size): one subgroup per row
  takes the boxes in tiles, a box per lane. A lane first tests its box against the
  survivors of earlier tiles (a list in memory, read by all lanes at once), then the
  tile settles itself in order: at step ``r``, lane ``r``'s verdict is broadcast and,
  when it lives, the later lanes test against it. The survivors are appended to the
  list at positions from a subgroup exclusive scan, counted by a subgroup reduction.
  No work-group barrier at all: subgroup collectives only.

Callers describe their rows with four callbacks: ``count(b)`` (an int32 expression),
``alive(b, j)`` (a boolean expression), ``kill(b, j)`` (emits the statements that mark
``j`` suppressed) and ``suppresses(b, i, j)`` (kept box ``i`` removes box ``j``).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

__all__ = ["barrier", "emit_greedy_suppression"]


def barrier(target_kind: str) -> None:
    """A work-group barrier that also orders global memory (the flags live there)."""
    if target_kind == "opencl":  # CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE
        T.evaluate(T.call_extern("void", "barrier", tirx.const(3, "uint32")))
    else:  # CUDA's __syncthreads orders global memory within a block too
        T.evaluate(T.tvm_storage_sync("shared"))


def emit_greedy_suppression(
    batch: int,
    count,
    alive,
    kill,
    suppresses,
    threads: int,
    target_kind: str,
    subgroup: int | None = None,
    kept=None,
) -> None:
    """Emit the suppression launch (see the module docstring). The subgroup version
    needs ``kept``, a ``(batch, n)`` int32 workspace for each row's survivors."""
    if subgroup is not None:
        if kept is None:
            raise ValueError("the subgroup suppression needs a kept-list workspace")
        _emit_subgroup(batch, count, alive, kill, suppresses, subgroup, kept)
        return
    bx, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.x")
    with T.launch_thread(bx, batch), T.launch_thread(tx, threads):
        b = bx
        state = T.buffer_proxy(T.alloc_buffer((2,), "int32", scope="local"))
        state[0] = count(b)
        with T.serial(0, state[0]) as i:
            barrier(target_kind)  # kills of the earlier steps are visible
            state[1] = tirx.Select(alive(b, i), 1, 0)
            with T.If(state[1] == 1):
                with T.Then():
                    with T.serial(0, (state[0] + threads - 1) // threads) as step:
                        j = step * threads + tx
                        with T.If(tirx.all(j > i, j < state[0])):
                            with T.Then():
                                with T.If(alive(b, j)):
                                    with T.Then():
                                        with T.If(suppresses(b, i, j)):
                                            with T.Then():
                                                kill(b, j)
        barrier(target_kind)


def _emit_subgroup(batch: int, count, alive, kill, suppresses, size: int, kept) -> None:
    from . import subgroup as sg

    bx, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.x")
    with T.launch_thread(bx, batch), T.launch_thread(tx, size):  # one subgroup per row
        b, lane = bx, tx
        # 0 boxes in the row, 1 survivors so far, 2 this lane's box lives, 3 scratch
        state = T.buffer_proxy(T.alloc_buffer((4,), "int32", scope="local"))
        state[0] = count(b)
        state[1] = 0
        with T.serial(0, (state[0] + size - 1) // size) as tile:
            j = tile * size + lane
            state[2] = 0
            with T.If(j < state[0]):
                with T.Then():
                    state[2] = tirx.Select(alive(b, j), 1, 0)
            with T.serial(0, state[1]) as m:  # against the survivors of earlier tiles
                with T.If(state[2] == 1):
                    with T.Then():
                        with T.If(suppresses(b, kept[b, m], j)):
                            with T.Then():
                                state[2] = 0
            for r in range(size):  # the tile in order: lane r's verdict is final now
                state[3] = sg.broadcast(state[2], r)
                with T.If(tirx.all(state[3] == 1, lane > r, state[2] == 1)):
                    with T.Then():
                        with T.If(suppresses(b, tile * size + r, j)):
                            with T.Then():
                                state[2] = 0
            state[3] = sg.scan_exclusive_add(state[2])
            with T.If(state[2] == 1):
                with T.Then():
                    kept[b, state[1] + state[3]] = j
            with T.If(tirx.all(j < state[0], state[2] == 0)):
                with T.Then():
                    kill(b, j)
            state[1] = state[1] + sg.reduce_add(state[2])
            sg.barrier(sg.GLOBAL_FENCE)  # the list is complete for the next tile
