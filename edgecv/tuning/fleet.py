"""A device fleet on TVM's RPC tracker: ``edgecv rpc-server`` on each device,
``edgecv tune --rpc HOST:PORT --key KEY`` fanning candidates out to them.

A server is a plain TVM RPC server (``tvm.rpc``) registered with the tracker under a
device key, with edgecv's timing functions registered as global functions in it, so a
board whose TVM has no OpenCL runtime still times candidates through pyopencl:

- ``edgecv.tuning.time_llvm(library bytes, arguments JSON, config JSON) -> JSON``
  (every run's seconds)
- ``edgecv.tuning.time_opencl(device query, source, candidates JSON, config JSON) -> JSON``
  (each candidate's fastest run and every run's seconds)

The tuning side (:class:`FleetRunner`) builds as usual and, for each batch, opens a
session on every free server of the key and hands out work from one queue: one
candidate (LLVM) or one share of the batch's program (OpenCL) at a time. A server
that fails mid-call (killed, disconnected) has its piece handed to another server;
nothing measured is lost, and the batch's records are stored as usual when it ends.

Trust, as TVM's own RPC has it: a server runs the native code it is sent (``time_llvm``
writes the library's bytes to a file and loads it), so a peer that reaches its port runs
code on the device; it listens on 127.0.0.1 unless ``--host`` says otherwise, and says
so in one line when it does (boards are reached through an SSH tunnel or a VPN). The
tuner in turn trusts no server's numbers: every answer is held to what memory traffic
and repeated runs allow (:mod:`.plausibility`) before it can become a record.
"""

from __future__ import annotations

import ipaddress
import json
import queue
import sys
import tempfile
import threading
from pathlib import Path

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import PyRunner, RunnerInput

from ..board import progress
from ..board.arguments import port
from ..board.errors import EdgecvError
from .plausibility import implausible
from .runners.llvm import TimingConfig, args_json, llvm_samples
from .runners.results import done, failed

SESSION_WAIT_S = 30.0  # longest wait for a server the tracker lists as free
IMPLAUSIBLE = "implausible timing from an RPC server: "  # a failed measurement's reason


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise EdgecvError(f"expected HOST:PORT for the RPC tracker, got {text!r}")
    return host, int(port)


def register_functions() -> None:
    """Register edgecv's timing functions in this process (the server's)."""
    import tvm

    def llvm(library: bytes, arguments: str, config: str) -> str:
        with tempfile.TemporaryDirectory(prefix="edgecv-rpc-") as tmp:
            path = Path(tmp) / "kernel.so"
            path.write_bytes(bytes(library))
            seconds = llvm_samples(str(path), arguments, config)
        print(f"[edgecv] rpc-server: timed 1 candidate: {min(seconds) * 1e3:.3f} ms", flush=True)
        return json.dumps(seconds)

    def opencl(device_query: str, source: str, candidates: str, config: str) -> str:
        from .runners.opencl import time_opencl

        answer = time_opencl(device_query, source, candidates, config)
        count = len(json.loads(candidates))
        print(f"[edgecv] rpc-server: timed {count} OpenCL candidates", flush=True)
        return answer

    tvm.register_global_func("edgecv.tuning.time_llvm", llvm, override=True)
    tvm.register_global_func("edgecv.tuning.time_opencl", opencl, override=True)


