"""Operators a user registers (:func:`register_op`): name -> compute, shape rule, reference.

Plain Python with no import of TVM, so ``import edgecv`` stays cheap and ``register_op``
can sit at the top of a user's module: the compute function is only called when the
frontend converts a node of the operator (:mod:`edgecv.frontend.registered`), where
TVM is loaded anyway. The graph's op name is the key: an MXNet operator name, or for a
``Custom`` node its ``op_type`` attribute; a Gluon ``HybridBlock`` subclass registers
under the ``op_type`` class attribute it exports its ``Custom`` node with.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .board.errors import EdgecvError

# An MXNet op name or a Custom op_type as it can appear in a symbol file; also what the
# kernel is named after, so ``--explain`` and ``--cpu-ops`` can name it.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class RegistrationError(EdgecvError):
    """A :func:`register_op` call that cannot be honoured (bad name, not callable,
    the name taken by another function)."""


@dataclass(frozen=True)
class RegisteredOp:
    """One registered operator; see :func:`register_op` for the fields."""

    name: str
    compute: Callable[..., Any]
    shape: Callable[[list[tuple[int, ...]], dict[str, Any]], tuple[int, ...]]
    dtype: str | Callable[[list[str], dict[str, Any]], str] | None = None
    reference: Callable[..., Any] | None = None

    def out_dtype(self, dtypes: list[str], attrs: dict[str, Any]) -> str:
        """The output dtype by the op's rule: a fixed name, a function of the input
        dtypes and attributes, or (None) the first input's dtype."""
        if self.dtype is None:
            return dtypes[0]
        if isinstance(self.dtype, str):
            return self.dtype
        return str(self.dtype(dtypes, attrs))


_REGISTERED: dict[str, RegisteredOp] = {}
_CALLS = [0]  # register_op calls so far: whether a module loaded by load_ops registered any


def register_op(
    name: str | type,
    compute: Callable[..., Any] | None = None,
    *,
    shape: Callable[[list[tuple[int, ...]], dict[str, Any]], tuple[int, ...]],
    dtype: str | Callable[[list[str], dict[str, Any]], str] | None = None,
    reference: Callable[..., Any] | None = None,
) -> Any:
    """Register an operator edgecv has no converter for, written as a TVM tensor expression.

    Use it as a call, ``register_op("hard_swish", compute, shape=...)``, or as a decorator
    of the compute function, ``@register_op("hard_swish", shape=...)``.

    Parameters
    ----------
    name : str or HybridBlock subclass
        The op name in the MXNet symbol JSON, or for a ``Custom`` op (a Gluon block
        exported through ``mx.operator.register``) its ``op_type``. Letters, digits and
        ``_``: the kernel is named after it in ``deploy --explain`` and ``--cpu-ops``.
        Or the Gluon ``HybridBlock`` subclass itself, which must say the ``op_type`` it
        exports as in a class attribute ``op_type`` (its ``hybrid_forward`` calling
        ``F.Custom(..., op_type=self.op_type)``): the op is registered under that name.
    compute : callable
        ``compute(inputs, attrs) -> te.Tensor``: ``inputs`` are ``tvm.te.Tensor``
        placeholders of the node's inputs in graph order (weights included), ``attrs``
        the node's attributes with MXNet's strings read as Python literals where they
        are one (``"(3, 3)"`` -> ``(3, 3)``; ``op_type`` removed). Build the output with
        ``te.compute`` (reductions with ``te.reduce_axis`` / ``te.sum`` are fine); edgecv
        makes a TIR PrimFunc of it, so it fuses and is scheduled like a built-in op.
    shape : callable
        ``shape(input_shapes, attrs) -> tuple``: the output shape. Checked against what
        ``compute`` builds, so a mistake in either is caught at import, not at run time.
    dtype : str or callable, optional
        The output dtype, or ``dtype(input_dtypes, attrs) -> str``; the first input's
        dtype by default.
    reference : callable, optional
        ``reference(*arrays, **attrs) -> numpy.ndarray``: the op in NumPy, which
        :func:`edgecv.testing.check_op` compares the compiled op with.

    Returns
    -------
    The compute function (so the decorator form leaves it usable), or the decorator.

    Raises
    ------
    RegistrationError
        A malformed name, a block class without an ``op_type``, an argument that is not
        callable, or a name already registered by a different function (re-running the
        same module is fine).
    """
    if compute is None:
        return lambda fn: register_op(name, fn, shape=shape, dtype=dtype, reference=reference)
    name = _block_op_type(name) if isinstance(name, type) else name
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise RegistrationError(
            f"register_op: name {name!r:.60} is not an op name; give the MXNet op name, the "
            "Custom op's op_type (letters, digits and _, not starting with a digit) or the "
            "Gluon HybridBlock class that exports it"
        )
    for what, value in (("compute", compute), ("shape", shape)):
        if not callable(value):
            raise RegistrationError(
                f"register_op({name!r}): {what} must be a function, got {type(value).__name__}"
            )
    if reference is not None and not callable(reference):
        raise RegistrationError(
            f"register_op({name!r}): reference must be a NumPy function or None, got "
            f"{type(reference).__name__}"
        )
    if dtype is not None and not (isinstance(dtype, str) or callable(dtype)):
        raise RegistrationError(
            f"register_op({name!r}): dtype must be a dtype name, a function or None, got "
            f"{type(dtype).__name__}"
        )
    previous = _REGISTERED.get(name)
    if previous is not None and _origin(previous.compute) != _origin(compute):
        file, qualname = _origin(previous.compute)
        raise RegistrationError(
            f"register_op: `{name}` is already registered by {qualname} in {file}; "
            "give the new operator another name, or unregister_op the old one first"
        )
    _REGISTERED[name] = RegisteredOp(name, compute, shape, dtype, reference)
    _CALLS[0] += 1
    return compute


