"""Kernels -> device source + recorded launch lists, for every GPU backend.

TVM's wheel has neither an OpenCL nor a CUDA runtime, so edgecv runs device code
itself, and everything a launch needs is decided here, at build time. Each fused
PrimFunc gets a default GPU schedule (``s_tir.dlight``), is lowered through TVM's
s_tir pipeline up to ``SplitHostDevice``, and is then taken apart:

- the device functions (``calling_conv == 2``) are collected into one module for the
  backend's code generator (:mod:`.opencl`, :mod:`.cuda`);
- the host function is read once, here, into a list of :class:`Launch` records:
  which kernel, which of the PrimFunc's buffers (or constants) as arguments, and the
  grid/work-group sizes. The runtime replays them; it never walks IR.

Host code beyond straight-line launches (loops, workspace allocations: the sort in
``box_nms``) is reported with :class:`UnsupportedHostCode`, and that kernel stays off
the GPU.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import asdict, dataclass, field

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight

from ..errors import EdgecvError
from ..ops.sort_gpu import row_argsort_gpu_version


class UnsupportedHostCode(EdgecvError):
    """A kernel's host code does more than launch device kernels."""


@dataclass
class Launch:
    """One kernel launch: args are ("buffer", param index) or ("scalar", value).

    ``global_size`` counts work-items (OpenCL's convention): CUDA's grid is
    ``global_size / local_size``.
    """

    kernel: str
    args: list[tuple[str, int | float, str]]  # (kind, value, C type of the param)
    global_size: tuple[int, int, int]
    local_size: tuple[int, int, int]
    # bytes of each device workspace of the PrimFunc (the same list on each of its
    # launches); ("workspace", i) arguments name them. The runtime allocates them once.
    workspaces: list[int] = field(default_factory=list)


def launches_to_json(launches: dict[str, list[Launch]]) -> str:
    return json.dumps({name: [asdict(x) for x in items] for name, items in launches.items()})


def launches_from_json(text: str) -> dict[str, list[Launch]]:
    raw = json.loads(text)
    return {
        name: [
            Launch(
                x["kernel"],
                [tuple(a) for a in x["args"]],
                tuple(x["global_size"]),
                tuple(x["local_size"]),
                list(x.get("workspaces", [])),
            )
            for x in items
        ]
        for name, items in raw.items()
    }


@dataclass
class DeviceKernels:
    """The device functions of a model, lowered, and how the host launches them."""

    device_mod: tvm.IRModule
    launches: dict[str, list[Launch]] = field(default_factory=dict)
    unsupported: dict[str, str] = field(default_factory=dict)  # PrimFunc -> why not
    # device functions built for one subgroup size (the subgroup variants' kernels)
    subgroup_kernels: list[str] = field(default_factory=list)


