"""Fuzzing the importer and the package loader (issue 32, "Under load", item 5).

Every damaged input must end in one of two ways: an EdgecvError whose message is one
line, or a correct result (a well-formed imported module; a package that loads and
gives exactly the intact package's outputs). Any other exception escaping, a hang or a
crash of the interpreter is a failure.

- the importer: the tiny model's symbol JSON with keys deleted, renamed or retyped,
  nodes duplicated or dropped, input indices out of range or pointing forward (a
  cycle), garbage attributes, swapped operators, the text truncated or bit-flipped;
  its ``.params`` file truncated or bit-flipped; odd input shapes (0, negative, huge,
  wrong rank, not numbers).
- the loader: each package file truncated, bit-flipped, emptied, extended or deleted;
  manifest fields deleted or given values of another type, version or file; the plan
  and the params rewritten wrong with their checksums updated (what a buggy writer
  or a hand edit makes), so that the checks behind the checksums are reached too. The
  loader runs in a subprocess with a timeout: a damaged kernel library reaching the
  dynamic loader could end the process, which must fail this test, not the suite. Each
  case also reads ``/proc/self/maps`` to show that a library whose bytes were changed
  was never mapped.

Hypothesis runs derandomized (the same examples on every run); ``-m heavy`` runs many
more of them, and builds the mutated graphs that import.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from helpers import run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_run_faults import SHAPE, only_error_line, quick_package, tiny_model, x_of

from edgecv.board.errors import EdgecvError

# examples per property: the default suite / -m heavy
EXAMPLES = {
    "symbol": (150, 1000),
    "params": (60, 2000),
    "shapes": (60, 1000),
    "loader": (120, 2000),
}


def fuzz_settings(kind: str, heavy: bool = False):
    """Reproducible settings: the same examples on every run (CI included)."""
    return settings(
        max_examples=EXAMPLES[kind][heavy],
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


def assert_one_line(err: BaseException) -> str:
    message = str(err)
    assert message.strip() and "\n" not in message, f"{type(err).__name__}: {message!r}"
    return message


JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**66), 2**66), st.floats(), st.text(max_size=12)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=8,
)
# fmt: off
GARBAGE_ATTRS = st.sampled_from([
    "", "None", "(", "((((", "(0, 0)", "(-1, 3)", "(3,)", "(1, 1, 1, 1, 1, 1, 1, 1, 1)", "1e309",
    "-1", "0", "nan", "inf", "True", "[[]]", "(2**40,)", "'x'", "(1.5, 2)", "()", "100000000000",
    "{}", "(100000, 100000)", "[" * 200, "(None, 3)", "-0.0",
]) | st.text(max_size=10)
# fmt: on
ATTR_NAMES = st.sampled_from(
    "kernel stride pad dilate num_filter num_group no_bias layout pool_type global_pool "
    "pooling_convention act_type slope dim axis num_hidden flatten eps fix_gamma "
    "use_global_stats __shape__ num_args".split()
)


# -- the importer --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny model's symbol (parsed JSON), params file and params."""
    from edgecv.frontend.mxnet.mxnet_graph import load_params

    symbol, params = tiny_model(tmp_path_factory.mktemp("fuzz") / "model")
    return json.loads(symbol.read_text()), params, load_params(params)


def _containers(raw: dict) -> list:
    """The JSON objects of a symbol that a mutation may change: the graph, its nodes,
    their attributes."""
    nodes = raw.get("nodes") if isinstance(raw.get("nodes"), list) else []
    found: list = [raw]
    for node in nodes:
        if isinstance(node, dict):
            found.append(node)
            attrs = node.get("attrs")
            if isinstance(attrs, dict):
                found.append(attrs)
    return found


