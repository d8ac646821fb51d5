"""Run Python code on an emulated aarch64 (Debian bookworm arm64) user space.

The user space is prepared by ``bash tests/emulation/prepare_aarch64.sh``
under :func:`root`: a sysroot with Debian's ``python3.11`` and PoCL, and the
aarch64 wheels in ``site-packages``.  :func:`run_python` starts the sysroot's
aarch64 python3.11 under ``qemu-aarch64-static`` inside a chroot of the
sysroot.  The chroot (rather than ``qemu -L``) matters because qemu-user does
not redirect calls such as ``access()`` into a ``-L`` prefix, and PoCL checks
its kernel library with them.

There is no binfmt_misc, so the kernel cannot execute an aarch64 program by
itself.  In the sysroot, ``/usr/bin/python3.11`` and the linker that PoCL runs
are therefore small static x86-64 wrappers that execute the real aarch64
program (kept in ``/usr/libexec/edgecv-aarch64/``) with
``/usr/bin/qemu-aarch64-static``; the guest can also start ``sys.executable``.

Everything happens in a private mount namespace (``unshare -m``): /proc,
/dev, /sys, a tmpfs on /tmp and the caller's bind mounts exist only for the
emulated process and its children, and vanish with them.

Run as a script, it executes its arguments with the emulated interpreter, in
the current directory (bind-mounted at the same path)::

    python tests/emulation/aarch64.py -c 'import platform; print(platform.machine())'
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

#: Last line of ``$ROOT/READY``; must match LAYOUT_VERSION in prepare_aarch64.sh.
LAYOUT_VERSION = "edgecv-aarch64-userspace 1"
PREPARE_COMMAND = "bash tests/emulation/prepare_aarch64.sh"
QEMU = "/usr/bin/qemu-aarch64-static"
#: In the chroot: the x86-64 wrapper that runs the aarch64 interpreter under QEMU.
GUEST_PYTHON = "/usr/bin/python3.11"
#: PATH for the host helpers (mount, unshare) and for the guest alike.
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Runs as root inside the new mount namespace (propagation is private, so
# none of these mounts is seen outside).  Arguments: sysroot, working
# directory, number of bind paths, the bind paths, then the guest's argv.
_NAMESPACE_SCRIPT = r"""
set -eu
sysroot=$1 wd=$2 nbinds=$3
shift 3
mount -t proc proc "$sysroot/proc"
mount --rbind /dev "$sysroot/dev"
mount --rbind /sys "$sysroot/sys"
mount -t tmpfs -o mode=1777 tmpfs "$sysroot/tmp"
while [ "$nbinds" -gt 0 ]; do
    src=$1
    dst=$sysroot$src
    shift
    nbinds=$((nbinds - 1))
    if [ -d "$src" ]; then
        mkdir -p "$dst"
    else
        mkdir -p "${dst%/*}"
        [ -e "$dst" ] || : >"$dst"
    fi
    mount --bind "$src" "$dst"
done
exec unshare --root="$sysroot" --wd="$wd" "$@"
"""


def root() -> Path:
    """Folder of the prepared user space (``$EDGECV_AARCH64_ROOT``, by default
    ``~/.cache/edgecv/aarch64``)."""
    configured = os.environ.get("EDGECV_AARCH64_ROOT")
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "edgecv" / "aarch64"


def sysroot() -> Path:
    """The unpacked arm64 sysroot that :func:`run_python` chroots into."""
    return root() / "sysroot"


def site_packages() -> Path:
    """The aarch64 wheels, put on the guest's PYTHONPATH."""
    return root() / "site-packages"


def pocl_cache() -> Path:
    """PoCL's compiled-kernel cache (POCL_CACHE_DIR), kept between runs."""
    return root() / "pocl-cache"


