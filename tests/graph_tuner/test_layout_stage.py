"""The graph tuner stage: costs measured once and cached, the three modes, and `auto`
falling back to NCHW instead of failing."""

from __future__ import annotations

import json
import platform
import shutil

import pytest
import tvm
from small_model import SHAPE, export_small_model

from edgecv import schedules
from edgecv.frontend.mxnet.importer import from_mxnet
from edgecv.frontend.mxnet.mxnet_graph import load_params, load_symbol
from edgecv.graph_tuner import choose_layouts, costs, stage
from edgecv.graph_tuner.costs import COSTS_FILE, COSTS_VERSION, CostCache
from edgecv.pipelines import BuildOptions
from edgecv.profiles import load_profile
from edgecv.schedules.fingerprint import rules_fingerprint


@pytest.fixture(scope="module")
def small_mod(tmp_path_factory):
    symbol, params = export_small_model(tmp_path_factory.mktemp("small") / "small")
    return from_mxnet(load_symbol(symbol), load_params(params), {"data": SHAPE}).mod


def _conv_layouts(mod) -> list[str]:
    return [
        str(b.value.attrs.out_layout)
        for block in mod["main"].body.blocks
        for b in block.bindings
        if hasattr(b.value, "op") and getattr(b.value.op, "name", "") == "relax.nn.conv2d"
    ]


def test_auto_measures_once_then_reads_the_cache(small_mod, tmp_path, monkeypatch):
    """Without a budget every kernel is measured in one batch; a second plan reads the
    cache and measures nothing; another thread count measures again (its first batch,
    with a budget that batch spends: none of it from the cache)."""
    from dataclasses import replace

    from edgecv.graph_tuner import measure

    profile = load_profile("cpu")
    said = []
    options = BuildOptions(layout="auto", tuning=None, layout_costs=tmp_path, layout_budget_s=None)
    _, first = choose_layouts(small_mod, profile, options, said.append)
    assert set(first["costs"]) == {"measured"}, first["costs"]
    assert len([m for m in said if "graph tuner: measuring" in m]) == 1, said
    assert first["chosen"] == "plan", first
    assert first["solver"] == "dp" and first["costs"].get("measured", 0) > 0
    assert "model_mismatch" not in first
    assert first["predicted_s"] > 0
    saved = json.loads((tmp_path / COSTS_FILE).read_text())
    assert saved["tvm"] == tvm.__version__ and len(saved["devices"]) == 1
    assert saved["version"] == COSTS_VERSION
    # b, the one packable stride-1 3x3 conv, was timed by every algorithm in the packing
    (b,) = [c for c in first["convolutions"] if "algorithms" in c]
    (packing,) = first["packings"]
    assert set(b["algorithms"][packing]) == {"direct", "winograd2", "winograd4"}, b
    assert all(t > 0 for t in b["algorithms"][packing].values())
    winograd = stage.winograd_plan(first)
    assert len(winograd) <= 1 and all(side in (2, 4) for side in winograd.values())
    converted, second = choose_layouts(small_mod, profile, options)
    assert set(second["costs"]) == {"cache"}, second["costs"]  # measures nothing
    assert [{**c, "sources": None} for c in second["convolutions"]] == [
        {**c, "sources": None} for c in first["convolutions"]
    ]
    assert {s for c in second["convolutions"] for s in c["sources"].values()} == {"cache"}
    assert stage.winograd_plan(second) == winograd
    assert len(_conv_layouts(converted)) == 5
    # another thread count's times are not this one's: measured again, kept beside
    (key,) = saved["devices"]
    threads = int(key.rsplit("=", 1)[1])
    monkeypatch.setenv("TVM_NUM_THREADS", str(threads + 1))
    monkeypatch.setattr(measure, "FIRST_BATCH", 6)  # the small model has 13 kernels
    _, third = choose_layouts(small_mod, profile, replace(options, layout_budget_s=1e-3))
    assert "cache" not in third["costs"] and third["costs"]["measured"] > 0, third["costs"]
    saved = json.loads((tmp_path / COSTS_FILE).read_text())
    device_class = costs.costs_folder_name(key)
    assert set(saved["devices"]) == {
        costs.cpu_costs_key(device_class, threads),
        costs.cpu_costs_key(device_class, threads + 1),
    }