def mutate_symbol(raw: dict, data) -> list[str]:
    """Apply one to three drawn mutations to ``raw`` (in place); describe them."""
    from edgecv.frontend.mxnet.converters import CONVERTERS

    done = []
    for _ in range(data.draw(st.integers(1, 3))):
        nodes = raw.get("nodes") if isinstance(raw.get("nodes"), list) else []
        kind = data.draw(
            st.sampled_from(
                [
                    "delete",
                    "rename",
                    "retype",
                    "index",
                    "cycle",
                    "attr",
                    "op",
                    "duplicate",
                    "drop",
                    "heads",
                ]
            )
        )
        containers = _containers(raw)
        target = data.draw(st.sampled_from(containers))
        keys = sorted(target)
        if kind in ("delete", "rename", "retype") and keys:
            key = data.draw(st.sampled_from(keys))
            if kind == "delete":
                del target[key]
            elif kind == "rename":
                new = data.draw(
                    st.sampled_from(["attr", "param", "input", "Nodes", ""]) | st.text(max_size=6)
                )
                target[new] = target.pop(key)
            else:
                target[key] = data.draw(JSON_VALUES)
            done.append(f"{kind} {key!r}")
        elif kind in ("index", "cycle") and nodes:
            i = data.draw(st.integers(0, len(nodes) - 1))
            node = nodes[i]
            if isinstance(node, dict) and isinstance(node.get("inputs"), list) and node["inputs"]:
                j = data.draw(st.integers(0, len(node["inputs"]) - 1))
                if kind == "index":
                    src = data.draw(st.integers(-3, len(nodes) + 3))
                    out = data.draw(st.integers(-2, 3))
                else:  # itself or a node after it
                    src, out = data.draw(st.integers(i, len(nodes) - 1)), 0
                node["inputs"][j] = [src, out, 0]
                done.append(f"{kind} node {i} input {j} -> [{src}, {out}]")
        elif kind == "attr" and nodes:
            node = data.draw(st.sampled_from(nodes))
            if isinstance(node, dict):
                attrs = node.setdefault("attrs", {})
                if isinstance(attrs, dict):
                    name = data.draw(
                        st.sampled_from(sorted(attrs)) | ATTR_NAMES if attrs else ATTR_NAMES
                    )
                    attrs[name] = data.draw(GARBAGE_ATTRS)
                    done.append(f"attr {name}={attrs[name]!r:.30}")
        elif kind == "op" and nodes:
            node = data.draw(st.sampled_from(nodes))
            if isinstance(node, dict):
                node["op"] = data.draw(st.sampled_from([*sorted(CONVERTERS), "null", "", "Custom"]))
                done.append(f"op -> {node['op']}")
        elif kind == "duplicate" and nodes:
            i, j = data.draw(st.integers(0, len(nodes) - 1)), data.draw(st.integers(0, len(nodes)))
            nodes.insert(j, copy.deepcopy(nodes[i]))
            done.append(f"duplicate node {i} at {j}")
        elif kind == "drop" and nodes:
            i = data.draw(st.integers(0, len(nodes) - 1))
            del nodes[i]
            done.append(f"drop node {i}")
        elif kind == "heads":
            raw["heads"] = data.draw(
                JSON_VALUES | st.lists(st.lists(st.integers(-2, 30), max_size=4), max_size=3)
            )
            done.append(f"heads -> {raw['heads']!r:.40}")
    return done


def symbol_bytes(raw: dict, data) -> bytes:
    """The mutated graph as a file's bytes: usually its JSON, sometimes truncated or
    with bits flipped (then it may not be JSON, or not UTF-8)."""
    text = json.dumps(raw).encode()
    damage = data.draw(st.sampled_from(["none", "none", "none", "truncate", "flip"]))
    if damage == "truncate":
        return text[: data.draw(st.integers(0, len(text)))]
    if damage == "flip":
        flipped = bytearray(text)
        for _ in range(data.draw(st.integers(1, 4))):
            flipped[data.draw(st.integers(0, len(text) - 1))] ^= 1 << data.draw(st.integers(0, 7))
        return bytes(flipped)
    return text


