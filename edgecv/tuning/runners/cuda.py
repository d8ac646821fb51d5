"""CUDA: tuning needs the GPU it tunes for; without one here, ``tune`` says so."""

from __future__ import annotations

from ...board.errors import EdgecvError
from ...profiles import Profile


def refuse_without_gpu(profile: Profile) -> None:
    """Raise with what to do instead: this version times CUDA candidates only on a
    machine with a CUDA GPU, and has no CUDA runner yet."""
    from ...board.runtime.cuda import cuda_devices

    found = cuda_devices()
    where = (
        f"this machine has {', '.join(d.label for d in found)}, but edgecv has no CUDA "
        "tuning runner yet"
        if found
        else "this machine has no CUDA driver or GPU"
    )
    raise EdgecvError(
        f"cannot tune for `{profile.name}` (CUDA): {where}. Tune on the Jetson itself "
        "(`edgecv tune ... --device cpu` there for its CPU), or deploy without tuning: "
        "the default GPU rules apply"
    )
