"""Imports run one way: each module of edgecv imports only from the floors below its
own, and the board's device runtime never reaches into the compiler side.

Every import statement of a module is read from its source (those inside functions
too), so an import added anywhere that reaches up a floor, closes a cycle, or would pull
TVM's compiler, MXNet or a compiler stage into the runtime fails here, not on a board.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

EDGECV = Path(__file__).resolve().parent.parent / "edgecv"

# The floors of edgecv, lowest first: the one place the order is written down
# (docs/architecture.md says what each holds). A name is a package or a module directly
# under edgecv/; "__init__" is edgecv/__init__.py, the public face (`edgecv.load`,
# `edgecv.__version__`). A module imports from its own package and from lower floors,
# never from a higher floor nor from another name of its own floor.
FLOORS = [
    # the device side: what a board runs (`edgecv.load(path).run(x)`, `edgecv run`)
    ["board"],
    ["op_registry"],  # `edgecv.register_op`: a user's operator, for the compiler to build
    ["__init__"],
    # the compiler side, in the order of the flow
    ["_mxnet", "ops", "profiles"],
    ["frontend"],
    ["source"],
    ["lowering"],
    ["fallback"],
    ["schedules"],
    ["codegen"],
    ["graph_tuner"],  # times candidate layouts through lowering, schedules and code
    ["pipelines"],
    ["tuning", "deploy"],  # tuning runs the pipeline's stages up to the kernels it tunes
    # what a user calls to verify: compare, check_op and the probe deploy models and run
    # their references (MXNet, ONNX Runtime, NumPy) within the one tolerance table
    ["testing"],
    ["bench", "demo", "commands"],  # the commands beside bench and demo, cli assembles
    ["cli"],
]
# The floors inside edgecv/board/, by the same rule: a name is a package or a module
# directly under edgecv/board/; "__init__" is its docstring and imports nothing.
BOARD_FLOORS = [
    ["__init__", "errors", "_version", "progress"],
    ["plan", "arguments", "imaging", "precision", "durable", "processing", "video_results"],
    ["manifest", "runtime", "outputs", "decoders", "frames"],
    ["package", "video"],
    ["model"],
]
FLOOR = {name: floor for floor, names in enumerate(FLOORS) for name in names}
BOARD_FLOOR = {name: floor for floor, names in enumerate(BOARD_FLOORS) for name in names}


def module_of(path: Path) -> str:
    """``edgecv/tuning/command.py`` -> ``edgecv.tuning.command``; a package's
    ``__init__.py`` -> the package."""
    parts = path.relative_to(EDGECV.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def floor_name(module: str) -> str:
    """The name in FLOORS a module of edgecv belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def board_name(module: str) -> str | None:
    """The name in BOARD_FLOORS a module of edgecv/board/ belongs to, else None."""
    parts = module.split(".")
    if floor_name(module) != "board":
        return None
    return parts[2] if len(parts) > 2 else "__init__"


MODULES = {module_of(p): p for p in sorted(EDGECV.rglob("*.py"))}
# What `edgecv.load(path).run(x)` and `edgecv run` import: the floors of the device side.
DEVICE_SIDE = [
    path
    for module, path in MODULES.items()
    if FLOOR.get(floor_name(module), len(FLOORS)) <= FLOOR["__init__"]
]
# The compiler side: edgecv's stages and the libraries only they need.
COMPILER_SIDE = {
    "edgecv.frontend",
    "edgecv.ops",
    "edgecv.lowering",
    "edgecv.fallback",
    "edgecv.schedules",
    "edgecv.codegen",
    "edgecv.pipelines",
    "edgecv.graph_tuner",
    "edgecv.tuning",
    "edgecv.deploy",
    "edgecv.profiles",
    "edgecv.source",
    "edgecv.bench",
    "edgecv.testing",
    "tvm",
    "mxnet",
    "gluoncv",
}


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
    runtime = EDGECV / "board" / "runtime"
    assert "edgecv.board.runtime.nvcc" in imports_of(runtime / "kernel_cache.py")
    assert "edgecv.board.errors" in imports_of(runtime / "executor.py")


@pytest.mark.parametrize("path", DEVICE_SIDE, ids=lambda p: str(p.relative_to(EDGECV)))
def test_the_device_runtime_never_imports_the_compiler_side(path):
    bad = sorted(
        name
        for name in imports_of(path)
        if any(name == c or name.startswith(c + ".") for c in COMPILER_SIDE)
    )
    assert not bad, f"{path.relative_to(EDGECV)} imports the compiler side: {bad}"