def import_or_refuse(symbol: Path, params: dict, shapes, build_with: Path | None = None) -> str:
    """Import ``symbol`` (a file) with ``params``: a well-formed module, or an
    EdgecvError of one line. With ``build_with`` (the params file; the heavy fuzz), a
    graph that imports is also deployed for the CPU and run: a result of the shapes the
    import inferred, or an EdgecvError of one line."""
    from tvm import relax

    from edgecv.frontend.mxnet.importer import from_mxnet
    from edgecv.frontend.mxnet.mxnet_graph import load_symbol

    try:
        imported = from_mxnet(load_symbol(symbol), params, shapes)
    except EdgecvError as err:
        assert_one_line(err)
        return type(err).__name__
    relax.analysis.well_formed(imported.mod)  # raises on the first violation
    assert len(imported.output_shapes) == len(imported.output_names) >= 1
    if build_with is not None:
        deploy_and_run(symbol, build_with, imported)
    return "imported"


def deploy_and_run(symbol: Path, params: Path, imported) -> None:
    import edgecv
    from edgecv.deploy import deploy
    from edgecv.pipelines import BuildOptions

    quick = BuildOptions(check_on=None, layout="NCHW", tuning=None)
    try:
        package = deploy(
            str(symbol),
            symbol.parent / "pkg",
            "cpu",
            params=str(params),
            input_shape=imported.input_shapes["data"],
            host="native",
            options=quick,
            force=True,
        )
        outputs = edgecv.load(package).run(np.zeros(imported.input_shapes["data"], np.float32))
    except EdgecvError as err:
        assert_one_line(err)
        return
    assert [o.shape for o in outputs] == [tuple(s) for s in imported.output_shapes]


def check_mutated_symbols(tiny, folder: Path, heavy: bool) -> None:
    raw, params_path, params = tiny

    @fuzz_settings("symbol", heavy)
    @given(data=st.data())
    def case(data):
        mutated = copy.deepcopy(raw)
        mutate_symbol(mutated, data)
        path = folder / "mutated-symbol.json"
        path.write_bytes(symbol_bytes(mutated, data))
        import_or_refuse(path, params, {"data": SHAPE}, params_path if heavy else None)

    case()


def test_mutated_symbols_import_or_are_refused_in_one_line(tiny, tmp_path):
    check_mutated_symbols(tiny, tmp_path, heavy=False)


def test_the_unmutated_symbol_imports(tiny, tmp_path):
    """The fuzz's base case: the tiny model itself imports (mutations are what fail)."""
    path = tmp_path / "tiny-symbol.json"
    path.write_text(json.dumps(tiny[0]))
    assert import_or_refuse(path, tiny[2], {"data": SHAPE}) == "imported"


