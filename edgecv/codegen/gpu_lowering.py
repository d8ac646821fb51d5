"""A scheduled GPU kernel -> its device functions + the host's launches, recorded.

TVM's wheel has neither an OpenCL nor a CUDA runtime, so edgecv runs device code
itself, and everything a launch needs is decided here, at build time. Each scheduled
PrimFunc is lowered through TVM's s_tir pipeline up to ``SplitHostDevice`` and then
taken apart:

- its device functions (``calling_conv == 2``) go to the backend's code generator
  (:mod:`.opencl`, :mod:`.cuda`), all kernels' together in one module;
- its host function is read once, here, into a list of
  :class:`~edgecv.board.plan.Launch` records: which device function, which of the
  PrimFunc's buffers (or constants) as arguments, and the grid/work-group sizes. The
  runtime replays them; it never walks IR.

Host code beyond straight-line launches (a loop, a workspace of dynamic size) is
reported with :class:`UnsupportedHostCode`: the schedule stage then tries the next rule,
and a kernel no rule can lower stays off the GPU.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import tvm
from tvm import s_tir, tirx
from tvm_ffi.serialization import from_json_graph_str

from ..board.errors import EdgecvError
from ..board.plan import Launch
from ..schedules.stage import KernelChoice, ScheduleOrder
from .contained import compile_in_process


class UnsupportedHostCode(EdgecvError):
    """A kernel's host code does more than launch device kernels."""


def _lower_to_split(mod: tvm.IRModule, narrow: bool = True) -> tvm.IRModule:
    """TVM's s_tir lowering, stopped right after SplitHostDevice (before MakePackedAPI).

    ``narrow=False`` keeps 64-bit indices (OpenCL, see :func:`lower_kernel`)."""
    st, tx = s_tir.transform, tirx.transform
    narrowing = [tx.NarrowDataType(32)] if narrow else []
    passes = [
        st.CanonicalizeLoop(),
        st.LowerCrossThreadReduction(),
        st.LowerInitBlock(),
        st.PlanAndUpdateBufferAllocationLocation(),
        st.ConvertBlocksToOpaque(),
        st.LiftThreadBinding(),
        st.ManifestSharedMemoryLocalStage(),
        st.CompactBufferAllocation(),
        st.LowerAutoCopy(),
        st.UnifyThreadBinding(),
        st.LowerMatchBuffer(),
        st.StmtSimplify(),
        st.InjectPermutedLayout(),
        st.AnnotateIrregularLoop(),
        st.InjectSoftwarePipeline(),
        st.TransformMmaBufferLayout(),
        st.LowerOpaqueBlock(),
        tx.FlattenBuffer(),
        tx.BF16ComputeLegalize(),
        *narrowing,
        st.LoopPartition(),
        tx.VectorizeLoop(True),
        st.InjectVirtualThread(),
        st.InjectDoubleBuffer(),
        tx.StorageRewrite(),
        st.HoistIfThenElse(),
        tx.UnrollLoop(),
        st.RenormalizeSplitPattern(),
        tx.StmtSimplify(),
        tx.RemoveNoOp(),
        st.RewriteUnsafeSelect(),
        tx.CommonSubexprElim(),
        tx.FP8ComputeLegalize(),
        tx.VerifyMemory(),
        tx.AnnotateEntryFunc(),
        st.ThreadSync("shared"),
        st.ThreadSync("shared.dyn"),
        st.ThreadSync("warp"),
        st.InferFragment(),
        st.LowerThreadAllreduce(),
        st.MergeSharedMemoryAllocations(),
        tx.SplitHostDevice(),
    ]
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
    arguments = _parameter_bytes(func)
    for launch in launches:
        launch.workspaces = list(sizes)
        launch.buffers = list(arguments)
    return launches


def _parameter_bytes(func) -> list[int]:
    """Bytes of each parameter's buffer of ``func``, in parameter order (0 for one that
    is no buffer): what its device code was compiled to read or write there (the
    runtime checks the plan's buffers against it: :attr:`Launch.buffers`). Empty where a
    shape is known only at run time."""
    sizes = []
    for param in func.params:  # a buffer parameter is a Var of BufferType (tirx)
        if not isinstance(param.ty, tvm.ir.type.PrimType):
            if not all(isinstance(d, tirx.IntImm) for d in param.shape):
                return []
            sizes.append(_nbytes(param))
        else:
            sizes.append(0)
    return sizes


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


