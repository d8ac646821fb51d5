"""Progress reporting for long stages (deploy, tune, bench): one line per stage plus
progress bars (tqdm) over the steps inside a stage.

Usage, from any stage::

    from edgecv.board import progress

    progress.say("compiling 57 kernels for deeplens")        # one line, always shown
    for kernel in progress.steps(kernels, "scheduling", unit="kernel"):
        ...                                                   # a bar on a terminal
    with progress.bar(total=len(programs), desc="building") as bar:
        ...; bar.update(1)                                    # when there is no iterable

Bars are drawn on stderr only when stderr is a terminal (and ``EDGECV_PROGRESS`` is not
``0``), so logs, pipes and tests get the stage lines alone; ``EDGECV_PROGRESS=1`` forces
bars on. Stage lines start with ``[edgecv]``, like the CLI's other messages.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from tqdm import tqdm

T = TypeVar("T")


def bars_enabled() -> bool:
    """Whether progress bars are drawn: stderr is a terminal, unless ``EDGECV_PROGRESS``
    says otherwise (``0`` never, ``1`` always)."""
    setting = os.environ.get("EDGECV_PROGRESS", "")
    if setting in ("0", "1"):
        return setting == "1"
    return sys.stderr.isatty()


def say(message: str) -> None:
    """Print one stage line to stderr (``[edgecv] message``); shown with or without bars."""
    try:
        from tqdm import tqdm
    except ImportError:  # a board's device runtime draws no bars to keep clear of
        print(f"[edgecv] {message}", file=sys.stderr)
        return
    tqdm.write(f"[edgecv] {message}", file=sys.stderr)


def steps(
    iterable: Iterable[T], desc: str, total: int | None = None, unit: str = "step"
) -> Iterator[T]:
    """Iterate over ``iterable`` with a progress bar labelled ``desc``.

    Parameters
    ----------
    iterable : iterable
        The work items (kernels, programs, trials, frames).
    desc : str
        What is being done ("scheduling", "compiling OpenCL").
    total : int, optional
        The number of items when ``len(iterable)`` does not give it (generators).
    unit : str
        The name of one item, shown in the rate ("kernel/s").

    Yields
    ------
    The items of ``iterable``, unchanged. The bar disappears when the loop ends; a
    :func:`say` line is the place for the stage's summary.
    """
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    from tqdm import tqdm

    yield from tqdm(
        iterable,
        desc=desc,
        total=total,
        unit=unit,
        leave=False,
        file=sys.stderr,
        disable=not bars_enabled(),
        dynamic_ncols=True,
    )


def bar(total: int, desc: str, unit: str = "step") -> tqdm:
    """A bar to advance by hand (``with bar(n, "building") as b: ... b.update(1)``);
    same display rules as :func:`steps`."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        leave=False,
        file=sys.stderr,
        disable=not bars_enabled(),
        dynamic_ncols=True,
    )


__all__ = ["bar", "bars_enabled", "say", "steps"]