def test_costs_measured_under_other_rules_are_not_read_and_get_replaced(tmp_path):
    first = CostCache([tmp_path], tmp_path, "dev", rules="rules-a")
    first.put("kernel:1", 1.0)
    first.save()
    assert CostCache([tmp_path], None, "dev", rules="rules-a").get("kernel:1") == 1.0
    assert CostCache([tmp_path], None, "dev", rules="rules-b").get("kernel:1") is None
    later = CostCache([tmp_path], tmp_path, "dev", rules="rules-b")
    later.put("kernel:2", 2.0)
    later.save()
    saved = json.loads((tmp_path / COSTS_FILE).read_text())
    assert saved["devices"]["dev"] == {"kernel:2": 2.0}  # the old rules' times are gone
    assert saved["rules"]["dev"] == "rules-b"


def test_the_rules_fingerprint_changes_with_the_rules_source(tmp_path):
    copy = tmp_path / "schedules"
    shutil.copytree(schedules.__path__[0], copy)
    cpu, gpu = rules_fingerprint(gpu=False, schedules=copy), rules_fingerprint(True, copy)
    assert cpu != gpu and cpu == rules_fingerprint(gpu=False)
    rule = copy / "gpu" / "conv2d_packed.py"
    rule.write_text(rule.read_text().replace("PIXELS = 8", "PIXELS = 4"))
    assert rules_fingerprint(gpu=True, schedules=copy) != gpu
    assert rules_fingerprint(gpu=False, schedules=copy) == cpu  # a GPU edit keeps CPU costs


def test_kernels_are_timed_in_groups_whose_arguments_fit_the_budget():
    from tvm import te

    from edgecv.graph_tuner.measure import argument_bytes, memory_groups

    def kernel(n):  # an n-float input and output: 8n bytes
        x = te.placeholder((n,), name="x")
        return te.create_prim_func([x, te.compute((n,), lambda i: x[i] + 1, name="y")])

    kernels = {"a": kernel(100), "b": kernel(100), "c": kernel(1000), "d": kernel(10)}
    assert argument_bytes(kernels["a"]) == 800
    assert memory_groups(kernels, budget=2000) == [["a", "b"], ["c"], ["d"]]
    assert memory_groups(kernels, budget=100_000) == [["a", "b", "c", "d"]]
    assert memory_groups(kernels, budget=0) == [["a"], ["b"], ["c"], ["d"]]


def test_auto_with_every_kernel_timed_alone_still_plans(small_mod, tmp_path, monkeypatch):
    """A model whose candidates' arguments do not fit the memory together (Mask R-CNN's
    mask head) is timed a group at a time: with a budget of nothing, one kernel each;
    and kernels long enough (here all of them) are called once a round."""
    from edgecv.graph_tuner import measure

    monkeypatch.setattr(measure, "MEMORY_SHARE", 0.0)
    monkeypatch.setattr(measure, "LONG_CALL_S", 0.0)
    options = BuildOptions(layout="auto", tuning=None, layout_costs=tmp_path)
    _, facts = choose_layouts(small_mod, load_profile("cpu"), options)
    assert facts["chosen"] == "plan" and facts["costs"].get("measured", 0) > 0, facts
    for conv in facts["convolutions"]:
        assert all(s is not None and s > 0 for s in conv["seconds"].values()), conv


def test_nchw_leaves_the_module_alone(small_mod):
    mod, facts = choose_layouts(small_mod, load_profile("cpu"), BuildOptions(layout="NCHW"))
    assert mod.same_as(small_mod) and facts["chosen"] == "NCHW"


def test_packed_packs_every_conv_that_can(small_mod):
    mod, facts = choose_layouts(small_mod, load_profile("cpu"), BuildOptions(layout="packed"))
    packing = facts["packings"][0]
    # d has 4 output channels: plain in any packing of 8 or more lanes
    assert _conv_layouts(mod) == [packing] * 4 + ["NCHW"], _conv_layouts(mod)


def test_auto_falls_back_to_nchw_with_a_warning(small_mod, monkeypatch, tmp_path):
    def broken(*args, **kwargs):
        raise RuntimeError("measuring failed")

    monkeypatch.setattr(stage, "_tune", broken)
    options = BuildOptions(layout="auto", layout_costs=tmp_path)
    with pytest.warns(UserWarning, match="graph tuner: RuntimeError: measuring failed"):
        mod, facts = choose_layouts(small_mod, load_profile("cpu"), options)
    assert mod.same_as(small_mod)
    assert facts["chosen"] == "NCHW" and "measuring failed" in facts["reason"]


