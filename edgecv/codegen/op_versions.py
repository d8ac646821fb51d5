"""The GPU versions of edgecv's own operators (box NMS, ROIAlign, MultiBoxDetection,
the row argsort behind MXNet's argsort/sort/topk, the three-stage scan behind ONNX's
CumSum).

The importer tags the kernels of these operators with an ``edgecv.op`` attribute (the
operator and its attributes as JSON). A GPU build replaces each tagged kernel by the
operator's GPU PrimFunc (written scheduled, in :mod:`edgecv.ops`), with the same
parameters. Which version is built travels as an explicit :class:`OpVersions` value
(benchmarks ask for the naive or the work-group versions); nothing here is mutable.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import tvm
from tvm import tirx

from ..board.errors import EdgecvError

# (attributes, target, work-group size, Intel subgroup size or None) -> GPU PrimFunc
MakeGpuVersion = Callable[[dict, tvm.target.Target, int, int | None], tirx.PrimFunc]


def _box_nms(spec: dict, target: tvm.target.Target, threads: int, subgroup=None):
    from ..ops.box_nms import box_nms_gpu

    shape, dtype = tuple(spec.pop("shape")), spec.pop("dtype")
    return box_nms_gpu(shape, dtype, str(target.kind.name), threads, subgroup=subgroup, **spec)


def _roi_align(spec: dict, target: tvm.target.Target, threads: int, subgroup=None):
    from ..ops.roi_align import roi_align_gpu

    # one work-item per output element, nothing to share: no subgroup variant
    shapes = spec.pop("data_shape"), spec.pop("rois_shape")
    return roi_align_gpu(*shapes, spec.pop("dtype"), threads, **spec)


def _multibox_detection(spec: dict, target: tvm.target.Target, threads: int, subgroup=None):
    from ..ops.multibox import multibox_detection_gpu

    shapes, dtype = spec.pop("shapes"), spec.pop("dtype")
    return multibox_detection_gpu(
        *shapes, dtype, str(target.kind.name), threads, subgroup=subgroup, **spec
    )


def _row_argsort(spec: dict, target: tvm.target.Target, threads: int, subgroup=None):
    from ..ops.row_argsort_gpu import row_argsort_gpu_version

    return row_argsort_gpu_version(spec, target, threads, subgroup)


def _top_class_rows(spec: dict, target: tvm.target.Target, threads: int, subgroup=None):
    from ..ops.class_rows import top_class_rows_gpu

    # counts and compaction share nothing between work-items: no subgroup variant
    shapes, dtype = (spec.pop("scores_shape"), spec.pop("boxes_shape")), spec.pop("dtype")
    threads = max(16, 1 << (min(threads, 256).bit_length() - 1))  # a power of two
    return top_class_rows_gpu(*shapes, dtype=dtype, threads=threads, **spec)


def _scan(spec: dict, target: tvm.target.Target, threads: int, subgroup=None):
    from ..ops.scan import scan_gpu

    rows, n = spec.pop("shape")
    threads = max(16, 1 << (min(threads, 256).bit_length() - 1))  # a power of two
    return scan_gpu(rows, n, spec.pop("dtype"), threads=threads, subgroup=subgroup, **spec)


def _box_nms_naive(spec: dict, target: tvm.target.Target, threads: int, subgroup=None):
    from ..ops.naive import naive_box_nms_gpu

    shape, dtype = tuple(spec.pop("shape")), spec.pop("dtype")
    return naive_box_nms_gpu(shape, dtype, **spec)


# (operator, version) -> how to make it; "default" is what a build uses unless asked
VERSIONS: Mapping[tuple[str, str], MakeGpuVersion] = {
    ("box_nms", "default"): _box_nms,
    ("roi_align", "default"): _roi_align,
    ("multibox_detection", "default"): _multibox_detection,
    ("row_argsort", "default"): _row_argsort,
    ("top_class_rows", "default"): _top_class_rows,
    ("scan", "default"): _scan,
    ("box_nms", "naive"): _box_nms_naive,  # one work-item per batch row (benchmarks)
}


@dataclass(frozen=True)
class OpVersions:
    """Which GPU versions of edgecv's operators a build uses.

    Parameters
    ----------
    choice : mapping
        Operator -> version name, e.g. ``{"box_nms": "naive"}``; others use "default".
    subgroups : bool
        Build the Intel-subgroup variants for devices that have Intel subgroups
        (False: the work-group versions, for comparison).
    """

    choice: Mapping[str, str] = field(default_factory=dict)
    subgroups: bool = True

    def __post_init__(self) -> None:
        for op, version in self.choice.items():
            if (op, version) not in VERSIONS:
                known = sorted(f"{o}={v}" for o, v in VERSIONS if v != "default")
                raise EdgecvError(f"no GPU version {op}={version}; known: {', '.join(known)}")

    def gpu_version(
        self, func: tirx.PrimFunc, target: tvm.target.Target, subgroup: int | None = None
    ) -> tirx.PrimFunc | None:
        """The GPU PrimFunc of an edgecv operator kernel, with the same parameters; None
        for every other kernel. ``subgroup`` (OpenCL targets only): the device's Intel
        subgroup size, which selects the operators' subgroup variants."""
        tag = func.attrs.get("edgecv.op") if func.attrs else None
        if tag is None:
            return None
        spec = json.loads(str(tag))
        op = spec.pop("op")
        make = VERSIONS.get((op, self.choice.get(op, "default")))
        if make is None:
            return None
        threads = min(256, int(target.attrs.get("max_num_threads", 256)))
        if str(target.kind.name) != "opencl" or not self.subgroups:
            subgroup = None
        return make(spec, target, threads, subgroup)

    def replace(
        self, kernels: tvm.IRModule, target: tvm.target.Target, subgroup: int | None = None
    ) -> tvm.IRModule:
        """``kernels`` with every tagged kernel replaced by its GPU version."""
        functions = {}
        for gv, func in kernels.functions.items():
            version = (
                self.gpu_version(func, target, subgroup)
                if isinstance(func, tirx.PrimFunc)
                else None
            )
            functions[gv] = (version or func).with_attr("global_symbol", gv.name_hint)
        return tvm.IRModule(functions)
