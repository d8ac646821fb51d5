"""The ``edgecv`` command line: the parser assembled from each command's module
(:mod:`edgecv.commands`, and ``bench``, ``demo``, ``tune`` beside what they drive) and
``main``'s dispatch, where every failure becomes one ``edgecv: error:`` line."""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
import warnings

from .board.errors import EdgecvError, foreign_message, missing_extra
from .commands import deploy, devices, profiles, run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgecv", description="Deploy GluonCV/MXNet vision models to edge GPUs and CPUs."
    )
    verbose = "log progress; print the traceback of a failure (for a bug report)"
    parser.add_argument("-v", "--verbose", action="store_true", help=verbose)
    # -v is accepted after the command too (`edgecv deploy ... -v`)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=verbose
    )
    sub = parser.add_subparsers(dest="command", required=True)
    deploy.add_parser(sub, common)
    run.add_parser(sub, common)
    from .bench.command import add_parser as add_bench

    add_bench(sub, common)
    from .demo import add_parser as add_demo

    add_demo(sub, common)
    _add_tune(sub, common)
    devices.add_parser(sub, common)
    profiles.add_parser(sub, common)
    return parser


def _add_tune(sub, common) -> None:
    """``tune`` and ``rpc-server``; on a board's device runtime (no compiler side to tune
    with) a ``tune`` that refuses in one line naming the install."""
    try:
        from .tuning.command import add_parser as add_tune
    except ImportError as err:
        refusal = missing_extra(err, "`edgecv tune`")
        if refusal is None:
            raise
        t = sub.add_parser("tune", parents=[common], help="tune kernels (needs edgecv[compiler])")
        t.add_argument("arguments", nargs=argparse.REMAINDER)
        t.set_defaults(func=_refuse(refusal))
    else:
        add_tune(sub, common)


def _refuse(error: EdgecvError):
    def refuse(args: argparse.Namespace) -> int:
        raise error

    return refuse


def _format_warning(message, category, filename, lineno, line=None) -> str:
    text = " ".join(str(message).split())
    return f"edgecv: warning: {text}\n"


def main(argv: list[str] | None = None) -> int:
    """The ``edgecv`` command: every failure ends in one ``edgecv: error:`` line and a
    non-zero exit (2: bad input or environment; 1: a bug in edgecv); ``-v`` adds the
    traceback, for a bug report."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="[edgecv] %(message)s"
    )
    warnings.filterwarnings("ignore", module="mxnet")
    if not args.verbose:  # a user reads the warning, not the line of edgecv that raised it
        warnings.formatwarning = _format_warning
    try:
        try:
            return args.func(args)
        except ImportError as err:  # an optional part this install lacks (a board's)
            refusal = missing_extra(err, f"`edgecv {args.command}`")
            if refusal is None:
                raise
            raise refusal from None
    except EdgecvError as err:
        if args.verbose:
            traceback.print_exc()
        print(f"edgecv: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("edgecv: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # not the user's fault: one line, the traceback with -v
        if args.verbose:
            traceback.print_exc()
        print(
            f"edgecv: error: internal error ({type(err).__name__}: {foreign_message(err)}); "
            "run again with -v for the traceback and report it",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
