"""A build's precision and its INT8 decision each have one home.

``--precision`` (or ``deploy(precision=...)``) is parsed once, into
:class:`edgecv.board.precision.Precision`, whose values are written in that one place. The dot
product an INT8 build's convolutions run on is decided once, by the CPU pipeline, and
handed to the stages that need it (quantization, the graph tuner, the lowering); what a
CPU's dot-product instructions are (:mod:`edgecv.schedules.cpu.dot_product`) and their
tensor intrinsics live apart from the rule that uses them, as TVM keeps
``tir/tensor_intrin/x86.py`` apart from its rules.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from edgecv.board.errors import EdgecvError
from edgecv.board.precision import PRECISIONS, Precision
from edgecv.cli import build_parser
from edgecv.pipelines import BuildOptions

EDGECV = Path(__file__).resolve().parent.parent / "edgecv"
SOURCES = sorted(EDGECV.rglob("*.py"))


def _relative(path: Path) -> str:
    return str(path.relative_to(EDGECV.parent))


def test_precision_is_parsed_once_at_the_options_with_one_error():
    assert PRECISIONS == ("fp32", "int8", "fp16")
    assert BuildOptions().precision is Precision.FP32
    assert BuildOptions(precision="int8").precision is Precision.INT8
    assert BuildOptions(precision=Precision.FP16).precision is Precision.FP16
    assert dataclasses.replace(BuildOptions(precision="fp16")).precision is Precision.FP16
    # the manifest records the same string as before the type
    assert Precision.INT8.value == "int8" and str(Precision.INT8) == "int8"
    with pytest.raises(EdgecvError, match=r"^--precision must be one of fp32, int8, fp16, not "):
        BuildOptions(precision="int16")


def test_the_command_line_offers_the_values_of_the_type():
    parser = build_parser()
    (commands,) = [a for a in parser._actions if a.dest == "command"]
    (option,) = [a for a in commands.choices["deploy"]._actions if a.dest == "precision"]
    assert tuple(option.choices) == PRECISIONS and option.default == Precision.FP32.value


def _bare_precision_strings(tree: ast.AST):
    """(line, code) of every comparison of a precision with a string literal, every
    ``.get("precision", <literal>)`` and every literal listing all the values."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            literal = any(isinstance(o, ast.Constant) and o.value in PRECISIONS for o in operands)
            if literal and any("precision" in ast.unparse(o) for o in operands):
                yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            args = node.args
            if (
                node.func.attr == "get"
                and len(args) == 2
                and all(isinstance(a, ast.Constant) for a in args)
                and args[0].value == "precision"
                and args[1].value in PRECISIONS
            ):
                yield node.lineno, ast.unparse(node)
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            values = [e.value for e in node.elts if isinstance(e, ast.Constant)]
            if len(values) == len(node.elts) and set(values) == set(PRECISIONS):
                yield node.lineno, ast.unparse(node)


def test_no_module_compares_a_precision_with_a_bare_string():
    found = [
        f"{_relative(path)}:{line}: {code}"
        for path in SOURCES
        if path != EDGECV / "precision.py"
        for line, code in _bare_precision_strings(ast.parse(path.read_text()))
    ]
    assert not found, "precision as a bare string (use edgecv.board.precision.Precision):\n" + (
        "\n".join(found)
    )


def _imports(path: Path) -> set[str]:
    package = ".".join(path.relative_to(EDGECV.parent).with_suffix("").parts[:-1]).split(".")
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *filter(None, [node.module])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def test_no_stage_imports_the_dot_product_from_the_rule_that_uses_it():
    rule = "edgecv.schedules.cpu.conv2d_int8"
    outside = [
        _relative(path)
        for path in SOURCES
        if "schedules" not in path.relative_to(EDGECV).parts
        and any(name == rule or name.startswith(rule + ".") for name in _imports(path))
    ]
    assert not outside, f"these import the INT8 rule's module for what a CPU can do: {outside}"


def test_the_int8_decision_is_made_in_one_place():
    """``dot_product_of`` is asked by the rule (as TVM's rules ask
    ``is_target_available`` themselves) and by the CPU pipeline's decision, nowhere else:
    the other stages receive the answer."""
    askers = sorted(
        _relative(path)
        for path in SOURCES
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("dot_product_of")
    )
    assert askers == ["edgecv/pipelines/cpu.py", "edgecv/schedules/cpu/conv2d_int8.py"]


def test_the_graph_tuner_packs_int8_convolutions_by_the_decision_it_is_handed():
    """A float32 ``options.precision`` does not matter to the graph tuner: a uint8 x
    int8 convolution is packed for the dot product it is handed, and stays plain when
    it is handed none."""
    from tvm import relax

    from edgecv.graph_tuner import choose_layouts
    from edgecv.profiles import load_profile
    from edgecv.schedules.cpu.dot_product import dot_product_of

    profile = load_profile("cpu")
    dot = dot_product_of(profile.tvm_target())
    if dot is None:
        pytest.skip("this CPU has no int8 dot-product instruction edgecv uses")
    channels = 4 * dot.lanes
    rng = np.random.RandomState(0)
    weight = rng.randint(-63, 64, (channels, channels, 3, 3)).astype("int8")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, channels, 8, 8), "uint8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = relax.op.nn.conv2d(x, relax.const(weight), padding=1, out_dtype="int32")
            out = bb.emit_output(relax.op.astype(y, "float32"))
        bb.emit_func_output(out)
    options = BuildOptions(layout="packed", tuning=None)
    assert options.precision is Precision.FP32
    _, handed = choose_layouts(bb.get(), profile, options, dot=dot)
    assert handed["chosen"] == f"NCHW{dot.lanes}c", handed
    _, none = choose_layouts(bb.get(), profile, options, dot=None)
    assert none["chosen"] == "NCHW" and none["reason"] == "no convolution can be packed"
