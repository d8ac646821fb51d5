"""The host a package's CPU code is built for: its triple, its linker, its TVM runtime.

A profile's ``host`` names the board's CPU (``aarch64-linux-gnu``, ``cortex-a72``); the
workstation deploying is usually another machine (x86-64). Kernels are compiled for the
board by TVM's LLVM (every LLVM target is in the wheel); linking them needs a linker for
the board's ISA and C library, which the host's ``cc`` is not. edgecv links foreign
hosts with Zig's ``zig cc`` from the ``ziglang`` wheel: a pip-installable clang + lld
that carries the glibc stubs of every version for every Linux ISA, so the compiler
side's own ``pip install`` brings it (no apt, no sysroot), and the library is linked
against the oldest glibc of the boards we serve (:data:`GLIBC`), so it loads on their
distributions. A host of this machine's ISA links with the system's ``cc``, as before.

The package also carries TVM's runtime library for its host (the thread pool and
workspace functions kernels call back into; :mod:`edgecv.board.runtime.cpu`), and its
``extra`` library when a kernel calls one of TVM's library functions (the CPU
``box_nms`` sorts with ``tvm.contrib.sort``): this machine's copies when the ISAs
agree, else those inside the ``apache-tvm`` wheel of the board's platform (same
version), fetched from PyPI once and cached.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import tvm

from ..board.errors import EdgecvError
from ..board.runtime.cpu import TVM_RUNTIME_LIBRARIES as RUNTIME_LIBRARIES
from ..board.runtime.host import CHECKED_FEATURES, arch_of, this_arch
from ..board.runtime.kernel_cache import cache_dir

# JetPack 4 (Jetson Nano) is Ubuntu 18.04: glibc 2.27, the oldest of the profiles' boards.
GLIBC = "2.27"
# PyPI platform tags of TVM's wheels, per ISA (for the runtime library of a foreign host).
WHEEL_PLATFORMS = {"aarch64": ["manylinux_2_28_aarch64", "manylinux_2_27_aarch64"]}
ZIG_INSTALL = "pip install 'edgecv[compiler]' (it brings the ziglang toolchain)"


@dataclass(frozen=True)
class Host:
    """The CPU a package's kernel library runs on."""

    triple: str
    cpu: str
    features: tuple[str, ...]  # the checked CPU features its code may use (LLVM names)

    @property
    def arch(self) -> str:
        return arch_of(self.triple)

    @property
    def is_native_isa(self) -> bool:
        return self.arch == this_arch()

    def to_json(self) -> dict:
        return {"triple": self.triple, "cpu": self.cpu, "features": list(self.features)}


def host_of(target: tvm.target.Target) -> Host:
    """The host record of an LLVM target (the features its code may use, as recorded in
    the manifest and checked by :func:`edgecv.board.runtime.host.check_host`)."""
    triple = str(target.attrs.get("mtriple", ""))
    if not triple:  # this machine; LLVM's own name for it may carry its build's vendor
        triple = f"{arch_of(tvm.target.codegen.llvm_get_system_triple())}-linux-gnu"
    arch = arch_of(triple)
    enabled = {str(f) for f in tvm.target.codegen.llvm_get_cpu_features(target)}
    checked = sorted(enabled & set(CHECKED_FEATURES.get(arch, {})))
    return Host(triple, str(target.attrs.get("mcpu", "") or "generic"), tuple(checked))


def link_command(host: Host, objects: list[str], output: Path) -> list[str] | None:
    """The command linking ``objects`` into a shared library for ``host``; None means
    the system's ``cc`` (through TVM's helper), for a host of this machine's ISA."""
    if host.is_native_isa:
        return None
    zig = _zig()
    target = f"{host.arch}-linux-gnu.{GLIBC}"
    return [*zig, "cc", "-target", target, "-shared", "-o", str(output), *objects, "-lm"]


def check_cross_linker(host: Host) -> None:
    """Refuse, with the install step, a build whose CPU code for ``host`` will need the
    cross linker where it is missing: callers ask before compiling, not at the link."""
    if not host.is_native_isa:
        _zig()


