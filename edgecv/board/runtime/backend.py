"""The interface every device backend implements (CPU, OpenCL, CUDA).

A backend is shared by every execution context of a loaded model (see
:mod:`.executor`): its kernels and the constants uploaded through it are read-only
after loading. What a context needs of its own on a device it gets from
:meth:`Backend.stream`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import PackageError


class Backend:
    """Memory and kernels of one device. Subclasses implement every method."""

    name = "abstract"
    # The size of the thread pool, belonging to the calling thread and outliving it,
    # that this backend's kernels run on (TVM's CPU kernels); None where calling a
    # kernel leaves no state in the calling thread. Where set, the executor runs
    # inferences on threads it keeps for that pool size (runtime/workers.py).
    calling_thread_pool: int | None = None

    def alloc(self, nbytes: int) -> Any:
        """A device allocation of ``nbytes`` bytes (a storage slot)."""
        raise NotImplementedError("need alloc")

    def view(self, storage: Any, shape: tuple[int, ...], dtype: str, offset: int = 0) -> Any:
        """A tensor of ``shape``/``dtype`` over the bytes of ``storage`` from ``offset``
        (a multiple of the device's :data:`~edgecv.board.plan.PIECE_ALIGNMENT`)."""
        raise NotImplementedError("need view")

    def upload(self, tensor: Any, array: np.ndarray) -> None:
        raise NotImplementedError("need upload")

    def download(self, tensor: Any) -> np.ndarray:
        raise NotImplementedError("need download")

    def kernel(self, name: str) -> Callable[..., None]:
        """The compiled kernel ``name``, called with tensors in plan order."""
        raise NotImplementedError("need kernel")

    def bind(
        self, name: str, tensors: list[Any], workspaces: list[Any] | None = None
    ) -> Callable[[], None]:
        """Kernel ``name`` bound to its argument tensors once, at load time.

        Backends whose launches can be prepared (arguments set) override this so an
        inference only enqueues; the default calls :meth:`kernel` each time.
        ``workspaces``: tensors for the kernel's device workspaces, in order (the plan's
        :attr:`~edgecv.board.plan.Step.workspaces`, views of a context's storage);
        None where the plan has none for the launch: a GPU backend then allocates those
        its launches need itself (packages built before workspaces were planned).
        """
        kernel = self.kernel(name)
        return lambda: kernel(*tensors)

    def synchronize(self) -> None:
        """Wait for queued work (no-op for synchronous devices)."""

    def stream(self, streams: int = 1) -> Backend:
        """This backend as one of ``streams`` execution contexts uses it: the same
        device, kernels and memory, with work ordered apart from other contexts' where the
        device queues work (OpenCL: a command queue of its own). Kernels bound, uploads,
        downloads and :meth:`synchronize` through the result concern that context alone.
        A device that runs each call to completion in the calling thread needs nothing
        more: the backend itself (the CPU takes its share of the cores)."""
        return self

    def make_current(self) -> None:
        """Ready the calling thread to use this backend (CUDA keeps the current context
        per thread); called at the start of every inference, so it must stay cheap."""


def planned_workspaces(name: str, workspaces: list[Any], sizes: list[int]) -> list[Any]:
    """The plan's workspace tensors of kernel ``name`` (:meth:`Backend.bind`), checked
    against the bytes of each that its launches need, ``sizes``: a plan and launches of
    two builds do not mix."""
    if len(workspaces) != len(sizes) or any(t.nbytes < n for t, n in zip(workspaces, sizes)):
        raise PackageError(
            f"kernel `{name}`: the plan gives it workspaces of "
            f"{[t.nbytes for t in workspaces]} bytes, its launches need {sizes}: the "
            "package's plan and kernels come from different builds; redeploy the model"
        )
    return workspaces


def planned_arguments(name: str, tensors: list[Any], sizes: list[int]) -> list[Any]:
    """The plan's argument tensors of GPU kernel ``name`` (:meth:`Backend.bind`), checked
    against the bytes its device code reads or writes through each,
    :attr:`~edgecv.board.plan.Launch.buffers` (``sizes``; empty in launches recorded
    before them). A GPU kernel checks nothing of what it is given: a smaller buffer
    would have it read or write past that buffer's end."""
    if not sizes:
        return tensors
    if len(sizes) != len(tensors):
        raise PackageError(
            f"kernel `{name}`: the plan gives it {len(tensors)} arguments, its launches "
            f"{len(sizes)}: the package's plan and kernels come from different builds; "
            "redeploy the model"
        )
    for i, (tensor, size) in enumerate(zip(tensors, sizes)):
        if tensor.nbytes < size:
            raise PackageError(
                f"kernel `{name}`: the plan's argument {i} is {tensor.nbytes} bytes, its "
                f"compiled code reads or writes {size} bytes there: the package's plan and "
                "kernels do not match; redeploy the model"
            )
    return tensors
