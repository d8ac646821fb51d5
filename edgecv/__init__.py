"""edgecv: deploy GluonCV/MXNet vision models to integrated GPUs and CPUs with Apache TVM."""

import os as _os

__version__ = "0.1.0"

# TVM sizes its CPU thread pool from physical cores it detects, which gives 1 thread on
# some VMs with 2 usable cores; use every core this process may run on unless the
# user chose otherwise. Must happen before TVM's runtime starts its pool.
_os.environ.setdefault("TVM_NUM_THREADS", str(len(_os.sched_getaffinity(0))))

from .errors import EdgecvError  # noqa: E402  (after the environment is set)

__all__ = ["EdgecvError", "__version__", "load"]


def load(path, on=None):
    """Load a deployed package (on OpenCL device ``on``); see :func:`edgecv.model.load`."""
    from .model import load as _load

    return _load(path, on=on)
