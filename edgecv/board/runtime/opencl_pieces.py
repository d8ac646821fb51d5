"""An OpenCL program in pieces: one per step kernel, named by its content.

A model's program is one OpenCL C source (``kernels/opencl.cl.gz``). Compiled whole, it
is one ``clBuildProgram`` on one core: SSD-512 ResNet-50's 120 device kernels took 66 s
on Intel's CPU runtime. Split into pieces, the pieces compile in parallel (38 s in two
processes on two cores), each is cached on its own, and a piece is found in the cache by
any program holding the same code: the graph tuner's measured candidates are the
deploy's kernels, and two models share many.

A piece holds the device kernels of one step kernel (TVM names them ``<kernel>_kernel``,
``<kernel>_kernel_1``, ...) after the program's preamble (pragmas), with every name that
depends on the model rather than the code replaced: the kernels are named
``edgecv_<digest>_<i>`` after a digest of the piece, and their parameters ``_pN_``
(arguments are set by position, so the names mean nothing at run time).

A source this module does not recognize (text between kernels other than comments and
declarations, a kernel it cannot delimit) stays one piece with its own names.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

# `__kernel [__attribute__((...))] void NAME(PARAMS) {` on one line, as TVM prints it
_DEFINITION = re.compile(r"^__kernel\b.*?\bvoid\s+(\w+)\s*\((.*)\)\s*\{\s*$")
_DECLARATION = re.compile(r"^__kernel\b.*\)\s*;\s*$")
_ANY_KERNEL = re.compile(r"__kernel\b[^;{]*?\bvoid\s+(\w+)\s*\(")
_STEP = re.compile(r"^(\w+?_kernel)(?:_\d+)?$")


@dataclass(frozen=True)
class Piece:
    """Source to compile alone, and each kernel's name in the program -> in ``source``."""

    source: str
    names: dict[str, str]


def split_program(source: str) -> list[Piece]:
    """``source`` as pieces (see the module docstring)."""
    lines = source.splitlines()
    starts = [i for i, line in enumerate(lines) if _DEFINITION.match(line)]
    preamble = [
        line
        for line in lines[: starts[0] if starts else len(lines)]
        if line.strip() and not _DECLARATION.match(line) and not line.startswith("// Function:")
    ]
    kernels = _kernels(lines, starts, {line.strip() for line in preamble}) if starts else None
    if kernels is None:
        names = dict.fromkeys(_ANY_KERNEL.findall(source))
        return [Piece(source, {n: n for n in names})]
    steps: dict[str, list[tuple[str, list[str]]]] = {}
    for name, body in kernels:
        found = _STEP.match(name)
        steps.setdefault(found.group(1) if found else name, []).append((name, body))
    return [_canonical(preamble, members) for members in steps.values()]


def _kernels(
    lines: list[str], starts: list[int], preamble: set[str]
) -> list[tuple[str, list[str]]] | None:
    """(name, lines) of each kernel definition, or None when anything but blank lines,
    comments, kernel declarations and the preamble's preprocessor lines (TVM repeats
    both before each definition) stands between them."""
    kernels = []
    for number, start in enumerate(starts):
        depth, end = 0, None
        for i in range(start, len(lines)):
            depth += lines[i].count("{") - lines[i].count("}")
            if depth == 0:
                end = i + 1
                break
        if end is None:
            return None
        following = starts[number + 1] if number + 1 < len(starts) else len(lines)
        between = [line.strip() for line in lines[end:following]]
        if not all(_between_kernels(t, preamble) for t in between):
            return None
        kernels.append((_DEFINITION.match(lines[start]).group(1), lines[start:end]))
    return kernels


def _between_kernels(text: str, preamble: set[str]) -> bool:
    return (
        not text
        or text.startswith("//")
        or _DECLARATION.match(text) is not None
        or (text.startswith("#") and text in preamble)
    )


def _canonical(preamble: list[str], members: list[tuple[str, list[str]]]) -> Piece:
    texts = []
    for i, (name, body) in enumerate(members):
        text = "\n".join(body)
        params = _DEFINITION.match(body[0]).group(2)
        for j, param in enumerate(_parameter_names(params)):
            new = f"_p{j}_"
            if re.search(rf"\b{new}\b", text) is None:
                text = re.sub(rf"\b{re.escape(param)}\b", new, text)
        definition = rf"\bvoid\s+{re.escape(name)}\s*\("
        texts.append(re.sub(definition, f"void @KERNEL{i}@(", text, count=1))
    template = "\n".join(preamble + texts) + "\n"
    digest = hashlib.sha256(template.encode()).hexdigest()[:16]
    names = {name: f"edgecv_{digest}_{i}" for i, (name, _) in enumerate(members)}
    for i, new in enumerate(names.values()):
        template = template.replace(f"@KERNEL{i}@", new)
    return Piece(template, names)


def _parameter_names(params: str) -> list[str]:
    found = [re.search(r"(\w+)\s*$", p.strip()) for p in params.split(",") if p.strip()]
    return [f.group(1) for f in found if f]