@functools.lru_cache(maxsize=1)
def _namespace_problem() -> str | None:
    """Why ``unshare -m`` cannot be used here, or None when it works."""
    for tool in ("unshare", "mount"):
        if shutil.which(tool, path=_PATH) is None:
            return f"'{tool}' (util-linux) is not installed"
    try:
        probe = subprocess.run(
            ["unshare", "-m", "true"],
            capture_output=True,
            text=True,
            timeout=30,
            env={"PATH": _PATH},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"'unshare -m true' failed: {exc}"
    if probe.returncode != 0:
        detail = probe.stderr.strip().splitlines()
        why = detail[-1] if detail else f"exit status {probe.returncode}"
        return (
            f"cannot create a mount namespace ('unshare -m true': {why}); "
            "needs root or CAP_SYS_ADMIN"
        )
    return None


def unavailable_reason() -> str | None:
    """None when the aarch64 user space can be used, else a one-line reason."""
    ready = root() / "READY"
    try:
        lines = ready.read_text().splitlines()
    except OSError:
        return f"aarch64 user space not prepared ({ready} missing); run: {PREPARE_COMMAND}"
    if not lines or lines[-1].strip() != LAYOUT_VERSION:
        return (
            f"aarch64 user space at {root()} is outdated (want '{LAYOUT_VERSION}'); "
            f"run: {PREPARE_COMMAND}"
        )
    if not os.access(sysroot() / QEMU.lstrip("/"), os.X_OK):
        return f"{sysroot()}{QEMU} missing; run: {PREPARE_COMMAND}"
    problem = _namespace_problem()
    if problem is not None:
        return f"{problem}; the aarch64 tests need it (prepared by {PREPARE_COMMAND})"
    return None


def _bind_paths(binds: Sequence[Path]) -> list[str]:
    """Absolute, existing, de-duplicated bind paths, parents before children."""
    paths = {os.path.abspath(site_packages()), os.path.abspath(pocl_cache())}
    for bind in binds:
        path = os.path.abspath(bind)
        if path == "/":
            raise ValueError("cannot bind-mount / into the aarch64 chroot")
        if not os.path.exists(path):
            raise FileNotFoundError(f"bind path does not exist: {path}")
        paths.add(path)
    return sorted(paths, key=lambda p: (p.count("/"), p))


def guest_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of the emulated process: a small fixed base (the host's
    environment is not inherited) updated with ``env``.  PYTHONPATH from
    ``env`` is put before the wheels' folder."""
    base = {
        "PATH": _PATH,
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OCL_ICD_VENDORS": "/etc/OpenCL/vendors",
        "POCL_CACHE_DIR": str(pocl_cache()),
    }
    extra = dict(env or {})
    pythonpath = [p for p in (extra.pop("PYTHONPATH", ""),) if p]
    pythonpath.append(str(site_packages()))
    base.update(extra)
    base["PYTHONPATH"] = os.pathsep.join(pythonpath)
    return base


def command(
    args: Sequence[str],
    *,
    binds: Sequence[Path] = (),
    cwd: Path | None = None,
) -> list[str]:
    """The host argv that runs the guest python with ``args`` (see :func:`run_python`)."""
    bind_paths = _bind_paths(binds)
    wd = os.path.abspath(cwd) if cwd is not None else "/tmp"
    return [
        "unshare",
        "-m",
        "sh",
        "-c",
        _NAMESPACE_SCRIPT,
        "aarch64-namespace",  # $0 of the script
        str(sysroot()),
        wd,
        str(len(bind_paths)),
        *bind_paths,
        GUEST_PYTHON,
        *args,
    ]


def run_python(
    args: list[str],
    *,
    binds: Sequence[Path] = (),
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """Run the sysroot's aarch64 ``python3.11 *args`` under qemu-user.

    ``binds`` are host paths (folders or files) bind-mounted at the same
    absolute path inside the chroot, so callers can pass host paths in
    ``args`` unchanged; ``cwd`` is a path inside the chroot (by default the
    private /tmp), usually one of ``binds``.  ``env`` is added to a small
    fixed environment (see :func:`guest_environment`).  stdout and stderr are
    captured as text; the return code is not checked.  On timeout the whole
    process group is killed and :class:`subprocess.TimeoutExpired` raised.
    """
    argv = command(args, binds=binds, cwd=cwd)
    with subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=guest_environment(env),
        start_new_session=True,  # so a timeout can kill the linker children too
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.communicate()
            raise
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def main(argv: Sequence[str]) -> int:
    """Run ``argv`` with the emulated python in the current directory."""
    if not (sysroot() / GUEST_PYTHON.lstrip("/")).exists():
        print(f"no aarch64 sysroot at {sysroot()}; run: {PREPARE_COMMAND}", file=sys.stderr)
        return 2
    here = Path.cwd()
    result = run_python(list(argv), binds=[here], cwd=here)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
