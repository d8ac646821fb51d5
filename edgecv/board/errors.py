"""Errors edgecv raises for bad input; the CLI prints their message, never a traceback.

Each message names the thing that was wrong, what was expected, what was found and
what to do about it.
"""

from __future__ import annotations


class EdgecvError(Exception):
    """Base class of every error caused by the user's input or environment."""


class GraphError(EdgecvError):
    """The model file (an MXNet symbol, an ONNX file) is missing, truncated or malformed."""


class UnsupportedOpsError(EdgecvError):
    """The graph holds operators edgecv has no converter for."""

    def __init__(self, counts: dict[str, int], supported: list[str], frontend: str = "MXNet"):
        self.counts = dict(counts)
        listed = ", ".join(f"`{op}` (x{n})" for op, n in sorted(counts.items()))
        super().__init__(
            f"{len(counts)} operator(s) have no converter: {listed}. "
            f"Supported {frontend} ops: {', '.join(sorted(supported))}. "
            "Replace them in the model, register them with edgecv.register_op (deploy "
            "--ops FILE; docs/adding-an-operator.md), or file an issue for a converter."
        )


class ParamsError(EdgecvError):
    """The parameters do not match the graph (missing, unreadable or wrong shape)."""


class ConversionError(EdgecvError):
    """One node could not be converted (bad attribute, incompatible shapes)."""


class ShapeError(EdgecvError):
    """An input tensor has the wrong shape or dtype."""


class ModelNotFoundError(EdgecvError):
    """A model name that is neither a known zoo model/alias nor a symbol file."""


class ProfileError(EdgecvError):
    """An unknown or malformed device profile."""


class PackageError(EdgecvError):
    """A deploy package is missing files, corrupt, or from another edgecv version."""


class QuantizedGraphError(UnsupportedOpsError):
    """The graph is an int8 (quantized, MKL-DNN fused) graph: refused as a whole."""

    def __init__(self, counts: dict[str, int]):
        self.counts = dict(counts)
        listed = ", ".join(f"`{op}`" for op in sorted(counts))
        EdgecvError.__init__(
            self,
            f"int8 graphs are not supported (quantized ops found: {listed}); deploy the "
            "float32 model instead (the same name without `_int8`).",
        )


# Modules of the optional parts of edgecv, and the extra of ``pip install`` that brings each.
EXTRAS = {
    "tvm": "compiler",
    "mxnet": "compiler",
    "gluoncv": "compiler",
    "skimage": "compiler",
    "scipy": "compiler",
    "xgboost": "compiler",
    "psutil": "compiler",
    "tqdm": "compiler",
    "cloudpickle": "compiler",
    "tornado": "compiler",
    "onnx": "compiler",
    "pyopencl": "opencl",
    "cv2": "images",
}


def missing_extra(err: ImportError, what: str) -> EdgecvError | None:
    """The error for ``what`` (a command) when ``err`` is a module of an extra this install
    lacks (a board's device runtime has no compiler), else None."""
    top = (getattr(err, "name", None) or "").partition(".")[0]
    extra = EXTRAS.get(top)
    if extra is None:
        return None
    if extra == "compiler":
        needs = f"edgecv's compiler side (a workstation's install), and `{top}` is not here"
    else:
        needs = f"`{top}`, which is not installed here"
    return EdgecvError(f"{what} needs {needs}: pip install 'edgecv[{extra}]'")


def foreign_message(err: BaseException, limit: int | None = None) -> str:
    """The meaningful line of another library's error, without its traceback text.

    MXNet's errors start with ``Traceback (most recent call last):`` and C++ file lines;
    the user needs the last line, without ``MXNetError: Check failed: <expr>:``. With
    ``limit``, a longer line is cut after its last full sentence within ``limit``
    characters (Gluon appends advice and links to its own).
    """
    lines = [line.strip() for line in str(err).strip().splitlines()]
    lines = [
        line
        for line in lines
        if line and not line.startswith(("Traceback", "File ", "[bt]", "Stack trace"))
    ]
    if not lines:
        return type(err).__name__
    last = lines[-1]
    for prefix in ("MXNetError:", "TVMError:", "ValueError:", "RuntimeError:"):
        last = last.removeprefix(prefix).strip()
    if last.startswith("Check failed:") and ": " in last[len("Check failed:") :]:
        last = last[len("Check failed:") :].split(": ", 1)[1]
    if limit is not None and len(last) > limit:
        end = last.rfind(". ", 0, limit)
        last = last[: end + 1] if end > 0 else last[: limit - 3] + "..."
    return last or type(err).__name__
