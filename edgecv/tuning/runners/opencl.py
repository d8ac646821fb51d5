"""The OpenCL runner: candidates lowered and launched exactly as deploy does, timed by
OpenCL event profiling through pyopencl (TVM's wheel has no OpenCL runtime).

Building: each candidate is lowered in a forked child by deploy's
:func:`~edgecv.codegen.gpu_lowering.lower_kernel` (device functions + recorded
launches); then the whole batch's device functions become ONE program
(:func:`~edgecv.codegen.opencl.generate_opencl`), because a program build costs 2-4 s
on Intel's runtime whatever its size: one build per batch instead of one per candidate.

Running: the program is built on the device by edgecv's OpenCL backend
(:class:`~edgecv.board.runtime.opencl.OpenCLBackend`), each candidate's launches are bound
and replayed as a package's are, and the device time of its launches is summed from
profiling events. Kernels the device's compiler rejects are named by its log; their
candidates fail and the rest of the batch is built again without them.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import tvm
from tvm import tirx
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import PyRunner, RunnerInput

from ...board.plan import launches_from_json, launches_to_json
from ...codegen.gpu_lowering import device_module, lower_kernel
from ...codegen.opencl import generate_opencl
from ..builder import Compiler
from .llvm import TimingConfig, args_json
from .results import done, failed


class OpenCLCompiler(Compiler):
    """Lowers a candidate as deploy does; one OpenCL program per batch (module docstring)."""

    def __init__(self, target: tvm.target.Target):
        self.target = target

    def compile_one(self, name: str, func: tirx.PrimFunc, folder: Path) -> dict:
        func = func.with_attr("global_symbol", name)  # an entry function, as in deploy
        with self.target:
            bound = tirx.transform.BindTarget(self.target)(tvm.IRModule({name: func}))[name]
            device, launches = lower_kernel(name, bound)
        (folder / "device.json").write_text(tvm.ir.save_json(device))
        (folder / "launches.json").write_text(launches_to_json({name: launches}))
        return {"artifact": str(folder / "candidate.json")}

    def finish(self, built: list[tuple[Path, dict]]) -> dict[Path, str]:
        errors: dict[Path, str] = {}
        program = built[0][0].parent / "program.cl"
        while True:
            folders = [f for f, _ in built if f not in errors]
            if not folders:
                return errors
            try:
                source = self.source_of(folders)
                break
            except Exception:  # one candidate's codegen fails: find it alone
                for folder in folders:
                    try:
                        self.source_of([folder])
                    except Exception as err:
                        errors[folder] = f"OpenCL codegen: {str(err).strip()[-200:]}"
        program.write_text(source)
        for folder in folders:
            (folder / "candidate.json").write_text(json.dumps({"program": str(program)}))
        return errors

    def source_of(self, folders: list[Path]) -> str:
        device = device_module([str(f / "device.json") for f in folders])
        return generate_opencl(device, self.target, [], None)[0]


def _candidate(item: RunnerInput) -> dict:
    folder = Path(item.artifact_path).parent
    return {
        "folder": str(folder),
        "launches": (folder / "launches.json").read_text(),
        "args": args_json(item.args_info),
    }


def time_opencl(device_query: str, source: str, candidates: str, config: str) -> str:
    """Build ``source`` once on the device matching ``device_query`` and time each
    candidate (``candidates``: JSON list of {"launches", "args"}); returns JSON
    ``{"times": [[seconds] or error, ...], "samples": [[every run's seconds] or None,
    ...]}`` or ``{"failed_kernels": [...]}`` when the compiler rejects kernels. Runs
    here or on an RPC server (:mod:`..fleet`), whose tuner checks the samples
    (:mod:`..plausibility`)."""
    from ...board.runtime.opencl import OpenCLBackend
    from ...board.runtime.opencl_program import ProgramBuildError

    cfg = TimingConfig(**json.loads(config))
    items = json.loads(candidates)
    launches = {}
    for item in items:
        launches.update(launches_from_json(item["launches"]))
    try:
        with _private_program_cache():
            backend = OpenCLBackend(device_query, source, launches)
    except ProgramBuildError as err:
        return json.dumps(
            {"failed_kernels": err.kernels, "crashed": err.crashed, "error": str(err)[:600]}
        )
    rng = np.random.default_rng(0)
    tensors: dict[str, list] = {}
    times: list = []
    samples: list = []
    for item in items:
        try:
            if item["args"] not in tensors:  # one set of buffers per workload
                tensors[item["args"]] = _buffers(backend, json.loads(item["args"]), rng)
            (name,) = launches_from_json(item["launches"])
            run = backend.bind(name, tensors[item["args"]])
            runs = _time(backend, run, cfg)
            times.append([min(runs)])
            samples.append(runs)
        except Exception as err:  # a candidate that fails at run time
            times.append(f"{type(err).__name__}: {str(err).strip()[-200:]}")
            samples.append(None)
    return json.dumps({"times": times, "samples": samples})


def _buffers(backend, arguments: list, rng) -> list:
    out = []
    for dtype, shape in arguments:
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        tensor = backend.view(backend.alloc(nbytes), tuple(shape), dtype)
        backend.upload(tensor, rng.uniform(-1, 1, size=shape).astype(dtype))
        out.append(tensor)
    return out


def _time(backend, run, cfg: TimingConfig) -> list[float]:
    """Device seconds of each run (its launches summed): ``cfg.repeat`` runs, or as many
    as fit in half a second once two have run (a very slow candidate stops early)."""
    for _ in range(cfg.warmup):
        run()
    backend.synchronize()
    spent: list[float] = []
    while len(spent) < cfg.repeat and (len(spent) < 2 or sum(spent) < 0.5):
        backend.start_profiling()
        run()
        spent.append(sum(seconds for _, _, seconds in backend.stop_profiling()))
    return [float(s) for s in spent]


class _private_program_cache:
    """Batch programs are built once and never again: keep them out of the user's
    program cache (``EDGECV_CACHE_DIR``)."""

    def __enter__(self):
        self.old = os.environ.get("EDGECV_CACHE_DIR")
        self.tmp = tempfile.TemporaryDirectory(prefix="edgecv-tune-cl-")
        os.environ["EDGECV_CACHE_DIR"] = self.tmp.name

    def __exit__(self, *exc):
        if self.old is None:
            os.environ.pop("EDGECV_CACHE_DIR", None)
        else:
            os.environ["EDGECV_CACHE_DIR"] = self.old
        self.tmp.cleanup()


def device_query(device) -> str:
    """A query that names ``device`` for :class:`~edgecv.board.runtime.opencl.OpenCLBackend`."""
    return f"{device.platform.name.strip()} / {device.name.strip()}"


@derived_object
class LocalOpenCLRunner(PyRunner):
    """Times a batch's candidates on a local OpenCL device, one program per batch."""

    def __init__(self, device, target: tvm.target.Target, config: TimingConfig | None = None):
        super().__init__()
        self.query = device_query(device)
        self.compiler = OpenCLCompiler(target)
        self.config = config or TimingConfig()

    def run(self, runner_inputs: list[RunnerInput]):
        return run_batches(
            runner_inputs,
            self.compiler,
            lambda source, cands: time_opencl(self.query, source, cands, self.config.to_json()),
        )


def run_batches(runner_inputs: list[RunnerInput], compiler: OpenCLCompiler, time_batch):
    """Group candidates by their program, time each group with ``time_batch(source,
    candidates JSON) -> JSON`` (local or remote). A program whose compiler rejects
    kernels is built again without their candidates; one whose compiler crashes (or
    hangs) is split in halves until the candidates it crashes on stand alone. Returns
    finished futures in input order."""
    results: list = [None] * len(runner_inputs)
    groups: dict[str, list[int]] = {}
    for i, item in enumerate(runner_inputs):
        program = json.loads(Path(item.artifact_path).read_text())["program"]
        groups.setdefault(program, []).append(i)
    cands = [_candidate(item) for item in runner_inputs]  # each read once, retries reuse
    folder = [Path(c["folder"]) for c in cands]
    work = [(members, Path(program).read_text()) for program, members in groups.items()]
    while work:
        members, source = work.pop()
        if source is None:
            source = compiler.source_of([folder[i] for i in members])
        answer = json.loads(time_batch(source, json.dumps([cands[i] for i in members])))
        if "times" in answer:
            for i, t in zip(members, answer["times"], strict=True):
                results[i] = done(t) if isinstance(t, list) else failed(t)
            continue
        if answer.get("crashed") and len(members) > 1:
            half = len(members) // 2
            work += [(members[:half], None), (members[half:], None)]
            continue
        bad = set(answer.get("failed_kernels") or [])
        rejected = [
            i for i in members if not bad or any(k.startswith(folder[i].name + "_") for k in bad)
        ]
        for i in rejected:
            results[i] = failed(f"OpenCL compiler: {answer.get('error', '')[:600]}")
        rest = [i for i in members if i not in rejected]
        if rest:
            work.append((rest, None))
    return results
