"""Registration of converters (kept apart so families can import it without cycles)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Converter = Callable[..., Any]

CONVERTERS: dict[str, Converter] = {}


def converts(*op_names: str) -> Callable[[Converter], Converter]:
    """Register the decorated function as the converter of the given MXNet ops."""

    def register(fn: Converter) -> Converter:
        for name in op_names:
            if name in CONVERTERS:
                raise RuntimeError(f"two converters for MXNet op `{name}`")
            CONVERTERS[name] = fn
        return fn

    return register