def _zig() -> list[str]:
    if importlib.util.find_spec("ziglang") is None:
        raise EdgecvError(
            "linking CPU kernels for another CPU architecture needs a cross linker, and the "
            f"ziglang toolchain is not installed: {ZIG_INSTALL}, or pass --host native to "
            "build the CPU part for this machine"
        )
    return [sys.executable, "-m", "ziglang"]


def link(host: Host, objects: list[str], output: Path) -> None:
    """Link kernel objects into the shared library ``output`` for ``host``."""
    from tvm.support import cc

    command = link_command(host, objects, output)
    try:
        if command is None:
            cc.create_shared(str(output), objects)
        else:
            done = subprocess.run(command, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                raise RuntimeError(done.stderr.strip() or f"exit status {done.returncode}")
    except EdgecvError:
        raise
    except Exception as err:
        raise EdgecvError(
            f"cannot link the CPU kernels for {host.triple}: {str(err).strip()[-300:]}. "
            + (
                "Install a C compiler (cc)"
                if command is None
                else f"Check the ziglang toolchain ({ZIG_INSTALL})"
            )
            + ", or pass --host native to run the package on this machine"
        ) from None


def tvm_runtime_for(host: Host, progress=lambda message: None) -> dict[str, Path]:
    """TVM's runtime libraries for ``host`` by file name (:data:`RUNTIME_LIBRARIES`):
    this machine's, or those of the TVM wheel for its ISA, fetched once."""
    if host.is_native_isa:
        folder = Path(tvm.__file__).parent / "lib"
        if not all((folder / name).is_file() for name in RUNTIME_LIBRARIES):
            raise EdgecvError(f"the TVM wheel here lacks {RUNTIME_LIBRARIES} in {folder}")
        return {name: folder / name for name in RUNTIME_LIBRARIES}
    platforms = WHEEL_PLATFORMS.get(host.arch)
    if platforms is None:
        raise EdgecvError(
            f"edgecv has no TVM runtime for {host.arch} hosts (known: "
            f"{', '.join(sorted(WHEEL_PLATFORMS))}); pass --host native"
        )
    folder = cache_dir().parent / "tvm-runtime" / f"{tvm.__version__}-{host.arch}"
    libraries = {name: folder / name for name in RUNTIME_LIBRARIES}
    if all(path.is_file() for path in libraries.values()):
        return libraries
    progress(
        f"fetching TVM's runtime libraries for {host.arch} (the apache-tvm {tvm.__version__} "
        "wheel for that platform, about 95 MB from PyPI, once)"
    )
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        command = [
            *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", tmp),
            *("--only-binary=:all:", "--python-version", "3.11"),
            *(f"--platform={p}" for p in platforms),
            f"apache-tvm=={tvm.__version__}",
        ]
        done = subprocess.run(command, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("apache_tvm-*.whl"))
        if done.returncode != 0 or not wheels:
            raise EdgecvError(
                f"cannot fetch TVM's runtime libraries for {host.arch}: `pip download "
                f"apache-tvm=={tvm.__version__}` for {platforms[0]} failed "
                f"({(done.stderr or done.stdout).strip()[-300:]}). Where PyPI is not "
                f"reachable, put that wheel's tvm/lib/{{{','.join(RUNTIME_LIBRARIES)}}} "
                f"in {folder}"
            )
        with zipfile.ZipFile(wheels[0]) as wheel:
            for name, path in libraries.items():
                partial = Path(tmp) / name
                partial.write_bytes(wheel.read(f"tvm/lib/{name}"))
                os.replace(partial, path)
    return libraries


def calls_tvm_library(objects: list[str]) -> bool:
    """Whether compiled kernels call functions of TVM's ``extra`` runtime library (its
    ``tvm.contrib`` sorts): their names are strings in the objects."""
    return any(b"tvm.contrib." in Path(o).read_bytes() for o in objects)
