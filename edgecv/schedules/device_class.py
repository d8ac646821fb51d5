"""Device classes: which tuning database belongs to which device.

A tuned schedule is only as good as the device it was timed on, so databases are kept
per *device class*: the TVM target that shapes the kernels (kind, device, CPU and its
vector ISA, subgroup width) plus, for GPUs, the OpenCL or CUDA device and driver that
ran them. The class is a small JSON dict (recorded in each database's
``edgecv_database.json``) and a readable folder name derived from it, e.g.
``llvm-x86_64-znver3-avx2`` or ``opencl-intel_graphics-sg16-intel-opencl-amd-epyc-2026.22``.

Folders: the databases shipped with edgecv are package data,
``device_profiles/tuning/<name>/`` (beside the profiles); a user's own are
``<cache>/tuning/<name>/`` (``$EDGECV_CACHE_DIR/../tuning`` or ``~/.cache/edgecv/tuning``),
layered over the shipped one at deploy.

An OpenCL class names the device that timed it: :func:`find_device` finds it here
(``edgecv tune --on``, or the profile's default device).
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path

import tvm

from ..board.errors import EdgecvError
from ..profiles import Profile, profiles_dir


@dataclass(frozen=True)
class DeviceClass:
    """The identity of a tuning database: ``key`` (a JSON-able dict) and ``name`` (its
    readable folder name)."""

    key: dict
    name: str

    def shipped_folder(self) -> Path:
        return profiles_dir() / "tuning" / self.name

    def user_folder(self) -> Path:
        return user_tuning_dir() / self.name


def user_tuning_dir() -> Path:
    """The user's own databases: beside edgecv's kernel cache (``$EDGECV_CACHE_DIR``'s
    parent when set, else ``~/.cache/edgecv``)."""
    env = os.environ.get("EDGECV_TUNING_DIR")
    if env:
        return Path(env)
    if os.environ.get("EDGECV_CACHE_DIR"):
        return Path(os.environ["EDGECV_CACHE_DIR"]).parent / "tuning"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "edgecv" / "tuning"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9_.]+", "-", text.lower()).strip("-.")


# The widest vector ISA of an LLVM CPU target decides which schedules win; its name is
# the readable part of the class (the full feature list is in the key).
_ISA_ORDER = ("avx512f", "avx2", "avx", "sse4.2", "neon", "sve")


def cpu_class(target: tvm.target.Target) -> DeviceClass:
    """The class of an LLVM target as resolved on this machine (``mcpu`` and the vector
    features the machine really has: a VM may mask AVX-512)."""
    features = sorted(
        str(f)
        for f in tvm.target.codegen.llvm_get_cpu_features(target)
        if re.match(r"(avx|fma|sse|neon|sve|amx|f16c|vnni)", str(f))
    )
    masked = [str(a) for a in target.attrs.get("mattr", [])]
    features = sorted(set(features) - {a.lstrip("-") for a in masked if a.startswith("-")})
    mcpu = str(target.attrs.get("mcpu", "generic"))
    arch = str(target.attrs.get("mtriple", "") or platform.machine()).split("-")[0]
    isa = next((i for i in _ISA_ORDER if i in features), "base")
    key = {"kind": "llvm", "arch": arch, "mcpu": mcpu, "features": features}
    return DeviceClass(key, f"llvm-{arch}-{mcpu}-{isa.replace('avx512f', 'avx512')}")


def opencl_class(target: tvm.target.Target, subgroup: int | None, device) -> DeviceClass:
    """The class of an OpenCL target timed on the pyopencl ``device``."""
    plat = device.platform
    key = {
        "kind": "opencl",
        "device": str(target.attrs.get("device", "")),
        "max_num_threads": int(target.attrs.get("max_num_threads", 256)),
        "subgroup": subgroup,
        "platform": plat.name.strip(),
        "device_name": device.name.strip(),
        "driver": device.driver_version.strip(),
    }
    driver = ".".join(device.driver_version.strip().split(".")[:2])
    parts = [
        "opencl",
        key["device"] or "generic",
        f"sg{subgroup or 0}",
        plat.name,
        device.name,
        driver,
    ]
    return DeviceClass(key, "-".join(_slug(p) for p in parts if _slug(p)))


def find_device(profile: Profile, on: str | None):
    """The pyopencl device ``--on`` names (part of its name), else the profile's default:
    Intel's runtime for a profile with Intel subgroups, else the first real device."""
    from ..board.runtime.opencl_devices import register_pip_runtimes
    from ..board.runtime.opencl_program import is_simulator  # only where OpenCL is asked for

    register_pip_runtimes()
    import pyopencl as cl

    try:
        every = [(p, d) for p in cl.get_platforms() for d in p.get_devices()]
    except cl.Error:
        every = []
    query = (on if on is not None else profile.default_opencl_device).lower()
    found = [
        (p, d)
        for p, d in every
        if query in f"{p.name} / {d.name} / {p.vendor}".lower()
        and (on is not None or not is_simulator(p.name))
    ]
    if not found:
        names = "; ".join(f"{p.name.strip()} / {d.name.strip()}" for p, d in every) or "none"
        raise EdgecvError(
            f"no OpenCL device matches `{query or 'any'}` to build or tune {profile.name} on "
            f"(devices here: {names}); pick one with --on"
        )
    return found[0][1]


def profile_class(profile: Profile) -> DeviceClass | None:
    """The device class whose database a deploy for ``profile`` reads.

    A profile may name its class (``"tuning_class"``: the folder name of the class it
    was tuned as, e.g. DeepLens's stand-in on this machine kind); ``cpu`` and ``local``
    compute it from this machine (the CPU, the OpenCL device ``local`` would use).
    None when it cannot be told (no OpenCL device here for ``local``).
    """
    named = profile.tuning_class
    if named is not None:
        return DeviceClass({"named": named}, named)
    if profile.runtime == "cpu":
        return cpu_class(profile.tvm_target())
    if profile.runtime == "opencl":
        try:
            device = find_device(profile, None)
        except EdgecvError:
            return None
        return opencl_class(profile.tvm_target(), profile.intel_subgroup_size, device)
    return None


def tuning_folders(profile: Profile, user_db: str | Path | None) -> list[str]:
    """Tuning databases for a deploy, highest priority first: the user's own (``--db``,
    by default their cache folder of the device class), then the one shipped for the
    profile's device class (``device_profiles/tuning/<class>/``, when it
    exists)."""
    device_class = profile_class(profile)
    folders = [str(user_db)] if user_db else []
    if device_class is not None:
        if not user_db:
            folders.append(str(device_class.user_folder()))
        folders.append(str(device_class.shipped_folder()))
    return folders
