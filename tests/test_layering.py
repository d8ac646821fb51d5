"""Imports run one way: the board's device runtime never reaches into the compiler side.

Every import statement of a module is read from its source (those inside functions
too), so an import added anywhere in the runtime that would pull in TVM's compiler,
MXNet or a compiler stage fails here, not on a board.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

EDGECV = Path(__file__).resolve().parent.parent / "edgecv"
# What `edgecv.load(path).run(x)` imports: the runtime and the package reader.
DEVICE_SIDE = [
    *sorted((EDGECV / "runtime").glob("*.py")),
    *(EDGECV / f"{name}.py" for name in ("__init__", "errors", "model", "package",
                                         "package_format", "imaging", "outputs", "progress")),
]  # fmt: skip
# The compiler side: edgecv's stages and the libraries only they need.
COMPILER_SIDE = {
    "edgecv.frontend", "edgecv.ops", "edgecv.lowering", "edgecv.fallback", "edgecv.schedules",
    "edgecv.codegen", "edgecv.pipelines", "edgecv.graph_tuner", "edgecv.tuning",
    "edgecv.deploy", "edgecv.profiles", "edgecv.source", "edgecv.bench", "edgecv.testing",
    "tvm", "mxnet", "gluoncv",
}  # fmt: skip


def imports_of(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports, anywhere in it."""
    package = ".".join(path.relative_to(EDGECV.parent).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def test_imports_of_reads_relative_and_nested_imports():
    """The reader itself: a relative import inside a function is found, resolved."""
    assert "edgecv.runtime.nvcc" in imports_of(EDGECV / "runtime" / "kernel_cache.py")
    assert "edgecv.errors" in imports_of(EDGECV / "runtime" / "executor.py")


@pytest.mark.parametrize("path", DEVICE_SIDE, ids=lambda p: str(p.relative_to(EDGECV)))
def test_the_device_runtime_never_imports_the_compiler_side(path):
    bad = sorted(
        name for name in imports_of(path)
        if any(name == c or name.startswith(c + ".") for c in COMPILER_SIDE)
    )  # fmt: skip
    assert not bad, f"{path.relative_to(EDGECV)} imports the compiler side: {bad}"