@functools.cache
def edgecv_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of an edgecv module in ``path``, those inside
    functions too; ``from edgecv import __version__`` imports ``edgecv`` itself."""
    package = ".".join(path.relative_to(EDGECV.parent).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *filter(None, [base])])
            for alias in node.names:  # a submodule by name, else a name of ``base``
                name = f"{base}.{alias.name}"
                found.append((node.lineno, name if name in MODULES else base))
    return sorted(
        {
            (line, module)
            for line, module in found
            if module == "edgecv" or module.startswith("edgecv.")
        }
    )


def edges() -> Iterator[tuple[Path, int, str, str]]:
    """(file, line, importer, imported) for every import of an edgecv module."""
    for module, path in MODULES.items():
        for line, imported in edgecv_imports(path):
            while imported not in MODULES:  # ``edgecv.pkg.name`` -> ``edgecv.pkg``
                imported = imported.rpartition(".")[0]
            yield path, line, module, imported


def test_edgecv_imports_resolve_submodules_and_names():
    top = edgecv_imports(EDGECV / "__init__.py")  # `from .board.errors import` on its line
    source = (EDGECV / "__init__.py").read_text().splitlines()
    found = [m for n, m in top if "from .board.errors import" in source[n - 1]]
    assert found == ["edgecv.board.errors"], found
    pipelines = edgecv_imports(EDGECV / "pipelines" / "__init__.py")
    assert {m for _, m in pipelines} >= {"edgecv.pipelines.steps", "edgecv.pipelines.cpu"}


def test_every_package_and_module_has_a_floor():
    names = {floor_name(m) for m in MODULES}
    assert not names - FLOOR.keys(), f"no floor in FLOORS for {sorted(names - FLOOR.keys())}"
    assert not FLOOR.keys() - names, f"FLOORS names what is gone: {sorted(FLOOR.keys() - names)}"
    assert sum(map(len, FLOORS)) == len(FLOOR), "a name is on two floors"
    inside = {board_name(m) for m in MODULES} - {None}
    missing = sorted(inside - BOARD_FLOOR.keys())
    assert not missing, f"no floor in BOARD_FLOORS for {missing}"
    gone = BOARD_FLOOR.keys() - inside
    assert not gone, f"BOARD_FLOORS names what is gone: {sorted(gone)}"
    assert sum(map(len, BOARD_FLOORS)) == len(BOARD_FLOOR), "a name is on two board floors"


def test_no_module_imports_from_a_higher_floor():
    upward = []
    for path, line, module, imported in edges():
        here, there, floor = floor_name(module), floor_name(imported), FLOOR
        if here == there == "board":  # inside the board: its own floors
            here, there, floor = board_name(module), board_name(imported), BOARD_FLOOR
        if here != there and floor[there] >= floor[here]:
            upward.append(
                f"{path.relative_to(EDGECV.parent)}:{line}: {module} ({here}, floor "
                f"{floor[here]}) imports {imported} ({there}, floor {floor[there]})"
            )
    assert not upward, "imports from a floor not below the importer's:\n" + "\n".join(upward)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def board_unit(module: str) -> str:
    """A module of edgecv/board/ as its name in BOARD_FLOORS, any other as itself."""
    return f"board.{board_name(module)}" if board_name(module) else module


@pytest.mark.parametrize("level", ["package", "board", "module"])
def test_no_import_cycles(level):
    """No cycle between edgecv's packages (and top-level modules), nor between those of
    edgecv/board/, nor between modules."""
    unit = {"package": floor_name, "board": board_unit, "module": lambda module: module}[level]
    graph: dict[str, set[str]] = {}
    where: dict[tuple[str, str], str] = {}
    for path, line, module, imported in edges():
        a, b = unit(module), unit(imported)
        if a != b:
            graph.setdefault(a, set()).add(b)
            where.setdefault((a, b), f"{path.relative_to(EDGECV.parent)}:{line}")
    found = [
        ", ".join(f"{a} -> {b} ({where[a, b]})" for a in cycle for b in graph[a] & set(cycle))
        for cycle in cycles(graph)
    ]
    assert not found, f"import cycles between {level}s:\n" + "\n".join(found)
