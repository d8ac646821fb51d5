"""``edgecv profiles``: the device profiles, and whether this version can deploy for each."""

from __future__ import annotations

import argparse


def add_parser(sub, common) -> None:
    """Register ``profiles`` on the CLI's subparsers."""
    p = sub.add_parser("profiles", parents=[common], help="list device profiles")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..profiles import list_profiles

    for p in list_profiles():
        status = "ready" if p.available else f"needs the {p.runtime} backend (not in this version)"
        print(f"{p.name:<12} {p.runtime:<7} {status:<45} {p.description}")
    return 0
