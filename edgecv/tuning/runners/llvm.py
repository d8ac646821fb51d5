"""The LLVM runner: candidates compiled to shared libraries, timed on this CPU by TVM's
``time_evaluator`` (the same code a deployed ``cpu`` package runs)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm
from tvm import tirx
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import PyRunner, RunnerInput

from ..builder import Compiler
from .results import done, failed

ENTRY = "kernel"  # the one function of a candidate's library


@dataclass(frozen=True)
class TimingConfig:
    """How long each candidate is timed: ``repeat`` measurements, each averaging as many
    calls as fill ``min_repeat_ms`` (0: one call each); the fastest is reported. On a
    shared machine other processes only ever add time, and a parallel kernel waits for
    its slowest thread, so an average over many calls on busy cores can be many times
    the kernel's time; single calls, the fastest of many, come closest
    (benchmarks/results/tuning_search-2026-11-23-2core.md)."""

    repeat: int = 15
    min_repeat_ms: int = 0
    warmup: int = 2

    def to_json(self) -> str:
        return json.dumps(self.__dict__)


class LLVMCompiler(Compiler):
    """Builds a candidate into ``kernel.so`` (exported with TVM's ``export_library``)."""

    def __init__(self, target: tvm.target.Target):
        self.target = target

    def compile_one(self, name: str, func: tirx.PrimFunc, folder: Path) -> dict:
        mod = tvm.IRModule({ENTRY: func.with_attr("global_symbol", ENTRY)})
        library = tvm.tirx.build(mod, target=self.target)
        path = folder / "kernel.so"
        library.export_library(str(path))
        return {"artifact": str(path)}


def args_json(args_info) -> str:
    """Argument shapes/dtypes of a candidate as JSON (what travels to an RPC server)."""
    return json.dumps([[str(a.dtype), [int(d) for d in a.shape]] for a in args_info])


def time_llvm(library_path: str, arguments: str, config: str) -> list[float]:
    """Seconds of one call (the fastest measurement) of the candidate in
    ``library_path`` (``arguments``: :func:`args_json`; ``config``:
    :meth:`TimingConfig.to_json`), on random inputs."""
    return [min(llvm_samples(library_path, arguments, config))]


def llvm_samples(library_path: str, arguments: str, config: str) -> list[float]:
    """Every measurement :func:`time_llvm` takes the fastest of, in seconds: what an RPC
    server (:mod:`edgecv.tuning.fleet`) sends, for the tuner to check
    (:mod:`edgecv.tuning.plausibility`)."""
    cfg = TimingConfig(**json.loads(config))
    library = tvm.runtime.load_module(library_path)
    rng = np.random.default_rng(0)
    dev = tvm.cpu()
    tensors = [
        tvm.runtime.tensor(rng.uniform(-1, 1, size=shape).astype(dtype), dev)
        for dtype, shape in json.loads(arguments)
    ]
    timer = library.time_evaluator(
        ENTRY, dev, number=1, repeat=cfg.repeat, min_repeat_ms=int(cfg.min_repeat_ms)
    )
    for _ in range(cfg.warmup):
        library[ENTRY](*tensors)
    return [float(seconds) for seconds in timer(*tensors).results]


@derived_object
class LocalLLVMRunner(PyRunner):
    """Times each candidate in this process, one after the other (never two at once:
    they would share the cores they are timed on)."""

    def __init__(self, config: TimingConfig | None = None):
        super().__init__()
        self.config = config or TimingConfig()

    def run(self, runner_inputs: list[RunnerInput]):
        futures = []
        for item in runner_inputs:
            try:
                seconds = time_llvm(
                    item.artifact_path, args_json(item.args_info), self.config.to_json()
                )
                futures.append(done(seconds))
            except Exception as err:  # a candidate that faults is a failed trial
                futures.append(failed(err))
        return futures
