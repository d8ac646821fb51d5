"""Typed access to MXNet node attributes.

MXNet stores every attribute as a string (``"(3, 3)"``, ``"True"``, ``"None"``).
Converters read them through :class:`Attrs`, so a missing required attribute or a
value of the wrong kind is reported with the node's name instead of a ValueError
from deep inside a converter.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import Any

from ...board.errors import ConversionError

_REQUIRED = object()


class Attrs:
    """The attributes of one MXNet node.

    Parameters
    ----------
    op : str
        The MXNet operator name (for messages).
    node : str
        The node name (for messages).
    raw : dict
        The node's ``attrs`` as stored in the symbol JSON; keys starting with
        ``__`` are training hints (``__init__``, ``__lr_mult__``) and are dropped.
    """

    def __init__(self, op: str, node: str, raw: dict[str, str] | None):
        self.op = op
        self.node = node
        self._raw = {k: v for k, v in (raw or {}).items() if not k.startswith("__")}

    def __contains__(self, name: str) -> bool:
        return name in self._raw

    def __repr__(self) -> str:
        return f"Attrs({self.op} {self.node!r}: {self._raw})"

    def _fail(self, name: str, expected: str, found: Any) -> ConversionError:
        return ConversionError(
            f"node `{self.node}` (op `{self.op}`): attribute `{name}` should be {expected}, "
            f"found {found!r}"
        )

    def _get(self, name: str, default: Any) -> str | None:
        if name in self._raw:
            return self._raw[name]
        if default is _REQUIRED:
            raise ConversionError(
                f"node `{self.node}` (op `{self.op}`): required attribute `{name}` is missing; "
                f"found attributes: {sorted(self._raw) or 'none'}"
            )
        return None

    def str(self, name: str, default: Any = _REQUIRED, choices: Sequence[str] | None = None) -> Any:
        value = self._get(name, default)
        if value is None:
            return default
        if choices is not None and value not in choices:
            raise self._fail(name, f"one of {list(choices)}", value)
        return value

    def int(self, name: str, default: Any = _REQUIRED) -> Any:
        value = self._get(name, default)
        if value is None or value == "None":
            return default
        try:
            return int(value)
        except ValueError:
            try:
                as_float = float(value)
            except ValueError:
                raise self._fail(name, "an integer", value) from None
            if as_float != int(as_float):
                raise self._fail(name, "an integer", value) from None
            return int(as_float)

    def float(self, name: str, default: Any = _REQUIRED) -> Any:
        value = self._get(name, default)
        if value is None or value == "None":
            return default
        try:
            return float(value)
        except ValueError:
            raise self._fail(name, "a number", value) from None

    def bool(self, name: str, default: Any = _REQUIRED) -> Any:
        value = self._get(name, default)
        if value is None:
            return default
        lowered = value.strip().lower()
        if lowered in ("true", "1"):
            return True
        if lowered in ("false", "0"):
            return False
        raise self._fail(name, "a boolean (True/False)", value)

    def _tuple(self, name: str, default: Any, kinds: tuple, what: str) -> Any:
        value = self._get(name, default)
        if value is None or value == "None":
            return default
        try:
            parsed = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise self._fail(name, what, value) from None
        if isinstance(parsed, kinds):
            return (parsed,)
        if not isinstance(parsed, (tuple, list)) or not all(isinstance(v, kinds) for v in parsed):
            raise self._fail(name, what, value)
        return tuple(parsed)

    def ints(self, name: str, default: Any = _REQUIRED) -> Any:
        """A tuple of ints such as ``(3, 3)``; ``None`` entries become ``None``."""
        return self._tuple(name, default, (int, type(None)), "a tuple of integers")

    def floats(self, name: str, default: Any = _REQUIRED) -> Any:
        """A tuple of floats such as ``(0.1, 0.1, 0.2, 0.2)``; a single number is a 1-tuple."""
        parsed = self._tuple(name, default, (int, float), "a tuple of numbers")
        return parsed if parsed is default else tuple(float(v) for v in parsed)

    def scalar(self, name: str = "scalar", default: Any = _REQUIRED) -> Any:
        """A float scalar operand (``_mul_scalar`` and friends)."""
        return self.float(name, default)
