"""edgecv: deploy GluonCV/MXNet vision models to integrated GPUs and CPUs with Apache TVM."""

import os as _os

from .board._version import __version__

# TVM sizes its CPU thread pool from physical cores it detects, which gives 1 thread on
# some VMs with 2 usable cores; use every core this process may run on unless the
# user chose otherwise. Must happen before TVM's runtime starts its pool.
_os.environ.setdefault("TVM_NUM_THREADS", str(len(_os.sched_getaffinity(0))))
# TVM pins each pool worker to a core but leaves the calling thread free; when the OS
# runs the caller on a worker's core the two share it for every kernel, which the OS
# does on its own in a good share of runs. Unpinned workers let the OS keep them apart
# (benchmarks/results/thread_pinning-2026-11-25-zen5-2core.md). TVM_BIND_THREADS=1
# restores the pinning.
_os.environ.setdefault("TVM_BIND_THREADS", "0")
# After each task a pool worker spins (yielding the core) before it sleeps: 300000
# times by default, which on busy cores lasts up to seconds and takes cycles from
# whatever runs next (other streams' kernels); 10000 still spans the gap between two
# kernels of an inference, so one stream loses nothing
# (benchmarks/results/streams-2026-11-26-zen3.md, the spin count).
_os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "10000")

from .board.errors import EdgecvError  # noqa: E402  (after the environment is set)

__all__ = ["EdgecvError", "__version__", "load", "register_op", "video"]


def load(path, on=None, streams=1, sha256=None):
    """Load a deployed package (on OpenCL device ``on``, with ``streams`` calls able to
    run at once from different threads; only if its manifest has the sha256 ``sha256``,
    the pin `edgecv deploy` printed, when given); see :func:`edgecv.board.model.load`."""
    from .board.model import load as _load

    return _load(path, on=on, streams=streams, sha256=sha256)


def video(model, source, streams=None, **options):
    """Play a camera, a video file, a folder of images or any frames through a loaded
    model, decoding, inferring (``streams`` calls in flight) and postprocessing at once:
    ``for result in edgecv.video(model, "clip.mp4", streams=2): ...``; see
    :func:`edgecv.board.video.video` for the options and what each result holds."""
    from .board.video import video as _video

    return _video(model, source, streams, **options)


def __getattr__(name: str):
    """``edgecv.register_op`` on first use: the registry imports nothing of TVM, but a
    board that only runs packages need not load it at all."""
    if name == "register_op":
        from .op_registry import register_op

        return register_op
    raise AttributeError(f"module 'edgecv' has no attribute {name!r}")
