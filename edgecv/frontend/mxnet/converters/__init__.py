"""The converter table: one small function per MXNet operator, keyed by its exact name.

A converter takes the :class:`~edgecv.frontend.mxnet.context.Context`, the node's inputs as
Relax expressions and its :class:`~edgecv.frontend.mxnet.attrs.Attrs`, and returns one Relax
expression or a list of them (one per MXNet output). Converters live in one file per
family (``nn``, ``tensor``, ``math``, ``vision``) and register with :func:`converts`.
"""

from __future__ import annotations

from .registry import CONVERTERS, converts

# Importing the families fills CONVERTERS.
from . import deformable, image, indexing, math, nn, sort, tensor, vision  # noqa: E402,F401  isort: skip

__all__ = ["CONVERTERS", "converts"]
