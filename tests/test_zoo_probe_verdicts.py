"""The zoo sweep reads the divergence probe's verdicts (benchmarks/zoo_probe.py): a
mismatch the probe proved a tie counts as ``parity=tie``, a departing probe names its
stage, and the probe compares a backbone only at its residual blocks' outputs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from zoo_coverage_tables import write_tables  # noqa: E402
from zoo_probe import apply_probe_verdict, probe_stages, verdict_path  # noqa: E402


def _node(op: str, name: str, inputs: list[int]) -> dict:
    return {"op": op, "name": name, "inputs": [[i, 0, 0] for i in inputs]}


def test_probe_stages_keep_block_outputs_and_the_heads(tmp_path):
    nodes = [
        _node("null", "data", []),
        _node("Convolution", "resnet_conv0", [0]),
        _node("BatchNorm", "resnet_bn0", [1]),
        _node("Activation", "resnet_relu0", [2]),  # inside the block
        _node("elemwise_add", "resnet_add0", [3, 0]),
        _node("Activation", "resnet_relu1", [4]),  # the block's output
        _node("Convolution", "rpn_conv0", [5]),
        _node("Activation", "rpn_relu0", [6]),
        _node("_contrib_box_nms", "box_nms0", [7]),
    ]
    symbol = tmp_path / "m-symbol.json"
    symbol.write_text(json.dumps({"nodes": nodes, "heads": [[8, 0, 0]]}))
    assert probe_stages(symbol) == ["resnet_relu1", "rpn_conv0", "rpn_relu0", "box_nms0"]


def _verdict(folder: Path, model: str, verdict: str, first: str | None) -> None:
    path = verdict_path(folder, model, 0, "cpu")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"verdict": verdict, "first_departure": first}))


@pytest.mark.parametrize(
    ("verdict", "first", "parity"), [("tie", None, "tie"), ("departs", "rpn0_box_nms0", "fail")]
)
def test_a_failed_parity_takes_the_probes_verdict(tmp_path, verdict, first, parity):
    _verdict(tmp_path, "m", verdict, first)
    row = {"model": "m", "parity": "fail", "error": "AssertionError: boxes"}
    apply_probe_verdict(row, tmp_path, seed=0, profile="cpu")
    assert row["parity"] == parity
    assert row["probe"].endswith("m-seed0-cpu.json")
    if first:
        assert first in row["error"] and "AssertionError: boxes" in row["error"]


def test_only_a_failed_parity_with_a_verdict_of_its_seed_and_profile_changes(tmp_path):
    _verdict(tmp_path, "m", "tie", None)
    matched = {"model": "m", "parity": "ok"}
    apply_probe_verdict(matched, tmp_path, seed=0, profile="cpu")
    other_seed = {"model": "m", "parity": "fail"}
    apply_probe_verdict(other_seed, tmp_path, seed=1, profile="cpu")
    other_profile = {"model": "m", "parity": "fail"}
    apply_probe_verdict(other_profile, tmp_path, seed=0, profile="deeplens")
    assert matched == {"model": "m", "parity": "ok"}
    assert other_seed["parity"] == other_profile["parity"] == "fail"
    assert "probe" not in other_seed and "probe" not in other_profile


def test_the_table_counts_ties_apart_from_matches(tmp_path):
    rows = [
        {"model": m, "family": "rcnn", "build": "ok", "import": "ok", "compile": "ok", "parity": p}
        for m, p in [("a", "ok"), ("b", "tie"), ("c", "fail")]
    ]
    write_tables(rows, tmp_path / "sweep", import_only=False)
    summary = (tmp_path / "sweep.md").read_text()
    assert "| family | models | build | import | compile | parity | tie |" in summary
    assert "| rcnn | 3 | 3 | 3 | 3 | 1 | 1 |" in summary
