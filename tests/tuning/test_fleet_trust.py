"""What the fleet trusts: `edgecv rpc-server` listens on loopback unless told otherwise and
says what a peer can do when it does not; the tuner holds every timing a server sends
to what memory traffic and repeated runs allow, so a rogue server's numbers become
failed measurements, never records, while an honest server's pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_fleet import free_port, start, stop, wait_for
from tuning_kernels import matmul_task, target_of
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.runner import RunnerInput

from edgecv.cli import build_parser

# A server registered under the fleet's key that answers every candidate in a picosecond,
# with fifteen runs that agree: the numbers a rogue (or broken) server would send; asked
# to time one OpenCL candidate alone, it answers with what is not JSON at all.
ROGUE_SERVER = """
import json, sys
import tvm
from tvm.rpc.server import PopenRPCServerState

def fake(library, arguments, config):
    return json.dumps([1e-12] * 15)

def fake_opencl(device, source, candidates, config):
    count = len(json.loads(candidates))
    if count == 1:
        return "not JSON"
    return json.dumps({"times": [[1e-12]] * count, "samples": [[1e-12] * 15] * count})

tvm.register_global_func("edgecv.tuning.time_llvm", fake, override=True)
tvm.register_global_func("edgecv.tuning.time_opencl", fake_opencl, override=True)
tracker, key, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
state = PopenRPCServerState(
    "127.0.0.1", port, port + 100, tracker_addr=("127.0.0.1", int(tracker)), key=key,
    silent=True,
)
print("rogue server up", flush=True)
state.thread.join()
"""


def test_rpc_server_listens_on_loopback_unless_host_says_otherwise():
    parse = build_parser().parse_args
    assert parse(["rpc-server", "--tracker", "h:9190", "--key", "k"]).host == "127.0.0.1"
    args = parse(["rpc-server", "--tracker", "h:9190", "--key", "k", "--host", "10.0.0.7"])
    assert args.host == "10.0.0.7"


@pytest.mark.parametrize("port", ["0", "70000", "http"])
def test_a_port_out_of_range_is_one_usage_error(port, capsys):
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(["rpc-server", "--tracker", "h:1", "--key", "k", "--port", port])
    assert stopped.value.code == 2
    assert f"expected a TCP port from 1 to 65535, got '{port}'" in capsys.readouterr().err


def test_listening_beyond_loopback_prints_one_warning_line(capsys):
    from edgecv.tuning.fleet import serve, warn_if_reachable

    for host in ("127.0.0.1", "::1", "localhost"):
        warn_if_reachable(host, 9190)
    assert capsys.readouterr().err == ""
    # the warning comes before the server listens: a port no socket takes stops it there
    with pytest.raises(OverflowError):
        serve("127.0.0.1:1", "k", "0.0.0.0", 70000)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert "native code" in lines[0] and "timings" in lines[0], lines[0]
    assert "SSH tunnel" in lines[0] and "VPN" in lines[0], lines[0]


ARGS = [["float32", [1, 64, 56, 56]], ["float32", [64, 64, 3, 3]], ["float32", [1, 64, 56, 56]]]


def test_a_timing_faster_than_its_memory_traffic_is_rejected():
    from edgecv.tuning.plausibility import implausible

    # 802,816 output bytes take 0.8 us at 1 TB/s: 1 ns cannot be real
    reason = implausible([1e-9] * 15, ARGS)
    assert reason and "output bytes" in reason, reason
    assert implausible([2e-3] * 15, ARGS) is None


def test_runs_that_disagree_or_cannot_be_compared_are_rejected():
    from edgecv.tuning.plausibility import implausible

    # the fastest run alone, 5x below every other: not repeated, not trusted
    assert "disagree" in implausible([1e-3] + [5e-3] * 14, ARGS)
    # slower runs from a busy board are expected: only the fastest two must agree
    assert implausible([1e-3, 1.1e-3] + [40e-3] * 13, ARGS) is None
    assert "at least 2" in implausible([1e-3], ARGS)
    for bad in ("fast", [1e-3, float("nan")], [1e-3, -1.0], [True, True], None):
        assert implausible(bad, ARGS), bad


def test_a_real_kernel_timed_here_is_plausible(tmp_path):
    from edgecv.tuning.plausibility import implausible
    from edgecv.tuning.runners.llvm import LLVMCompiler, TimingConfig, args_json, llvm_samples

    task = matmul_task(64)
    built = LLVMCompiler(target_of("llvm")).compile_one("matmul", task.mod["main"], tmp_path)
    arguments = args_json(ms.arg_info.ArgInfo.from_prim_func(task.mod["main"]))
    samples = llvm_samples(built["artifact"], arguments, TimingConfig().to_json())
    assert len(samples) == TimingConfig().repeat
    assert implausible(samples, json.loads(arguments)) is None, samples


@pytest.fixture
def tracker(tmp_path):
    from test_fleet import _tracker_up

    port = free_port()
    process = start(
        ["-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1"]
        + ["--port", str(port), "--port-end", str(port + 1)],
        tmp_path / "tracker.log",
    )
    try:
        wait_for(lambda: _tracker_up(port), 60, "the tracker")
        yield port
    finally:
        stop(process)


def test_the_tuner_takes_an_honest_servers_timing_and_fails_a_rogue_ones(tmp_path, tracker):
    from tvm import rpc

    from edgecv.tuning.fleet import FleetRunner
    from edgecv.tuning.runners.llvm import LLVMCompiler, args_json

    script = tmp_path / "rogue.py"
    script.write_text(ROGUE_SERVER)
    honest_log, rogue_log = tmp_path / "honest.log", tmp_path / "rogue.log"
    servers = [
        start(
            ["-m", "edgecv.cli", "rpc-server", "--tracker", f"127.0.0.1:{tracker}"]
            + ["--key", "honest", "--port", str(free_port())],
            honest_log,
        ),
        start([str(script), str(tracker), "rogue", str(free_port())], rogue_log),
    ]
    try:
        task = matmul_task(64)
        built = LLVMCompiler(target_of("llvm")).compile_one("mm", task.mod["main"], tmp_path)
        item = RunnerInput(
            built["artifact"], "llvm", ms.arg_info.ArgInfo.from_prim_func(task.mod["main"])
        )

        def registered() -> bool:
            queues = rpc.connect_tracker("127.0.0.1", tracker).summary()["queue_info"]
            return all(queues.get(k, {}).get("free") == 1 for k in ("honest", "rogue"))

        wait_for(registered, 120, "both servers")
        rogue = FleetRunner(f"127.0.0.1:{tracker}", "rogue", "llvm").run([item])[0].result()
        assert rogue.run_secs is None and "implausible" in rogue.error_msg, rogue.error_msg
        assert "output bytes" in rogue.error_msg, rogue.error_msg
        # OpenCL shares: the server's times of a batch's candidates, then its garbage
        opencl = FleetRunner(f"127.0.0.1:{tracker}", "rogue", "opencl")
        candidate = {"args": args_json(item.args_info)}
        times = json.loads(opencl._opencl_batch("", json.dumps([candidate] * 3)))["times"]
        assert all(t.startswith("implausible") and "output bytes" in t for t in times), times
        (alone,) = json.loads(opencl._opencl_batch("", json.dumps([candidate])))["times"]
        assert "not time_opencl's ('not JSON')" in alone, alone
        honest = FleetRunner(f"127.0.0.1:{tracker}", "honest", "llvm").run([item])[0].result()
        assert honest.error_msg is None, honest.error_msg
        assert len(honest.run_secs) == 1 and float(honest.run_secs[0]) > 1e-7
        assert "warning" not in Path(honest_log).read_text()  # loopback: nothing to warn of
    finally:
        for process in servers:
            stop(process)
