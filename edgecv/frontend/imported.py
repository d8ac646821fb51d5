"""What every frontend ends in: a Relax module ``main(inputs...) -> outputs`` and its
signature, the same for an MXNet graph and an ONNX file, so nothing below the frontend
knows which one ran."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import tvm

from ..board.errors import ShapeError


@dataclass
class ImportedModel:
    """A Relax module with one function ``main(inputs...) -> outputs``."""

    mod: tvm.IRModule
    input_names: list[str]
    input_shapes: dict[str, tuple[int, ...]]
    input_dtypes: dict[str, str]
    output_names: list[str]
    output_shapes: list[tuple[int, ...]] = field(default_factory=list)
    output_dtypes: list[str] = field(default_factory=list)
    # a quantized model's own decisions (ONNX QDQ: frontend/onnx/qdq.py), None for float
    quantization: list[dict] | None = None


# The most elements edgecv takes in one input tensor (TVM's kernels index a tensor with
# 32-bit integers where its size allows; an image batch is far below this).
MAX_INPUT_ELEMENTS = 2**31 - 1
_MAX_RANK = 8


def check_input_shapes(input_shapes: object) -> dict[str, tuple[int, ...]]:
    """Each graph input's shape as a tuple of positive ints, or one ShapeError line
    naming the input, what is wrong with its shape and what to pass instead."""
    if not isinstance(input_shapes, dict) or not input_shapes:
        raise ShapeError(
            f"input shapes should map each graph input to its shape, such as "
            f"{{'data': (1, 3, 224, 224)}}; got {input_shapes!r:.80}"
        )
    checked = {}
    for name, shape in input_shapes.items():
        fix = "pass --input-shape N,C,H,W (each a whole number >= 1)"
        if not isinstance(name, str):
            raise ShapeError(f"input name {name!r:.40} is not a string; {fix}")
        if not isinstance(shape, (tuple, list)) or not all(
            isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in shape
        ):
            raise ShapeError(f"input `{name}` has shape {shape!r:.80}, not whole numbers; {fix}")
        shape = tuple(int(d) for d in shape)
        if not 1 <= len(shape) <= _MAX_RANK:
            raise ShapeError(
                f"input `{name}` has shape {shape} of rank {len(shape)}; edgecv takes inputs "
                f"of rank 1 to {_MAX_RANK}: {fix}"
            )
        if any(d < 1 for d in shape):
            raise ShapeError(f"input `{name}` has shape {shape}, with a size below 1; {fix}")
        if math.prod(shape) > MAX_INPUT_ELEMENTS:
            raise ShapeError(
                f"input `{name}` has shape {shape}: {math.prod(shape):,} elements, more than "
                f"the {MAX_INPUT_ELEMENTS:,} edgecv takes in one tensor; pass a smaller shape"
            )
        checked[name] = shape
    return checked