def _block_op_type(block: type) -> str:
    """The ``op_type`` a Gluon ``HybridBlock`` subclass exports its ``Custom`` node with:
    its class attribute of that name. The class is told apart by its bases' names, so
    registering from a block does not import MXNet here."""
    if not any(
        base.__name__ == "HybridBlock" and base.__module__.startswith("mxnet.gluon")
        for base in block.__mro__
    ):
        raise RegistrationError(
            f"register_op: class {block.__qualname__} is not a Gluon HybridBlock; give the "
            "MXNet op name, the Custom op's op_type, or a HybridBlock subclass"
        )
    op_type = getattr(block, "op_type", None)
    if not isinstance(op_type, str):
        raise RegistrationError(
            f"register_op({block.__qualname__}): a HybridBlock registers under the Custom "
            'op_type it exports as; give the class an attribute `op_type = "my_op"` and '
            "call F.Custom(..., op_type=self.op_type) in its hybrid_forward"
        )
    return op_type


def _origin(fn: Callable[..., Any]) -> tuple[str, str]:
    """Where a function was written: the same module loaded twice (``--ops`` and an
    ``import``, or a reload) registers the same op again, which is no conflict."""
    code = getattr(fn, "__code__", None)
    return (code.co_filename if code else "?", getattr(fn, "__qualname__", repr(fn)))


def registered_op(name: str) -> RegisteredOp | None:
    """The operator registered under ``name``, or None."""
    return _REGISTERED.get(name)


def registered_names() -> list[str]:
    """The names of the registered operators, sorted."""
    return sorted(_REGISTERED)


def unregister_op(name: str) -> None:
    """Forget the operator ``name`` (no error when it is not registered)."""
    _REGISTERED.pop(name, None)


def load_ops(path: str | Path) -> list[str]:
    """Run the user's Python file ``path`` (``edgecv deploy --ops FILE``), which registers
    operators with :func:`register_op`; returns the names registered.

    The file is imported under its own module name in ``edgecv_user_ops`` (not on
    ``sys.path``, so it cannot shadow a module of the same name), its folder on
    ``sys.path`` while it runs so it can import its neighbours.
    """
    path = Path(path)
    if not path.is_file():
        raise RegistrationError(
            f"--ops {path}: no such file; give the Python file that calls edgecv.register_op"
        )
    if path.suffix != ".py":
        raise RegistrationError(f"--ops {path}: not a Python file (.py)")
    name = f"edgecv_user_ops.{_NAME.sub('_', path.stem) or 'ops'}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    before, names_before = _CALLS[0], set(_REGISTERED)
    sys.path.insert(0, str(path.resolve().parent))
    try:
        spec.loader.exec_module(module)
    except EdgecvError as err:
        raise RegistrationError(f"--ops {path}: {err}") from None
    except BaseException as err:
        if isinstance(err, KeyboardInterrupt):
            raise
        line = _line_in(err, path)
        raise RegistrationError(
            f"--ops {path}: importing it raised {type(err).__name__}: {err}{line}; "
            "fix the file (run `python FILE` to see the traceback)"
        ) from None
    finally:
        sys.path.remove(str(path.resolve().parent))
    if _CALLS[0] == before:
        raise RegistrationError(
            f"--ops {path}: the file registers no operator; call edgecv.register_op in it"
        )
    return sorted(set(_REGISTERED) - names_before) or registered_names()


def _line_in(err: BaseException, path: Path) -> str:
    """`` (line N)`` of the last frame of the traceback inside the user's file."""
    tb, line = err.__traceback__, None
    while tb is not None:
        if Path(tb.tb_frame.f_code.co_filename).resolve() == path.resolve():
            line = tb.tb_lineno
        tb = tb.tb_next
    if line is None and isinstance(err, SyntaxError):
        line = err.lineno
    return f" (line {line})" if line else ""


__all__ = [
    "RegisteredOp",
    "RegistrationError",
    "load_ops",
    "register_op",
    "registered_names",
    "registered_op",
    "unregister_op",
]