def lower_kernel(name: str, func: tirx.PrimFunc) -> tuple[tvm.IRModule, list[Launch]]:
    """Lower one scheduled kernel: its device functions and the launches of its host
    code; raises (:class:`UnsupportedHostCode`, TVM errors) when it cannot."""
    # OpenCL keeps Relax's 64-bit indices: Intel's CPU OpenCL compiler vectorizes across
    # work-items only where an address is a 64-bit work-item id plus uniform terms; a
    # 32-bit index (a truncated id) makes every load a gather and every store a scatter,
    # several times slower (benchmarks/results/gpu_rules-2026-11-23-intel-cpu-opencl.md).
    # PoCL is unaffected.
    target = func.attrs.get("target") if func.attrs else None
    narrow = target is None or target.kind.name != "opencl"
    split = _lower_to_split(tvm.IRModule({name: func.with_attr("global_symbol", name)}), narrow)
    found = {g.name_hint: f for g, f in split.functions.items() if _is_device(f)}
    host = next(f for f in split.functions.values() if not _is_device(f))
    launches = _read_host(host, found)
    device = tvm.IRModule({tvm.ir.GlobalVar(n): f for n, f in found.items()})
    return device, launches


def lower_to_file(target: tvm.target.Target):
    """A :data:`~.contained.CompileOne` for GPU kernels: lowers in the child and writes
    the device functions as TVM JSON beside the work folder; the facts carry the
    launches and which device functions call subgroup builtins."""

    def compile_one(name: str, func: tirx.PrimFunc, work_dir: Path) -> dict:
        with target:
            device, launches = lower_kernel(
                name, tirx.transform.BindTarget(target)(tvm.IRModule({name: func}))[name]
            )
        # Generate the kernel's own code here, in the contained child: a device function
        # the code generator rejects (a packed call left in device code) fails this
        # candidate, not the whole program later.
        opencl = target.kind.name == "opencl"
        codegen = "target.build.opencl" if opencl else "target.build.cuda"
        generated = tvm.get_global_func(codegen)(_device_passes(device), target)
        path = work_dir / f"{name}.device.json"
        path.write_text(tvm.ir.save_json(device))
        subgroups = (
            [g.name_hint for g, f in device.functions.items() if "sub_group_" in f.script()]
            if _calls_subgroups(func)
            else []
        )
        facts = {"device": str(path), "launches": launches, "subgroup_kernels": subgroups}
        if opencl:  # the program is joined from these (edgecv.codegen.opencl.join_opencl)
            source = work_dir / f"{name}.cl"
            source.write_text(generated.inspect_source())
            facts["source"] = str(source)
        return facts

    return compile_one


def device_module(parts: list[str]) -> tvm.IRModule:
    """The device functions of every kernel (files written by :func:`lower_to_file`) in
    one module, through the last device-side passes, ready for code generation."""
    functions = {}
    for path in parts:
        # written by this TVM (lower_to_file): read without load_json's upgrade of old JSON
        for gv, func in from_json_graph_str(Path(path).read_text()).functions.items():
            functions[tvm.ir.GlobalVar(gv.name_hint)] = func
    return _device_passes(tvm.IRModule(functions))


def _device_passes(device: tvm.IRModule) -> tvm.IRModule:
    return tvm.transform.Sequential(
        [
            tirx.transform.LowerWarpMemory(),
            tirx.transform.StmtSimplify(),
            tirx.transform.LowerIntrin(),
        ]
    )(device)


def _calls_subgroups(func) -> bool:
    """Hand-written (already scheduled) kernels that call subgroup builtins: their
    device functions get the subgroup size fixed; others are left to the compiler
    (forcing 16 lanes on a merge pass made it several times slower on Intel's CPU
    runtime: benchmarks/results/gpu_rules-2026-11-23-intel-cpu-opencl.md)."""
    return "sub_group_" in func.script()


@dataclass
class DeviceKernels:
    """The device functions of a model, lowered, and how the host launches them."""

    device_mod: tvm.IRModule
    launches: dict[str, list[Launch]] = field(default_factory=dict)
    unsupported: dict[str, str] = field(default_factory=dict)  # kernel -> why not
    # device functions built for one subgroup size (the subgroup variants' kernels)
    subgroup_kernels: list[str] = field(default_factory=list)
    choices: dict[str, KernelChoice] = field(default_factory=dict)


def lower_device(kernels: tvm.IRModule, order: ScheduleOrder) -> DeviceKernels:
    """The deploy's GPU code stage in this process (tests, benchmarks): every kernel
    through the same :func:`lower_to_file`, candidate by candidate in the schedule
    stage's order (:func:`~.contained.compile_in_process`; the deploy pipelines run it
    contained, with a time limit per candidate). A kernel takes the first candidate that
    lowers and generates code; one that none does is reported in ``unsupported``."""
    result = DeviceKernels(tvm.IRModule({}))
    functions = {gv.name_hint: f for gv, f in kernels.functions.items()}
    with tempfile.TemporaryDirectory(prefix="edgecv-lower-") as work:
        compiled = compile_in_process(functions, order, lower_to_file(order.target), Path(work))
        parts = []
        for name, done in compiled.items():
            result.choices[name] = done.choice
            if not done.facts:
                passed = done.choice.passed_over
                result.unsupported[name] = passed[-1][1] if passed else "no rule applies"
                continue
            result.launches[name] = done.facts["launches"]
            result.subgroup_kernels += done.facts["subgroup_kernels"]
            parts.append(done.facts["device"])
        result.device_mod = device_module(parts)
    result.subgroup_kernels.sort()
    return result
