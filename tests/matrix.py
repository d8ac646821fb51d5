"""Test matrices sized for the default suite, whole under ``-m heavy``.

Most GPU operator tests compile one OpenCL program per case (2-15 s each on Intel's CPU
runtime), so a full cross product of cases and variants would take most of the suite's
time. By default every case runs once and every variant runs at least once; the rest of
the product, and the larger property-based searches, run with ``-m heavy``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import pytest

# Set by conftest.pytest_configure when the marker expression selects heavy tests.
HEAVY_ENV = "EDGECV_TESTS_HEAVY"


def heavy_selected() -> bool:
    return os.environ.get(HEAVY_ENV) == "1"


def each_once(cases: Sequence, variants: Sequence, variant_ids: Sequence[str] | None = None):
    """``pytest.param(*case, *variant)`` for the product of ``cases`` and ``variants``:
    case ``i`` with variant ``i mod len(variants)`` by default, every other pair heavy.
    A tuple is several arguments; anything else (a list of lengths) is one."""
    params = []
    for i, case in enumerate(cases):
        case = case if isinstance(case, tuple) else (case,)
        for j, variant in enumerate(variants):
            variant = variant if isinstance(variant, tuple) else (variant,)
            marks = () if j == i % len(variants) else (pytest.mark.heavy,)
            ident = f"{i}-{variant_ids[j]}" if variant_ids else None
            params.append(pytest.param(*case, *variant, marks=marks, id=ident))
    return params


def examples(n: int) -> int:
    """Hypothesis examples: ``n`` with ``-m heavy``, a third of it (at least 3) by default."""
    return n if heavy_selected() else max(3, n // 3)
