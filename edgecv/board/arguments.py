"""Command-line arguments that more than one command takes: ``--input-shape`` of
``deploy`` (:mod:`edgecv.commands.deploy`) and ``tune`` (:mod:`edgecv.tuning.command`),
and the graph tuner's measuring budget (``deploy --layout-budget``)."""

from __future__ import annotations

import argparse

from .errors import EdgecvError

# The graph tuner's default measuring budget (seconds): it keeps a first deploy of a
# large detector within the four minutes, and plans from the part measured in it come
# close to the fully measured one (docs/graph-tuner.md; the times:
# benchmarks/results/first_deploy-2026-11-27-zen3.md).
DEFAULT_LAYOUT_BUDGET_S = 90.0


def layout_budget(text: str) -> float | None:
    """``--layout-budget``: positive seconds, or ``none`` (no limit)."""
    if text.strip().lower() == "none":
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"expected positive seconds or `none`, got {text!r}")
    return seconds


def port(text: str) -> int:
    """A TCP port: 1-65535 (``--port`` of ``rpc-server``)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"expected a TCP port from 1 to 65535, got {text!r}")
    return value


def parse_shape(text: str):
    """``N,C,H,W`` (the model's one input), or ``NAME=DIMS`` (one of several inputs, or an
    ONNX input of another rank than 4: ``tokens=1,128``)."""
    name, _, dims = text.rpartition("=")
    try:
        shape = tuple(int(v) for v in dims.replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected N,C,H,W or NAME=N,C,H,W integers, got {text!r}"
        ) from None
    if name and 1 <= len(shape) <= 8 and min(shape) > 0:
        return name, shape
    if len(shape) != 4 or min(shape) <= 0:
        raise argparse.ArgumentTypeError(
            f"expected 4 positive integers N,C,H,W (NAME=DIMS for an input of another rank), "
            f"got {text!r}"
        )
    return shape


def input_shapes(values: list | None):
    """The ``--input-shape`` options given: None, one shape, or a shape per named input."""
    if not values:
        return None
    named = [v for v in values if isinstance(v[0], str)]
    if not named and len(values) == 1:
        return values[0]
    if len(named) != len(values):
        raise EdgecvError(
            "--input-shape: a model with several inputs takes one NAME=N,C,H,W per input "
            "(e.g. --input-shape data0=1,3,127,127 --input-shape data1=1,3,287,287)"
        )
    return dict(named)


SHAPE_HELP = (
    "N,C,H,W (default: the model's usual size); NAME=N,C,H,W once per input for a model "
    "with several inputs"
)


def pin_argument(parser: argparse.ArgumentParser) -> None:
    """``--sha256`` of ``run``, ``bench`` and ``demo``: load the package only when it is
    the one `edgecv deploy` pinned."""
    parser.add_argument(
        "--sha256",
        metavar="HEX",
        help="run the package only if its manifest (which lists every file's sha256) has "
        "this sha256, as `edgecv deploy` printed it; refuse any other before it runs",
    )