def test_symbols_that_broke_the_importer(tiny, tmp_path):
    """Cases the fuzz found, each now one EdgecvError line naming the node or field (or
    a right import). Before, most escaped as another exception; some were taken
    silently and wrong (a negative output index read the last output, a float node
    index was truncated, a name with a newline made every later message two lines)."""
    raw, _, params = tiny
    conv = next(i for i, n in enumerate(raw["nodes"]) if n["op"] == "Convolution")
    weight = raw["nodes"][conv]["inputs"][1][0]
    node = raw["nodes"][conv]
    cases = [  # (what is changed, the outcome now); before: ...
        (
            "input entry of strings",
            lambda r: r["nodes"][conv].update(inputs=[["0", "x", 0]]),
            "GraphError",
        ),  # ValueError: invalid literal for int()
        (
            "negative output index",
            lambda r: r["nodes"][conv]["inputs"][0].__setitem__(1, -1),
            "GraphError",
        ),  # imported, reading output -1
        (
            "op is a number",
            lambda r: r["nodes"][conv].update(op=3),
            "GraphError",
        ),  # AttributeError: 'int' object has no attribute 'startswith'
        (
            "name with a newline",
            lambda r: r["nodes"][conv].update(name="a\nb"),
            "GraphError",
        ),  # imported
        (
            "attrs is a list",
            lambda r: r["nodes"][conv].update(attrs=["kernel"]),
            "GraphError",
        ),  # ValueError: dictionary update sequence element #0 ...
        (
            "attr value is a list",
            lambda r: r["nodes"][conv]["attrs"].update(kernel=[3, 3]),
            "GraphError",
        ),  # ConversionError, after conversion started
        (
            "attr value is a number",
            lambda r: r["nodes"][conv]["attrs"].update(num_filter=int(node["attrs"]["num_filter"])),
            "imported",
        ),  # imported
        (
            "shape hint not a tuple",
            lambda r: r["nodes"][weight].setdefault("attrs", {}).update(__shape__="5"),
            "imported",
        ),  # TypeError: 'int' object is not iterable
        (
            "heads is a number",
            lambda r: r.update(heads=7),
            "GraphError",
        ),  # TypeError: 'int' object is not iterable
        (
            "head entry of floats",
            lambda r: r.update(heads=[[1.5, 0, 0]]),
            "GraphError",
        ),  # imported, node index 1.5 read as 1
        (
            "nodes is an object",
            lambda r: r.update(nodes={}),
            "GraphError",
        ),  # GraphError, by chance: iterating the object's keys
    ]
    for what, change, expected in cases:
        mutated = copy.deepcopy(raw)
        change(mutated)
        path = tmp_path / "case-symbol.json"
        path.write_text(json.dumps(mutated))
        assert import_or_refuse(path, params, {"data": SHAPE}) == expected, what
    deep = tmp_path / "deep-symbol.json"  # before: RecursionError from the JSON decoder
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert import_or_refuse(deep, params, {"data": SHAPE}) == "GraphError"


def check_damaged_params(tiny, folder: Path, heavy: bool) -> None:
    _, params_path, _ = tiny
    whole = params_path.read_bytes()
    from edgecv.frontend.mxnet.mxnet_graph import load_params

    @fuzz_settings("params", heavy)
    @given(data=st.data())
    def case(data):
        damaged = bytearray(whole)
        if data.draw(st.booleans()):
            damaged = damaged[: data.draw(st.integers(0, len(whole) - 1))]
        else:
            # bits in the headers of the first arrays, where sizes are, or anywhere
            limit = data.draw(st.sampled_from([200, len(whole)]))
            for _ in range(data.draw(st.integers(1, 4))):
                at = data.draw(st.integers(0, min(limit, len(whole)) - 1))
                damaged[at] ^= 1 << data.draw(st.integers(0, 7))
        path = folder / "damaged-0000.params"
        path.write_bytes(bytes(damaged))
        try:
            params = load_params(path)
        except EdgecvError as err:
            assert_one_line(err)
            return
        symbol = folder / "tiny-symbol.json"
        symbol.write_text(json.dumps(tiny[0]))
        import_or_refuse(symbol, params, {"data": SHAPE})  # the symbol fuzz builds graphs

    case()


def test_damaged_params_files_load_or_are_refused_in_one_line(tiny, tmp_path):
    check_damaged_params(tiny, tmp_path, heavy=False)


def test_a_params_file_claiming_more_than_it_holds_is_refused_before_mxnet(tiny, tmp_path):
    """A bit flipped in a dimension made MXNet allocate what the damaged shape claimed
    (up to gigabytes, then "Failed to allocate CPU Memory"); the file's layout is now
    checked first, naming the array."""
    from edgecv.board.errors import ParamsError
    from edgecv.frontend.mxnet.mxnet_graph import load_params

    data = bytearray(tiny[1].read_bytes())
    data[24 + 4 + 4 + 4 + 6] ^= 0x40  # the high bytes of the first array's first dimension
    path = tmp_path / "flipped-0000.params"
    path.write_bytes(bytes(data))
    with pytest.raises(ParamsError, match=r"array #0 of shape \(\d+, .* are left") as err:
        load_params(path)
    assert "Invalid NDArray file format (truncated" in assert_one_line(err.value)