def test_unknown_mode_is_refused(small_mod):
    from edgecv.board.errors import EdgecvError

    with pytest.raises(EdgecvError, match="--layout must be one of auto, NCHW, packed"):
        choose_layouts(small_mod, load_profile("cpu"), BuildOptions(layout="NHWC"))


@pytest.mark.skipif(platform.machine() != "x86_64", reason="an x86-64 machine deploying for ARM")
def test_auto_for_another_cpu_architecture_builds_nchw_and_says_why(small_mod, tmp_path):
    """An aarch64 CPU profile deployed from this x86-64 machine: its kernels cannot be
    timed here, so no costs are made up and the convolutions stay NCHW."""
    arm = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a72"}
    path = tmp_path / "arm.json"
    path.write_text(
        json.dumps({"name": "arm", "runtime": "cpu", "target": arm, "host": arm, "gpu_ops": []})
    )
    options = BuildOptions(layout="auto", layout_costs=tmp_path / "costs")
    mod, facts = choose_layouts(small_mod, load_profile(str(path)), options)
    assert mod.same_as(small_mod)
    assert facts["chosen"] == "NCHW"
    assert "aarch64 kernels cannot be timed on this x86_64 machine" in facts["reason"]
    assert not (tmp_path / "costs").exists()


def test_a_convolutions_candidates_come_from_one_source():
    """Database times only for a convolution whose every candidate has a record (and
    for a kernel two convolutions share, only if both are complete): a database time
    beside a measured one compares two different timers."""
    from edgecv.graph_tuner.measure import _from_database

    class Database:
        def best_seconds(self, func, target):
            return {"a1": 1.0, "a2": 2.0, "b1": 1.0, "c1": 1.0}.get(func)

    class Meter:
        database, target = Database(), None

    wanted = {"ka1": "a1", "ka2": "a2", "kb1": "b1", "kb2": "b2", "kc1": "c1"}
    convs = [
        ("a", "NCHW", "direct", "ka1"),
        ("a", "NCHW8c", "direct", "ka2"),
        ("b", "NCHW", "direct", "kb1"),
        ("b", "NCHW8c", "direct", "kb2"),
        ("c", "NCHW", "direct", "kc1"),
    ]
    assert _from_database(wanted, convs, Meter()) == {"ka1": 1.0, "ka2": 2.0, "kc1": 1.0}
    shared = [*convs, ("d", "NCHW", "direct", "ka1"), ("d", "NCHW8c", "direct", "kb2")]
    assert _from_database(wanted, shared, Meter()) == {"kc1": 1.0}  # a then d: both leave


def test_a_spent_budget_predicts_the_rest_and_a_later_deploy_measures_it(
    small_mod, tmp_path, monkeypatch
):
    """With a budget spent by the first batch, the kernels left are predicted from the
    ones measured (finite times, never cached, shown as predicted); the next deploy
    measures what the first left, until nothing is predicted."""
    from edgecv.graph_tuner import measure

    monkeypatch.setattr(measure, "FIRST_BATCH", 6)  # the small model has 13 kernels
    profile = load_profile("cpu")
    options = BuildOptions(layout="auto", tuning=None, layout_costs=tmp_path, layout_budget_s=1e-3)
    _, first = choose_layouts(small_mod, profile, options)
    sources = first["costs"]
    assert sources.get("predicted", 0) > 0 and sources["measured"] > 0, sources
    cached = json.loads((tmp_path / COSTS_FILE).read_text())["devices"]
    (entries,) = cached.values()
    assert len(entries) == sources["measured"]  # predicted costs are not cached
    shown = [s for c in first["convolutions"] for s in c["sources"].values()]
    assert "predicted" in shown and set(shown) <= {"measured", "predicted"}, shown
    for conv in first["convolutions"]:
        assert all(0 < t < 1 for t in conv["seconds"].values()), conv
    assert first["chosen"] == "plan" and 0 < first["predicted_s"] < 1
    rounds = [first["costs"]]
    while "predicted" in rounds[-1] and len(rounds) < 10:
        rounds.append(choose_layouts(small_mod, profile, options)[1]["costs"])
    assert "predicted" not in rounds[-1], rounds
    assert all(r.get("measured", 0) > 0 for r in rounds), rounds
