"""Can this machine execute a package's CPU code? Its instruction set and CPU features.

A package's ``kernels/cpu.so`` is machine code for one host: the manifest records its
target triple and the CPU features LLVM was allowed to use (``build.host``). Loading it
on another ISA fails in the dynamic loader with an opaque message, and loading it on a
CPU without one of those features (a ``cpu`` package built on an AVX-512 workstation,
run on an AVX2 box) dies with SIGILL in the middle of an inference. :func:`check_host`
refuses both up front, with one sentence naming what the package needs.

Only the features that change the instructions of generated kernels are checked: the
vector and bit-manipulation extensions (LLVM's names, as the compiler records them).
x86-64 reads them from ``/proc/cpuinfo``; aarch64 from the kernel's hardware
capability words (``getauxval``), which qemu-user also fills for the CPU it emulates.
"""

from __future__ import annotations

import ctypes
import platform
from pathlib import Path

from ..errors import PackageError

# LLVM feature -> the flag /proc/cpuinfo shows for it on x86-64.
X86_FEATURES = {
    "sse3": "pni",
    "ssse3": "ssse3",
    "sse4.1": "sse4_1",
    "sse4.2": "sse4_2",
    "popcnt": "popcnt",
    "movbe": "movbe",
    "lzcnt": "abm",
    "bmi": "bmi1",
    "bmi2": "bmi2",
    "avx": "avx",
    "avx2": "avx2",
    "fma": "fma",
    "f16c": "f16c",
    "avxvnni": "avx_vnni",
    "avx512f": "avx512f",
    "avx512cd": "avx512cd",
    "avx512bw": "avx512bw",
    "avx512dq": "avx512dq",
    "avx512vl": "avx512vl",
    "avx512vnni": "avx512_vnni",
    "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16",
    "avx512ifma": "avx512ifma",
    "avx512vbmi": "avx512vbmi",
    "avx512vbmi2": "avx512_vbmi2",
    "avx512bitalg": "avx512_bitalg",
    "avx512vpopcntdq": "avx512_vpopcntdq",
    "gfni": "gfni",
    "vaes": "vaes",
    "vpclmulqdq": "vpclmulqdq",
    "amx-tile": "amx_tile",
    "amx-int8": "amx_int8",
    "amx-bf16": "amx_bf16",
}

# LLVM feature -> (AT_HWCAP or AT_HWCAP2, bit) of the Linux arm64 ABI (asm/hwcap.h).
AT_HWCAP, AT_HWCAP2 = 16, 26
AARCH64_FEATURES = {
    "fp-armv8": (AT_HWCAP, 0),
    "neon": (AT_HWCAP, 1),
    "fullfp16": (AT_HWCAP, 10),
    "rdm": (AT_HWCAP, 12),
    "dotprod": (AT_HWCAP, 20),
    "sve": (AT_HWCAP, 22),
    "sve2": (AT_HWCAP2, 1),
    "i8mm": (AT_HWCAP2, 13),
    "bf16": (AT_HWCAP2, 14),
}

CHECKED_FEATURES = {"x86_64": X86_FEATURES, "aarch64": AARCH64_FEATURES}
_ARCH_NAMES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


def arch_of(triple_or_machine: str) -> str:
    """``aarch64`` of ``aarch64-linux-gnu``, ``x86_64`` of ``x86_64-pc-linux-gnu`` or of
    ``platform.machine()``'s ``AMD64``; other architectures by their own name."""
    name = triple_or_machine.split("-", 1)[0].lower()
    return _ARCH_NAMES.get(name, name)


def this_arch() -> str:
    """The instruction set this Python runs on (qemu-user reports the emulated one)."""
    return arch_of(platform.machine())


def this_cpu_features(arch: str, cpuinfo: str = "/proc/cpuinfo") -> set[str] | None:
    """The checked features (LLVM names) this machine's CPU has, or None when it cannot
    be told (an architecture edgecv does not check, an unreadable source)."""
    if arch == "x86_64":
        try:
            text = Path(cpuinfo).read_text()
        except OSError:
            return None
        line = next((ln for ln in text.splitlines() if ln.startswith("flags")), None)
        if line is None:
            return None
        flags = set(line.partition(":")[2].split())
        return {llvm for llvm, flag in X86_FEATURES.items() if flag in flags}
    if arch == "aarch64":
        try:
            getauxval = ctypes.CDLL(None).getauxval
        except (OSError, AttributeError):
            return None
        getauxval.restype, getauxval.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
        words = {AT_HWCAP: getauxval(AT_HWCAP), AT_HWCAP2: getauxval(AT_HWCAP2)}
        return {llvm for llvm, (word, bit) in AARCH64_FEATURES.items() if words[word] >> bit & 1}
    return None


def check_host(host: dict | None, package: Path | str) -> None:
    """Refuse, with one sentence, a package whose CPU code this machine cannot execute.

    ``host`` is the manifest's ``build.host`` (``triple``, ``cpu``, ``features``);
    packages written before it was recorded are not checked.
    """
    if not host:
        return
    needs, here = arch_of(host["triple"]), this_arch()
    cpu = host.get("cpu") or "its CPU"
    if needs != here:
        raise PackageError(
            f"{package} holds CPU code for {needs} ({host['triple']}, {cpu}) and this machine "
            f"is {here}: run it on such a board, or redeploy with --host native to run it here"
        )
    have = this_cpu_features(here)
    if have is None:
        return
    missing = sorted(set(host.get("features", [])) - have)
    if missing:
        raise PackageError(
            f"{package} holds CPU code built for {cpu} that uses {', '.join(missing)}, which "
            f"this machine's CPU lacks (it would stop with SIGILL): redeploy the model on "
            "this machine, or for a profile whose host CPU it has"
        )
