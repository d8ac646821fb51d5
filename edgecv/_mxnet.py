"""The one place edgecv imports MXNet.

MXNet 1.9.1 still refers to ``numpy.bool``, and GluonCV 0.10.5's R-CNN and HRNet code
to ``numpy.float`` and ``numpy.int``: aliases NumPy removed in 1.24. We pin NumPy 1.26
(MXNet needs NumPy < 2), so the aliases are restored here before MXNet is imported.
Every module that needs MXNet calls :func:`import_mxnet` instead of ``import mxnet``.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import numpy as np

# numpy.<alias> names removed in NumPy 1.24 that MXNet 1.9.1 / GluonCV 0.10.5 still use
_REMOVED_ALIASES = {"bool": bool, "float": float, "int": int, "complex": complex, "object": object}


def import_mxnet() -> ModuleType:
    """Return the ``mxnet`` module, importing it with the NumPy alias it needs."""
    # The removed aliases meant the Python builtins; restore exactly those, and only
    # where NumPy no longer defines them (a NumPy that has them keeps its own).
    for alias, builtin in _REMOVED_ALIASES.items():
        if alias not in vars(np):
            setattr(np, alias, builtin)
    # MXNet prints a warning per process about its oneDNN build; keep logs clean.
    os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")
    return importlib.import_module("mxnet")


def import_gluoncv() -> ModuleType:
    """Return the ``gluoncv`` module (imports MXNet first, see :func:`import_mxnet`)."""
    import_mxnet()
    return importlib.import_module("gluoncv")
