"""The precision of a build: what ``--precision`` takes and a package's manifest records
(``build.precision``), its values written here once and parsed here once.

Plain Python, no TVM: the command line (which a board installs too) offers the values,
the pipelines decide by them (:mod:`edgecv.pipelines.int8` for ``int8`` on CPU profiles,
:mod:`edgecv.pipelines.fp16` for ``fp16`` on GPU profiles).
"""

from __future__ import annotations

import enum

from .errors import EdgecvError


class Precision(enum.Enum):
    """The arithmetic of a build's kernels. ``FP32``: float32 (the default). ``INT8``
    (CPU profiles): convolutions and dense layers quantized after calibration. ``FP16``
    (GPU profiles): float16 weights and activations, reductions and vision operators in
    float32. A value is the string ``--precision`` takes and the manifest records."""

    FP32 = "fp32"
    INT8 = "int8"
    FP16 = "fp16"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: str | Precision) -> Precision:
        """``value`` as a :class:`Precision` (a string as ``--precision`` takes it)."""
        if isinstance(value, cls):
            return value
        try:
            return cls(value)
        except ValueError:
            raise EdgecvError(
                f"--precision must be one of {', '.join(PRECISIONS)}, not {value!r}"
            ) from None


# the strings ``--precision`` accepts, in the order the command line lists them
PRECISIONS = tuple(p.value for p in Precision)
