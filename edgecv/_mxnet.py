"""The one place edgecv imports MXNet.

MXNet 1.9.1 still refers to ``numpy.bool``, an alias NumPy removed in 1.24; we pin
NumPy 1.26 (MXNet needs NumPy < 2), so the alias is restored here before MXNet is
imported. Every module that needs MXNet calls :func:`import_mxnet` instead of
``import mxnet``.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import numpy as np


def import_mxnet() -> ModuleType:
    """Return the ``mxnet`` module, importing it with the NumPy alias it needs."""
    if "bool" not in vars(np):
        np.bool = bool  # type: ignore[attr-defined]
    # MXNet prints a warning per process about its oneDNN build; keep logs clean.
    os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")
    return importlib.import_module("mxnet")


def import_gluoncv() -> ModuleType:
    """Return the ``gluoncv`` module (imports MXNet first, see :func:`import_mxnet`)."""
    import_mxnet()
    return importlib.import_module("gluoncv")
