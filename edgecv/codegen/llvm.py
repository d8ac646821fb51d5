"""CPU code: each kernel compiled by TVM's LLVM target to an object file, all of them
linked into one shared library the CPU backend loads.

Kernels are compiled separately (:mod:`.contained`: a time limit each, on every core)
and linked at the end; TVM's generated objects share only weak symbols, so they link
into one library.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import tvm
from tvm import tirx

from ..schedules.orders import cpu_order
from .contained import compile_in_process
from .host import Host, host_of, link


def compile_object(target: tvm.target.Target):
    """A :data:`~.contained.CompileOne` that compiles a kernel for ``target`` into
    ``<work_dir>/<name>.o``."""

    def compile_one(name: str, func: tirx.PrimFunc, work_dir: Path) -> dict:
        module = tvm.tirx.build(
            tvm.IRModule({name: func.with_attr("global_symbol", name)}), target=target
        )
        path = work_dir / f"{name}.o"
        module.write_to_file(str(path))
        return {"object": str(path)}

    return compile_one


def link_objects(objects: list[str], output: Path, host: Host | None = None) -> None:
    """Link kernel objects into the shared library ``output`` for ``host`` (this
    machine by default); see :mod:`.host` for the linker of another ISA."""
    link(host or host_of(tvm.target.Target({"kind": "llvm"})), objects, output)


def build_cpu(
    kernels: tvm.IRModule, target: tvm.target.Target, schedule: bool = True
) -> tvm.runtime.Module:
    """The deploy's CPU code stage in this process (tests, benchmarks): every kernel
    scheduled by edgecv's CPU rules and compiled by :func:`compile_object`, candidate by
    candidate (:func:`~.contained.compile_in_process`; the deploy runs it contained),
    linked into one library and loaded. ``schedule=False`` compiles the kernels as they
    are, unscheduled (a benchmark's baseline)."""
    functions = {gv.name_hint: f for gv, f in kernels.functions.items()}
    if not schedule or not functions:
        return tvm.tirx.build(kernels, target=target)
    with tempfile.TemporaryDirectory(prefix="edgecv-build-cpu-") as work:
        compiled = compile_in_process(
            functions, cpu_order(target), compile_object(target), Path(work)
        )
        failed = {
            name: done.choice.passed_over for name, done in compiled.items() if not done.facts
        }
        if failed:
            raise RuntimeError(f"kernels no candidate compiled: {failed}")
        library = Path(work) / "kernels.so"
        link_objects(
            sorted(done.facts["object"] for done in compiled.values()), library, host_of(target)
        )
        return tvm.runtime.load_module(str(library))