def schedule_gpu(kernels: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """Default GPU schedules (thread bindings) for every PrimFunc."""
    with target:
        return dlight.ApplyDefaultSchedule(
            dlight.gpu.Matmul(),
            dlight.gpu.GEMV(),
            dlight.gpu.Reduction(),
            dlight.gpu.GeneralReduction(),
            dlight.gpu.Fallback(),
        )(kernels)


def _lower_to_split(mod: tvm.IRModule) -> tvm.IRModule:
    """TVM's s_tir lowering, stopped right after SplitHostDevice (before MakePackedAPI)."""
    st, tx = s_tir.transform, tirx.transform
    passes = [
        st.CanonicalizeLoop(), st.LowerCrossThreadReduction(), st.LowerInitBlock(),
        st.PlanAndUpdateBufferAllocationLocation(), st.ConvertBlocksToOpaque(),
        st.LiftThreadBinding(), st.ManifestSharedMemoryLocalStage(),
        st.CompactBufferAllocation(), st.LowerAutoCopy(), st.UnifyThreadBinding(),
        st.LowerMatchBuffer(), st.StmtSimplify(), st.InjectPermutedLayout(),
        st.AnnotateIrregularLoop(), st.InjectSoftwarePipeline(),
        st.TransformMmaBufferLayout(), st.LowerOpaqueBlock(), tx.FlattenBuffer(),
        tx.BF16ComputeLegalize(), tx.NarrowDataType(32), st.LoopPartition(),
        tx.VectorizeLoop(True), st.InjectVirtualThread(), st.InjectDoubleBuffer(),
        tx.StorageRewrite(), st.HoistIfThenElse(), tx.UnrollLoop(),
        st.RenormalizeSplitPattern(), tx.StmtSimplify(), tx.RemoveNoOp(),
        st.RewriteUnsafeSelect(), tx.CommonSubexprElim(), tx.FP8ComputeLegalize(),
        tx.VerifyMemory(), tx.AnnotateEntryFunc(), st.ThreadSync("shared"),
        st.ThreadSync("shared.dyn"), st.ThreadSync("warp"), st.InferFragment(),
        st.LowerThreadAllreduce(), st.MergeSharedMemoryAllocations(), tx.SplitHostDevice(),
    ]  # fmt: skip
    return tvm.transform.Sequential(passes)(mod)


def _is_device(func) -> bool:
    return bool(func.attrs) and int(func.attrs.get("calling_conv", 0)) == 2


def _c_type(ty) -> str:
    text = str(ty)
    if "handle" in text:
        return "pointer"
    return {"int32": "int", "int64": "long", "float32": "float"}.get(
        text.split('"')[-2] if '"' in text else text, text
    )


def _read_host(func, device_funcs: dict) -> list[Launch]:
    params = list(func.params)
    declared: dict = {}
    workspaces: list = []  # host-allocated global buffers, in order
    launches: list[Launch] = []
    call_kernel = tvm.ir.Op.get("tirx.call_ffi_kernel")

    def param_index(var) -> tuple[str, int]:
        for i, p in enumerate(params):
            if p.same_as(var):
                return "buffer", i
        for i, buf in enumerate(workspaces):
            if buf.same_as(var) or buf.data.same_as(var):
                return "workspace", i
        for buf, data in declared.items():
            if buf.same_as(var):
                return param_index(data.args[0])
        raise UnsupportedHostCode(f"{func.attrs['global_symbol']}: argument {var} is no buffer")

    def visit(stmt) -> None:
        if isinstance(stmt, tirx.stmt.SeqStmt):
            for s in stmt.seq:
                visit(s)
        elif isinstance(stmt, tirx.stmt.DeclBuffer):
            declared[stmt.buffer] = stmt.data
        elif isinstance(stmt, tirx.stmt.AllocBuffer) and stmt.buffer.scope() == "global":
            if not all(isinstance(d, tirx.IntImm) for d in stmt.buffer.shape):
                raise UnsupportedHostCode(
                    f"{func.attrs['global_symbol']}: workspace of dynamic size"
                )
            workspaces.append(stmt.buffer)
        elif (
            isinstance(stmt, tirx.stmt.Evaluate)
            and isinstance(stmt.value, tvm.ir.expr.Call)
            and stmt.value.op.same_as(call_kernel)
        ):
            launches.append(_launch(stmt.value, device_funcs, param_index))
        else:
            raise UnsupportedHostCode(
                f"{func.attrs['global_symbol']}: host code has a {type(stmt).__name__}"
            )

    visit(func.body)
    sizes = [_nbytes(buf) for buf in workspaces]
    for launch in launches:
        launch.workspaces = list(sizes)
    return launches


def _nbytes(buf) -> int:
    count = 1
    for dim in buf.shape:
        count *= int(dim)
    return count * tvm.DataType(str(buf.dtype)).bits // 8


def _launch(call, device_funcs: dict, param_index) -> Launch:
    name = str(call.args[0].value)
    device = device_funcs[name]
    tags = [str(t) for t in device.attrs["tirx.kernel_launch_params"]]
    n_args = len(device.params)
    values = [int(v) for v in call.args[1 + n_args : 1 + n_args + len(tags)]]
    groups, local = [1, 1, 1], [1, 1, 1]
    for tag, value in zip(tags, values, strict=True):
        if not re.fullmatch(r"(blockIdx|threadIdx)\.[xyz]", tag):  # dynamic shared memory
            raise UnsupportedHostCode(f"{name}: launch parameter {tag} is not supported")
        axis = "xyz".index(tag[-1])
        (groups if tag.startswith("blockIdx") else local)[axis] = value
    args = []
    for expr, param in zip(call.args[1 : 1 + n_args], device.params, strict=True):
        ctype = _c_type(param.ty)
        if isinstance(expr, tvm.ir.expr.Call) and expr.op.name == "tirx.buffer_data":
            kind, index = param_index(expr.args[0])
            args.append((kind, index, ctype))
        elif isinstance(expr, tirx.Var) and "handle" in str(expr.ty):
            kind, index = param_index(expr)
            args.append((kind, index, ctype))
        elif isinstance(expr, (tirx.IntImm, tirx.FloatImm)):
            args.append(("scalar", expr.value, ctype))
        else:
            raise UnsupportedHostCode(f"{name}: argument {expr} is computed on the host")
    global_size = tuple(g * b for g, b in zip(groups, local, strict=True))
    return Launch(name, args, global_size, tuple(local))


def _gpu_box_nms(spec: dict, target: tvm.target.Target, threads: int, subgroup=None):
    from ..ops.box_nms import box_nms_gpu

    shape, dtype = tuple(spec.pop("shape")), spec.pop("dtype")
    return box_nms_gpu(shape, dtype, str(target.kind.name), threads, subgroup=subgroup, **spec)


def _gpu_roi_align(spec: dict, target: tvm.target.Target, threads: int, subgroup=None):
    from ..ops.roi_align import roi_align_gpu

    # one work-item per output element, nothing to share: no subgroup variant
    shapes = spec.pop("data_shape"), spec.pop("rois_shape")
    return roi_align_gpu(*shapes, spec.pop("dtype"), threads, **spec)


def _gpu_multibox_detection(spec: dict, target: tvm.target.Target, threads: int,
                            subgroup=None):  # fmt: skip
    from ..ops.multibox import multibox_detection_gpu

    shapes, dtype = spec.pop("shapes"), spec.pop("dtype")
    return multibox_detection_gpu(*shapes, dtype, str(target.kind.name), threads,
                                  subgroup=subgroup, **spec)  # fmt: skip


# edgecv operator -> its GPU PrimFunc from (attributes, target, work-group size,
# Intel subgroup size or None)
GPU_VERSIONS = {
    "box_nms": _gpu_box_nms,
    "roi_align": _gpu_roi_align,
    "multibox_detection": _gpu_multibox_detection,
    "row_argsort": row_argsort_gpu_version,
}


def _gpu_box_nms_naive(spec: dict, target: tvm.target.Target, threads: int, subgroup=None):
    from ..ops.naive import naive_box_nms_gpu

    shape, dtype = tuple(spec.pop("shape")), spec.pop("dtype")
    return naive_box_nms_gpu(shape, dtype, **spec)


# other versions a build can be asked for (benchmarks compare against them)
VARIANTS = {("box_nms", "naive"): _gpu_box_nms_naive}


_SUBGROUPS = {"enabled": True}


@contextlib.contextmanager
def gpu_versions(subgroups: bool = True, **choice: str):
    """Build with other GPU versions of edgecv operators while inside, e.g.
    ``with gpu_versions(box_nms="naive"): deploy(...)`` (one work-item per batch row);
    ``subgroups=False`` builds the work-group versions even for devices with Intel
    subgroups (benchmarks compare the two)."""
    saved = dict(GPU_VERSIONS)
    saved_subgroups = _SUBGROUPS["enabled"]
    _SUBGROUPS["enabled"] = subgroups
    try:
        for op, variant in choice.items():
            if (op, variant) not in VARIANTS:
                known = sorted(f"{o}={v}" for o, v in VARIANTS)
                raise ValueError(f"no GPU version {op}={variant}; known: {known}")
            GPU_VERSIONS[op] = VARIANTS[(op, variant)]
        yield
    finally:
        GPU_VERSIONS.clear()
        GPU_VERSIONS.update(saved)
        _SUBGROUPS["enabled"] = saved_subgroups


def gpu_version(func, target: tvm.target.Target, subgroup: int | None = None):
    """The GPU PrimFunc of an edgecv operator kernel (tagged ``edgecv.op`` by the
    importer), with the same parameters; None for every other kernel. ``subgroup``
    (OpenCL targets only): the device's Intel subgroup size, which selects the
    operators' subgroup variants."""
    tag = func.attrs.get("edgecv.op") if func.attrs else None
    if tag is None:
        return None
    spec = json.loads(str(tag))
    make = GPU_VERSIONS.get(spec.pop("op"))
    if make is None:
        return None
    threads = min(256, int(target.attrs.get("max_num_threads", 256)))
    if str(target.kind.name) != "opencl" or not _SUBGROUPS["enabled"]:
        subgroup = None
    return make(spec, target, threads, subgroup)


def lower_device(
    kernels: tvm.IRModule, target: tvm.target.Target, subgroup: int | None = None
) -> DeviceKernels:
    """Schedule and lower every kernel that supports it; split device from host code.
    ``subgroup``: the Intel subgroup size of an OpenCL device that has them."""
    # Passes may update a module they hold the only reference to in place: work on a copy
    # so the caller's kernels stay target-free (the CPU build reuses them).
    versions = {gv: gpu_version(func, target, subgroup) for gv, func in kernels.functions.items()}
    kernels = tvm.IRModule(
        {
            gv: (versions[gv] or func).with_attr("global_symbol", gv.name_hint)
            for gv, func in kernels.functions.items()
        }
    )
    # which PrimFuncs call subgroup builtins: those of their kernels that do need the
    # subgroup size fixed (the others are left to the compiler: forcing 16 lanes on a
    # merge pass made it 3.5x slower on Intel's CPU runtime)
    with_subgroups = {gv.name_hint for gv, f in kernels.functions.items() if _calls_subgroups(f)}
    subgroup_kernels: list[str] = []
    scheduled = tirx.transform.BindTarget(target)(schedule_gpu(kernels, target))
    device_funcs: dict = {}
    launches: dict[str, list[Launch]] = {}
    unsupported: dict[str, str] = {}
    for gv, func in scheduled.functions.items():
        try:
            split = _lower_to_split(tvm.IRModule({gv: func}))
        except Exception as err:  # a kernel dlight could not schedule, etc.
            unsupported[gv.name_hint] = str(err).strip().splitlines()[-1][:200]
            continue
        found = {g.name_hint: f for g, f in split.functions.items() if _is_device(f)}
        host = [f for f in split.functions.values() if not _is_device(f)][0]
        try:
            launches[gv.name_hint] = _read_host(host, found)
        except UnsupportedHostCode as err:
            unsupported[gv.name_hint] = str(err)
            continue
        device_funcs.update(found)
        if gv.name_hint in with_subgroups:
            subgroup_kernels.extend(k for k, f in found.items() if "sub_group_" in f.script())
    device_mod = tvm.IRModule({tvm.ir.GlobalVar(n): f for n, f in device_funcs.items()})
    device_mod = tvm.transform.Sequential(
        [
            tirx.transform.LowerWarpMemory(),
            tirx.transform.StmtSimplify(),
            tirx.transform.LowerIntrin(),
        ]
    )(device_mod)
    return DeviceKernels(device_mod, launches, unsupported, sorted(subgroup_kernels))


def _calls_subgroups(func) -> bool:
    """Hand-written (already scheduled) kernels that call subgroup builtins."""
    if not func.attrs or not func.attrs.get("tirx.is_scheduled"):
        return False  # dlight's schedules use no subgroups (thread_warp_size is 1)
    return "sub_group_" in func.script()