SHAPES = st.one_of(
    st.lists(
        st.one_of(st.integers(-3, 16), st.sampled_from([0, 2**31, 2**40, 2**63])), max_size=7
    ).map(tuple),
    JSON_VALUES,
    st.tuples(st.floats(), st.floats()),
)


def check_input_shapes(tiny, folder: Path, heavy: bool) -> None:
    raw, _, params = tiny
    symbol = folder / "tiny-symbol.json"
    symbol.write_text(json.dumps(raw))

    @fuzz_settings("shapes", heavy)
    @given(shape=SHAPES, name=st.sampled_from(["data", "data", "other"]))
    def case(shape, name):
        import_or_refuse(symbol, params, {name: shape})

    case()


def test_odd_input_shapes_import_or_are_refused_in_one_line(tiny, tmp_path):
    check_input_shapes(tiny, tmp_path, heavy=False)


@pytest.mark.parametrize(
    ("shape", "fragment"),
    [
        ((1, 0, 8, 8), "with a size below 1"),
        ((1, -3, 8, 8), "with a size below 1"),
        ((), "of rank 0"),
        ((1,) * 9, "of rank 9"),
        ((1, 3, 2**20, 2**20), "elements, more than"),
        ((1, 3.0, 8, 8), "not whole numbers"),
        ("1,3,8,8", "not whole numbers"),
    ],
)
def test_input_shapes_the_importer_refuses(tiny, tmp_path, shape, fragment):
    from edgecv.board.errors import ShapeError
    from edgecv.frontend.mxnet.importer import from_mxnet
    from edgecv.frontend.mxnet.mxnet_graph import parse_symbol

    with pytest.raises(ShapeError, match=fragment) as err:
        from_mxnet(parse_symbol(json.dumps(tiny[0])), tiny[2], {"data": shape})
    assert "input `data`" in assert_one_line(err.value)


# -- the package loader --------------------------------------------------------------------

# fmt: off
PACKAGE_FILES = ["manifest.json", "plan.json", "params.npz", "kernels/cpu.so",
                 "kernels/libtvm_runtime.so"]
LIBRARIES = ("kernels/cpu.so", "kernels/libtvm_runtime.so")
MANIFEST_PATHS = [
    (), ("format",), ("format_version",), ("versions",), ("versions", "edgecv"), ("files",),
    ("files", "plan.json"), ("files", "params.npz"), ("files", "kernels/cpu.so"),
    ("files", "kernels/libtvm_runtime.so"), ("build",), ("build", "kernels"),
    ("build", "kernels", "cpu"), ("build", "kernels", "tvm_runtime"),
    ("build", "kernels", "opencl"), ("build", "host"), ("build", "host", "triple"),
    ("build", "host", "features"), ("build", "requires"), ("inputs",), ("inputs", 0),
    ("inputs", 0, "shape"), ("inputs", 0, "dtype"), ("inputs", 0, "name"), ("outputs",),
    ("outputs", 0, "shape"), ("model",), ("model", "task"), ("profile",), ("profile", "gpu"),
    ("profile", "runtime"), ("preprocessing",), ("preprocessing", "mean"), ("classes",),
]
MANIFEST_VALUES = st.sampled_from([
    "kernels/cpu.so", "kernels/libtvm_runtime.so", "params.npz", "plan.json", "manifest.json",
    "../plan.json", "/lib/x86_64-linux-gnu/libc.so.6", "kernels/./cpu.so", "kernels/cpu.so\n",
    1, 2, 3, "2", "0.1.0", "0.0.1", "edgecv-package", "gpu", "opencl", [1, 3, 8, 8],
    [1, 3, 9, 9], "float64", "int8", {"cpu": "kernels/libtvm_runtime.so"},
    {"cpu": "kernels/cpu.so"}, {"cpu": "params.npz"}, {"triple": "aarch64-linux-gnu"},
    {"triple": "x86_64-linux-gnu", "features": ["avx512f", "amx-tile"]}, "0" * 64, [], {},
])
PLAN_VALUES = st.one_of(
    JSON_VALUES, st.integers(-2, 40),
    st.sampled_from(["cpu", "gpu", "temp", "view", "input", "const", "copy", "kernel",
                     "float16", "int8", [1, 3, 8, 8], [2**40], [], [0, 1]]),
)
# fmt: on