def warn_if_reachable(host: str, port: int) -> None:
    """Print one line on stderr when ``host`` is not a loopback address: what a peer that
    reaches the server can do, and how boards should be reached instead."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: only localhost is known to stay on this machine
        loopback = host == "localhost"
    if not loopback:
        print(
            f"[edgecv] warning: rpc-server listens on {host} from port {port}: any peer "
            "that reaches it can run native code on this machine and send timings to "
            "the tuner; reach boards through an SSH tunnel or a VPN "
            "(docs/tuning.md#a-device-fleet)",
            file=sys.stderr,
            flush=True,
        )


def serve(tracker: str, key: str, host: str = "127.0.0.1", port: int = 9190) -> None:
    """Run an RPC server registered with ``tracker`` under ``key`` until interrupted."""
    from tvm.rpc.server import PopenRPCServerState

    warn_if_reachable(host, port)
    register_functions()
    # The server state runs its listening loop in a thread of this process; each session
    # is served in a child forked from it, which holds the functions registered above.
    state = PopenRPCServerState(
        host, port, port + 100, tracker_addr=_address(tracker), key=key, silent=True
    )
    print(
        f"[edgecv] rpc-server: serving key {key} on {host}:{state.port}, tracker {tracker}",
        flush=True,
    )
    state.thread.join()


@derived_object
class FleetRunner(PyRunner):
    """Times candidates on every free RPC server of ``key`` (see the module docstring).

    Parameters
    ----------
    tracker : str
        ``HOST:PORT`` of the RPC tracker.
    key : str
        The device key the servers registered with.
    kind : str
        ``llvm`` or ``opencl``.
    device_query : str
        The OpenCL device on the servers (part of its name; empty: the first).
    """

    def __init__(
        self,
        tracker: str,
        key: str,
        kind: str,
        device_query: str = "",
        target=None,
        config: TimingConfig | None = None,
    ):
        super().__init__()
        self.tracker, self.key, self.kind = _address(tracker), key, kind
        self.device_query = device_query
        self.target = target
        self.config = config or TimingConfig()

    def run(self, runner_inputs: list[RunnerInput]):
        if self.kind == "llvm":
            jobs = [
                (
                    "edgecv.tuning.time_llvm",
                    (
                        Path(i.artifact_path).read_bytes(),
                        args_json(i.args_info),
                        self.config.to_json(),
                    ),
                )
                for i in runner_inputs
            ]
            answers = self.dispatch(jobs)
            seconds = [
                str(a) if isinstance(a, Exception) else _plausible(a, json.loads(args[1]))
                for a, (_, args) in zip(answers, jobs, strict=True)
            ]
            self._say_implausible(seconds)
            return [failed(t) if isinstance(t, str) else done(t) for t in seconds]
        from .runners.opencl import OpenCLCompiler, run_batches

        return run_batches(runner_inputs, OpenCLCompiler(self.target), self._opencl_batch)

    def _opencl_batch(self, source: str, candidates: str) -> str:
        items = json.loads(candidates)
        shares = max(1, min(len(items), self.free_servers()))
        pieces = [items[i::shares] for i in range(shares)]
        answers = self.dispatch(
            [
                (
                    "edgecv.tuning.time_opencl",
                    (self.device_query, source, json.dumps(p), self.config.to_json()),
                )
                for p in pieces
            ]
        )
        times: list = [None] * len(items)
        rejected: list[str] = []
        for index, (piece, answer) in enumerate(zip(pieces, answers, strict=True)):
            parsed = _opencl_answer(answer, len(piece))
            if "failed_kernels" in parsed:
                rejected += parsed["failed_kernels"]
                if not parsed["failed_kernels"]:  # the compiler crashed: halves next
                    return json.dumps(parsed)
                continue
            for j, (t, runs) in enumerate(zip(parsed["times"], parsed["samples"], strict=True)):
                if isinstance(t, list):  # a time counts only through the runs behind it
                    t = _plausible(runs, json.loads(piece[j]["args"]))
                times[index + j * shares] = t
        self._say_implausible(times)
        if rejected:
            return json.dumps({"failed_kernels": sorted(set(rejected))})
        return json.dumps({"times": times})

    def _say_implausible(self, seconds: list) -> None:
        """One line for the timings of a batch that :func:`_plausible` turned down."""
        down = [t for t in seconds if isinstance(t, str) and t.startswith(IMPLAUSIBLE)]
        if down:
            progress.say(
                f"{len(down)} of {len(seconds)} timings from the RPC servers of "
                f"{self.key} count as failed measurements: {down[0]}"
            )

    def free_servers(self) -> int:
        from tvm import rpc

        summary = rpc.connect_tracker(*self.tracker).summary()
        return int(summary.get("queue_info", {}).get(self.key, {}).get("free", 0))

    def dispatch(self, jobs: list[tuple[str, tuple]]) -> list:
        """Run ``jobs`` (global function name, arguments) on the free servers; returns
        each job's answer or the exception that ended it on every server."""
        from tvm import rpc

        servers = max(1, self.free_servers())
        todo: queue.Queue = queue.Queue()
        for index, job in enumerate(jobs):
            todo.put((index, job))
        answers: list = [None] * len(jobs)
        left = [len(jobs)]
        lock = threading.Lock()

        def worker() -> None:
            try:  # a tracker connection of its own: the client is not thread-safe
                tracker = rpc.connect_tracker(*self.tracker)
                session = tracker.request(
                    self.key, priority=1, session_timeout=0, max_retry=int(SESSION_WAIT_S)
                )
            except Exception:  # no server after all: the others take the work
                return
            while True:  # until every job is answered: a failing server puts its job back
                with lock:
                    if left[0] == 0:
                        return
                try:
                    index, (name, args) = todo.get(timeout=0.2)
                except queue.Empty:  # the rest are running on other servers
                    continue
                try:
                    answers[index] = session.get_function(name)(*args)
                except Exception as err:  # this server is gone: the job goes back
                    todo.put((index, (name, args)))
                    print(
                        f"[edgecv] an RPC server of {self.key} failed ({str(err)[:120]}); "
                        "its work goes to the others",
                        file=sys.stderr,
                    )
                    return
                with lock:
                    left[0] -= 1

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(servers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        while not todo.empty():  # every server failed: the rest are failed trials
            index, _ = todo.get_nowait()
            answers[index] = EdgecvError(f"no RPC server of key {self.key} could run it")
        return [str(a) if isinstance(a, str) else a for a in answers]


def _plausible(runs, arguments: list) -> list[float] | str:
    """The seconds to record from a server's ``runs`` (every run of one candidate; JSON
    text or parsed) of a kernel with ``arguments``, or why none (:mod:`.plausibility`)."""
    if isinstance(runs, str):
        try:
            runs = json.loads(runs)
        except ValueError:
            pass  # the check names what came instead
    reason = implausible([] if runs is None else runs, arguments)
    return IMPLAUSIBLE + reason if reason else [min(runs)]


def _opencl_answer(answer, count: int) -> dict:
    """A server's answer for ``count`` candidates as :func:`.runners.opencl.time_opencl`
    writes it (``samples`` empty from an older server); an exception, or anything else a
    server sends, fails each candidate with the reason."""
    try:
        parsed = json.loads(answer) if isinstance(answer, str) else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        kernels = parsed.get("failed_kernels")
        if isinstance(kernels, list) and all(isinstance(k, str) for k in kernels):
            return parsed
        times, runs = parsed.get("times"), parsed.get("samples") or [None] * count
        lists = isinstance(times, list) and isinstance(runs, list)
        if lists and len(times) == len(runs) == count:
            return {
                "times": [t if isinstance(t, list) else str(t)[:300] for t in times],
                "samples": runs,
            }
    why = f"an RPC server's answer is not time_opencl's ({str(answer)[:80]!r})"
    if isinstance(answer, Exception):
        why = str(answer)
    return {"times": [why] * count, "samples": [None] * count}


def add_server_parser(sub, common) -> None:
    s = sub.add_parser(
        "rpc-server", parents=[common], help="serve this device to `edgecv tune --rpc`"
    )
    s.add_argument("--tracker", required=True, metavar="HOST:PORT", help="the RPC tracker")
    s.add_argument("--key", required=True, help="device key (the same for one device class)")
    s.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: reach the board through an SSH "
        "tunnel or a VPN; a peer that reaches the port runs code on this machine)",
    )
    s.add_argument("--port", type=port, default=9190, help="first port to try")
    s.set_defaults(func=lambda args: serve(args.tracker, args.key, args.host, args.port) or 0)
