"""``python -m edgecv.testing.probe SYMBOL PARAMS --shape N,C,H,W``: the probe's table."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import numpy as np

from . import __doc__ as probe_doc
from .divergence import probe_divergence


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m edgecv.testing.probe SYMBOL PARAMS --shape N,C,H,W``: print the table."""
    parser = argparse.ArgumentParser(
        prog="python -m edgecv.testing.probe", description=probe_doc.split("\n\n")[0]
    )
    parser.add_argument("symbol")
    parser.add_argument("params")
    parser.add_argument("--shape", help="input shape N,C,H,W (input `data`)")
    parser.add_argument("--input", help="a .npy input (input `data`); a photo by default")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--on", default=None, help="OpenCL device of a GPU profile")
    parser.add_argument("--ops", default=None, help="comma-separated MXNet ops to compare")
    parser.add_argument("--stages", default=None, help="comma-separated node names")
    parser.add_argument("--layout", default="NCHW", help="conv layouts (default NCHW: fast)")
    parser.add_argument("--factor", type=float, default=4.0)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--all", action="store_true", help="print every stage")
    args = parser.parse_args(argv)
    from edgecv.frontend.mxnet.random_weights import example_input
    from edgecv.pipelines import BuildOptions

    if args.input:
        x = np.load(args.input)
    elif args.shape:
        x = example_input(tuple(int(d) for d in args.shape.split(",")), 0)
    else:
        parser.error("give --shape or --input")
    report = probe_divergence(
        args.symbol,
        args.params,
        {"data": x},
        profile=args.profile,
        on=args.on,
        stages=args.stages.split(",") if args.stages else None,
        ops=args.ops.split(",") if args.ops else None,
        options=BuildOptions(layout=args.layout),
        factor=args.factor,
        trials=args.trials,
    )
    print(report.table(limit=None if args.all else 40))
    return 1 if report.first else 0


if __name__ == "__main__":
    sys.exit(main())
