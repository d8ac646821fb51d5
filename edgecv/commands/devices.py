"""``edgecv devices``: the OpenCL and CUDA devices on this machine, with what edgecv's
schedules read of them."""

from __future__ import annotations

import argparse


def add_parser(sub, common) -> None:
    """Register ``devices`` on the CLI's subparsers."""
    v = sub.add_parser("devices", parents=[common], help="list OpenCL and CUDA devices here")
    v.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..board.runtime.cuda import cuda_devices
    from ..board.runtime.opencl_devices import opencl_devices

    devices = opencl_devices()
    print(f"OpenCL devices: {len(devices)}")
    for dev in devices:
        subgroups = "intel subgroups" if dev.intel_subgroups else "no subgroups"
        memory = f"{dev.global_memory_bytes / 2**30:.1f} GiB"
        local = f"local {dev.local_memory_bytes // 1024} KiB"
        print(
            f"  {dev.label}\n      {dev.version}; {subgroups}; {dev.compute_units} compute units; "
            f"{memory}; {local}; max work-group {dev.max_work_group_size}"
        )
    cuda = cuda_devices()
    print(f"CUDA devices: {len(cuda)}")
    for dev in cuda:
        print(f"  {dev.label}; {dev.global_memory_bytes / 2**30:.1f} GiB")
    if not cuda:
        print("  (no CUDA driver or GPU here: CUDA packages deploy, but run only on a GPU)")
    return 0