def _set(tree, path: tuple, value) -> None:
    *parents, last = path
    for key in parents:
        tree = tree[key]
    tree[last] = value


def _rewrite(root: Path, relative: str, content: bytes) -> None:
    """Replace a file of the case's copy (a hard link to the intact package's file:
    unlinked first, so the intact package keeps its bytes)."""
    path = root / relative
    path.unlink(missing_ok=True)
    path.write_bytes(content)


def _rehash(root: Path, relative: str) -> None:
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["files"][relative] = hashlib.sha256((root / relative).read_bytes()).hexdigest()
    _rewrite(root, "manifest.json", json.dumps(manifest).encode())


def mutate_package(root: Path, data) -> tuple[str, bool, list[str]]:
    """Damage the package copy at ``root`` as drawn. Returns a description, whether the
    checksums were updated to match (the result may then differ from the intact
    package's), and the libraries whose bytes changed."""
    kind = data.draw(
        st.sampled_from(
            [
                "bytes",
                "bytes",
                "bytes",
                "missing",
                "manifest",
                "manifest",
                "manifest",
                "plan",
                "plan",
                "params",
            ]
        )
    )
    return MUTATIONS[kind](root, data)


def _delete_file(root: Path, data) -> tuple[str, bool, list[str]]:
    relative = data.draw(st.sampled_from(PACKAGE_FILES))
    (root / relative).unlink()
    return f"delete {relative}", False, []


def _damage_bytes(root: Path, data) -> tuple[str, bool, list[str]]:
    """A file truncated, emptied, grown, or a few of its bits flipped."""
    relative = data.draw(st.sampled_from(PACKAGE_FILES))
    original = (root / relative).read_bytes()
    content = bytearray(original)
    how = data.draw(st.sampled_from(["truncate", "flip", "flip", "empty", "append"]))
    if how == "truncate":
        content = content[: data.draw(st.integers(0, len(content) - 1))]
    elif how == "flip":
        for _ in range(data.draw(st.integers(1, 4))):
            at = data.draw(st.integers(0, len(content) - 1))
            content[at] ^= 1 << data.draw(st.integers(0, 7))
    elif how == "empty":
        content = bytearray()
    else:
        content += data.draw(st.binary(min_size=1, max_size=64))
    _rewrite(root, relative, bytes(content))
    damaged = relative in LIBRARIES and content != original  # two flips may cancel
    return f"{how} {relative}", False, [relative] if damaged else []


def _edit_manifest(root: Path, data) -> tuple[str, bool, list[str]]:
    """A manifest field set to a drawn value, or deleted; or the whole manifest replaced."""
    manifest = json.loads((root / "manifest.json").read_text())
    path = data.draw(st.sampled_from(MANIFEST_PATHS))
    value = data.draw(MANIFEST_VALUES | JSON_VALUES)
    try:
        if not path:
            manifest = value
        elif data.draw(st.booleans()):
            *parents, last = path
            tree = manifest
            for key in parents:
                tree = tree[key]
            del tree[last]
            value = "(deleted)"
        else:
            _set(manifest, path, value)
    except (KeyError, IndexError, TypeError):
        pass  # the path is not in this manifest
    _rewrite(root, "manifest.json", json.dumps(manifest).encode())
    return f"manifest {'.'.join(map(str, path))} = {value!r:.50}", False, []


