"""Device profiles: one JSON file per device in ``device_profiles/``.

A profile names the runtime backend (cpu, opencl, cuda), the TVM target of the
device and of its host CPU, the device's limits, and which ops run on the GPU.
Profiles are data: adding a device means adding a file, not code.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tvm

from .board.errors import ProfileError, foreign_message
from .board.plan import PIECE_ALIGNMENT

# Backends this build of edgecv can deploy for.
AVAILABLE_RUNTIMES = ("cpu", "opencl", "cuda")


def profiles_dir() -> Path:
    """Where profiles are read from: ``$EDGECV_PROFILES`` or the ones shipped with edgecv
    (``device_profiles/``, with the shipped tuning databases in its ``tuning/`` folder):
    ``edgecv/device_profiles/`` in an installed wheel (setup.py maps the repository's
    folder there), else ``device_profiles/`` at the top of the checkout edgecv is
    imported from (an editable install)."""
    env = os.environ.get("EDGECV_PROFILES")
    if env:
        return Path(env)
    # A real folder, not a resources Traversable: `edgecv tune --ship` writes into it.
    package = Path(__file__).resolve().parent
    installed = package / "device_profiles"
    return installed if installed.is_dir() else package.parent / "device_profiles"


@dataclass(frozen=True)
class Profile:
    """One device profile (see the module docstring)."""

    name: str
    description: str
    runtime: str
    target: dict[str, Any]
    host: dict[str, Any]
    raw: dict[str, Any]

    def tvm_target(self) -> tvm.target.Target:
        """The TVM target of the device, with the host CPU attached.

        ``"mcpu": "native"`` means the CPU of the machine that deploys (the ``cpu``
        profile): LLVM then uses its vector width (AVX-512 here) instead of baseline x86-64.
        """
        return tvm.target.Target(_resolve_native(self.target), host=_resolve_native(self.host))

    def host_target(self) -> tvm.target.Target:
        """The TVM target of the host CPU alone (for CPU fallback kernels)."""
        return tvm.target.Target(_resolve_native(self.host))

    def with_native_host(self) -> Profile:
        """This profile with its host CPU replaced by the deploying machine's."""
        host = {"kind": "llvm", "mcpu": "native"}
        return Profile(
            self.name, self.description, self.runtime, self.target, host, {**self.raw, "host": host}
        )

    @property
    def intel_subgroup_size(self) -> int | None:
        """The OpenCL device's subgroup size when it has Intel subgroups (the operators'
        subgroup variants are built for it), else None."""
        gpu = self.raw.get("gpu", {})
        if self.runtime != "opencl" or gpu.get("intel_subgroups") is not True:
            return None
        size = gpu.get("subgroup_size")
        if not isinstance(size, int) or size < 2 or size & (size - 1):
            raise ValueError(
                f"profile {self.name}: gpu.subgroup_size must be a power of two >= 2 when "
                f"intel_subgroups is true, found {size!r}"
            )
        return size

    @property
    def fp16(self) -> bool | str:
        """Whether the profile's real device computes in float16 (``gpu.fp16``): True,
        False, or ``"auto"`` (``local``: the device found decides); False without a GPU."""
        value = self.raw.get("gpu", {}).get("fp16", False) if self.runtime != "cpu" else False
        if value not in (True, False, "auto"):
            raise ValueError(
                f'profile {self.name}: gpu.fp16 must be true, false or "auto", found {value!r}'
            )
        return value

    @property
    def default_opencl_device(self) -> str:
        """The OpenCL device a build checks its program on and kernels are timed on when
        none is named (part of its name): Intel's runtime for a device with Intel
        subgroups, else "" (the first real device)."""
        return "intel" if self.raw.get("gpu", {}).get("intel_subgroups") is True else ""

    @property
    def piece_alignments(self) -> dict[str, int]:
        """Bytes at which an input of a concatenation may start inside its output on each
        device of the plan (:func:`~edgecv.lowering.memory_plan.plan_memory`): on an
        OpenCL device its base address alignment, ``gpu.mem_base_addr_align_bits`` (a
        sub-buffer must start there), else 4096 bits, the largest seen (NVIDIA's)."""
        bits = self.raw.get("gpu", {}).get("mem_base_addr_align_bits", 4096)
        if not isinstance(bits, int) or bits < 512 or bits & (bits - 1):
            raise ValueError(
                f"profile {self.name}: gpu.mem_base_addr_align_bits must be a power of two "
                f">= 512 (OpenCL's CL_DEVICE_MEM_BASE_ADDR_ALIGN), found {bits!r}"
            )
        return {**PIECE_ALIGNMENT, "gpu": bits // 8}

    @property
    def tuning_class(self) -> str | None:
        """The device class whose tuning database the profile reads when it names one
        (``"tuning_class"``: a folder of ``device_profiles/tuning``); None when the
        class comes from this machine (no field, or ``"this-machine"``)."""
        named = self.raw.get("tuning_class")
        if named is None or named == "this-machine":
            return None
        if not isinstance(named, str) or not named:
            raise ValueError(
                f"profile {self.name}: tuning_class must be a tuning folder's name or "
                f'"this-machine", found {named!r}'
            )
        return named

    @property
    def gpu_ops(self) -> str | tuple[str, ...]:
        """The operators the profile's GPU takes: ``"all"`` or their names (``gpu_ops``);
        the others run on the host CPU."""
        ops = self.raw.get("gpu_ops", "all")
        if ops == "all":
            return ops
        if not isinstance(ops, list) or not all(isinstance(o, str) for o in ops):
            raise ValueError(
                f'profile {self.name}: gpu_ops must be "all" or a list of operator names, '
                f"found {ops!r}"
            )
        return tuple(ops)

    @property
    def available(self) -> bool:
        return self.runtime in AVAILABLE_RUNTIMES


def _resolve_native(spec: dict[str, Any]) -> dict[str, Any]:
    if spec.get("mcpu") != "native":
        return spec
    cpu = tvm.target.codegen.llvm_get_system_cpu()
    missing = _missing_vector_features(cpu)
    if not missing:
        return {**spec, "mcpu": cpu}
    return {**spec, "mcpu": cpu, "mattr": [*spec.get("mattr", []), *(f"-{f}" for f in missing)]}


# LLVM feature families that a virtual machine may hide from a CPU it otherwise names
# truly (cloud VMs often mask AVX-512 on AMD and Intel parts alike).
_VECTOR_FEATURES = ("avx", "amx", "fma", "f16c", "gfni", "vaes", "vpclmulqdq", "xop")


def _missing_vector_features(cpu: str, cpuinfo: str = "/proc/cpuinfo") -> list[str]:
    """Vector features LLVM assumes for ``cpu`` that this machine's kernel does not
    report (``/proc/cpuinfo`` flags): LLVM names the CPU by its family and model, so on a
    VM that masks AVX-512 it would emit instructions that fault (SIGILL)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return []
    flags_line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    flags = {f.replace("_", "") for f in flags_line.partition(":")[2].split()}
    if not flags:
        return []
    target = tvm.target.Target({"kind": "llvm", "mcpu": cpu})
    features = tvm.target.codegen.llvm_get_cpu_features(target)
    return sorted(
        str(f)
        for f in features
        if str(f).startswith(_VECTOR_FEATURES) and str(f).replace("-", "") not in flags
    )


def list_profiles() -> list[Profile]:
    """Every profile in :func:`profiles_dir`, sorted by name."""
    folder = profiles_dir()
    if not folder.is_dir():
        raise ProfileError(f"device profile folder {folder} does not exist; set EDGECV_PROFILES")
    return [load_profile(p) for p in sorted(folder.glob("*.json"))]


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a profile by name (``deeplens``) or path to its JSON file."""
    path = Path(name_or_path)
    if path.suffix != ".json":
        path = profiles_dir() / f"{name_or_path}.json"
    if not path.is_file():
        known = sorted(p.stem for p in profiles_dir().glob("*.json"))
        raise ProfileError(f"unknown device profile `{name_or_path}`; known profiles: {known}")
    try:
        raw = json.loads(path.read_text())
        profile = Profile(
            name=raw["name"],
            description=raw.get("description", ""),
            runtime=raw["runtime"],
            target=raw["target"],
            host=raw.get("host", {"kind": "llvm"}),
            raw=raw,
        )
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ProfileError(f"device profile {path} is malformed: {err!r}") from None
    check_profile(profile)
    return profile


def check_profile(profile: Profile) -> None:
    """A profile whose target TVM rejects is the profile's fault: say so when it is
    loaded, before anything compiles or tunes for it."""
    try:
        profile.tvm_target()
        profile.host_target()
        profile.intel_subgroup_size  # noqa: B018  (validates gpu.subgroup_size)
        profile.piece_alignments  # noqa: B018  (validates gpu.mem_base_addr_align_bits)
        profile.fp16  # noqa: B018  (validates gpu.fp16)
        profile.tuning_class  # noqa: B018
        profile.gpu_ops  # noqa: B018
    except Exception as err:  # TVM raises ValueError/TVMError on bad target fields
        raise ProfileError(
            f"device profile `{profile.name}` is malformed: {foreign_message(err)}; fix its "
            "target/host/gpu fields (see device_profiles/*.json)"
        ) from None
