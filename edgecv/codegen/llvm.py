"""CPU code: each kernel compiled by TVM's LLVM target to an object file, all of them
linked into one shared library the CPU backend loads.

Kernels are compiled separately (:mod:`.contained`: a time limit each, on every core)
and linked at the end; TVM's generated objects share only weak symbols, so they link
into one library.
"""

from __future__ import annotations

from pathlib import Path

import tvm
from tvm import tirx

from ..schedules.orders import cpu_order
from ..schedules.stage import schedule_in_process
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
    """Schedule (by edgecv's CPU rules, unless ``schedule`` is False) and compile kernels
    into one in-memory module, in this process (tests, benchmarks)."""
    if schedule:
        kernels = schedule_in_process(kernels, cpu_order(target))
    return tvm.tirx.build(kernels, target=target)