def _edit_plan(root: Path, data) -> tuple[str, bool, list[str]]:
    """A field of the plan (of a buffer, a step, or the top) deleted, renamed or set; the
    checksum updated to match."""
    plan = json.loads((root / "plan.json").read_text())
    part = data.draw(st.sampled_from(["buffers", "steps", "top"]))
    if part == "top":
        key = data.draw(st.sampled_from(sorted(plan)))
        target, where = plan, key
    else:
        index = data.draw(st.integers(0, len(plan[part]) - 1))
        target = plan[part][index]
        key = data.draw(st.sampled_from(sorted(target)))
        where = f"{part}[{index}].{key}"
    change = data.draw(st.integers(0, 5))
    if change == 0:
        del target[key]
        value = "(deleted)"
    elif change == 1:
        value = data.draw(st.text(max_size=6))
        target[value] = target.pop(key)
        where, value = f"{where} (renamed)", f"-> {value!r}"
    else:
        value = target[key] = data.draw(PLAN_VALUES)
    _rewrite(root, "plan.json", json.dumps(plan).encode())
    _rehash(root, "plan.json")
    return f"plan {where} = {value!r:.50} (rehashed)", True, []


def _edit_params(root: Path, data) -> tuple[str, bool, list[str]]:
    """A parameter dropped, reshaped or retyped, or one added; the checksum updated."""
    with np.load(root / "params.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    name = data.draw(st.sampled_from(sorted(arrays)))
    how = data.draw(st.sampled_from(["drop", "extra", "reshape", "float64", "int32", "object"]))
    if how == "drop":
        del arrays[name]
    elif how == "extra":
        arrays["extra"] = np.zeros(3, np.float32)
    elif how == "reshape":
        arrays[name] = arrays[name].reshape(-1)[: max(1, arrays[name].size - 1)]
    elif how == "object":
        arrays[name] = np.array([None, 1], dtype=object)
    else:
        arrays[name] = arrays[name].astype(how)
    (root / "params.npz").unlink()
    with open(root / "params.npz", "wb") as f:
        np.savez(f, **arrays)
    _rehash(root, "params.npz")
    return f"params {how} {name} (rehashed)", True, []


MUTATIONS = {
    "missing": _delete_file,
    "bytes": _damage_bytes,
    "manifest": _edit_manifest,
    "plan": _edit_plan,
    "params": _edit_params,
}


def fuzz_loader(package: str, examples: int) -> None:
    """The loader fuzz (run in its own process by the tests below): each case damages a
    copy of ``package``, loads it and, when that succeeds, runs it. One line per case
    on stdout, written before the load, names what a crash happened on."""
    from hypothesis import note

    import edgecv

    x = x_of(3)
    want = edgecv.load(package).run(x)
    work = Path(tempfile.mkdtemp(prefix="edgecv-loader-fuzz-"))
    numbers = itertools.count()
    outcomes: dict[str, int] = {}

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data())
    def case(data):
        root = work / f"case{next(numbers)}"
        shutil.copytree(package, root, copy_function=os.link)
        what, rehashed, libraries = mutate_package(root, data)
        note(what)
        print(f"{root.name}: {what}", flush=True)
        try:
            model = edgecv.load(root)
            outputs = model.run(x)
        except EdgecvError as err:
            assert_one_line(err)
            outcome = type(err).__name__
        else:
            if not rehashed:
                assert all(np.array_equal(o, w) for o, w in zip(outputs, want, strict=True))
            outcome = "ran"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        mapped = Path("/proc/self/maps").read_text()
        for library in libraries:
            assert str(root / library) not in mapped, f"{library} was damaged, yet loaded"
        shutil.rmtree(root)

    try:
        case()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("outcomes:", json.dumps(outcomes, sort_keys=True), flush=True)


def run_loader_fuzz(package: Path, examples: int, timeout: float) -> str:
    """:func:`fuzz_loader` in a fresh process; its output, or a failure naming the case
    that crashed or hung it."""
    tests = Path(__file__).parent
    code = (
        f"import sys; sys.path.insert(0, {str(tests)!r}); import test_fuzz; "
        f"test_fuzz.fuzz_loader({str(package)!r}, {examples})"
    )
    try:
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as err:
        output = err.stdout.decode() if isinstance(err.stdout, bytes) else err.stdout or ""
        pytest.fail(f"the loader fuzz hung after: {output.strip().splitlines()[-1:]}")
    last = result.stdout.strip().splitlines()[-1:]
    assert result.returncode == 0, (
        f"the loader fuzz ended with {result.returncode} (a negative number: killed by that "
        f"signal) after {last}:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    )
    return result.stdout


def test_damaged_packages_load_right_or_are_refused_in_one_line(tmp_path_factory):
    package = quick_package("cpu", tmp_path_factory)
    output = run_loader_fuzz(package, EXAMPLES["loader"][0], timeout=300)
    outcomes = json.loads(output.strip().splitlines()[-1].removeprefix("outcomes:"))
    # the fuzz reached both ends: refusals, and damage that loads and runs right
    assert outcomes.get("PackageError", 0) > 0 and outcomes.get("ran", 0) > 0, outcomes


def test_a_manifest_naming_another_library_never_reaches_the_loader(tmp_path_factory, tmp_path):
    """Found by the fuzz: ``build.kernels.cpu`` naming the package's own TVM runtime
    (listed, its checksum right) had the loader open it as the kernel library: TVM
    registered its functions twice and the process aborted (SIGABRT). Library files are
    now the ones the format names."""
    from edgecv.board.errors import PackageError
    from edgecv.board.model import load

    package = quick_package("cpu", tmp_path_factory)
    for key, value in [
        ("cpu", "kernels/libtvm_runtime.so"),
        ("tvm_runtime", "kernels/cpu.so"),
        ("opencl", "kernels/cpu.so"),
        ("cpu", "/usr/lib/libc.so"),
    ]:
        root = tmp_path / key
        shutil.copytree(package, root, dirs_exist_ok=True)
        manifest = json.loads((root / "manifest.json").read_text())
        manifest["build"]["kernels"][key] = value
        (root / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(PackageError, match=f"build.kernels.{key}") as err:
            load(root)
        assert_one_line(err.value)


# -- the CLI -------------------------------------------------------------------------------


def test_cli_prints_one_error_line_for_a_damaged_package(tmp_path_factory, tmp_path):
    package = quick_package("cpu", tmp_path_factory)
    damaged = tmp_path / "pkg"
    shutil.copytree(package, damaged)
    library = bytearray((damaged / "kernels" / "cpu.so").read_bytes())
    library[len(library) // 2] ^= 0x10
    (damaged / "kernels" / "cpu.so").write_bytes(bytes(library))
    np.save(tmp_path / "x.npy", x_of(0))
    result = run_cli("run", damaged, "--input", tmp_path / "x.npy")
    only_error_line(result, "cpu.so is corrupt (checksum mismatch)")


def test_cli_prints_one_error_line_for_a_mutated_symbol(tiny, tmp_path):
    raw, params, _ = tiny
    mutated = copy.deepcopy(raw)
    conv = next(n for n in mutated["nodes"] if n["op"] == "Convolution")
    conv["inputs"] = [[len(mutated["nodes"]) - 1, 0, 0]]  # a cycle: the graph's last node
    (tmp_path / "m-symbol.json").write_text(json.dumps(mutated))
    result = run_cli(
        "deploy",
        tmp_path / "m-symbol.json",
        "--params",
        params,
        "--input-shape",
        "1,3,8,8",
        "-o",
        tmp_path / "pkg",
    )
    only_error_line(result, "which does not come before it")
    assert not (tmp_path / "pkg").exists()


# -- many more examples ----------------------------------------------------------------------


@pytest.mark.heavy
def test_heavy_importer_fuzz(tiny, tmp_path):
    """The importer properties with many more examples; mutated graphs that import are
    also deployed and run on the CPU (about 15% of them: half an hour on 2 cores)."""
    check_mutated_symbols(tiny, tmp_path, heavy=True)
    check_damaged_params(tiny, tmp_path, heavy=True)
    check_input_shapes(tiny, tmp_path, heavy=True)


@pytest.mark.heavy
def test_heavy_loader_fuzz(tmp_path_factory):
    run_loader_fuzz(quick_package("cpu", tmp_path_factory), EXAMPLES["loader"][1], timeout=3600)
