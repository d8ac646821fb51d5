"""An execution context: the memory and bound launches one inference in flight owns.

A static plan writes every activation into storage slots fixed at load time, so two
inferences replaying it on the same slots overwrite each other's tensors: two threads
sharing one set got wrong outputs, silently (mobilenet1.0, 37 of 40). A context
therefore owns everything an inference writes: the storage slots with the temp
buffers viewing them (GPU kernels' device workspaces among them), the input buffers,
the kernel launches bound to those, and, through :meth:`~.backend.Backend.stream`, its
own command queue on a device that queues work (OpenCL kernels with their arguments
set are bound per context too: such a kernel object cannot serve two enqueues at once).
The constants, the kernels and the plan stay shared, read-only:
:class:`~.executor.Executor` uploads the constants once and hands each context their
tensors. A context runs one inference at a time; the executor lends idle ones to its
callers.

What a caller passes is checked before anything is written (:func:`prepare_inputs`):
an array the model can take without changing its values' meaning is converted (other
float widths, another byte order, Fortran order or strided views are copied into the
C-order array the backends upload), anything else is refused with one line naming the
input, what was wrong and what to do. A failure past that point (a kernel or a device
call raising) is one :class:`InferenceError` naming the launch it happened in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import EdgecvError, ShapeError, foreign_message
from ..plan import Plan
from .backend import Backend


class InferenceError(EdgecvError):
    """An inference failed on its device after its inputs were accepted (a kernel, a
    copy or a device call raised); the call's outputs are lost."""


# (name, shape, dtype) of each input of a plan, in the plan's order
InputSpec = tuple[str, tuple[int, ...], np.dtype]


def input_specs(plan: Plan) -> list[InputSpec]:
    """What each input of ``plan`` must be: its name, shape and dtype."""
    return [
        (plan.buffers[i].name, tuple(plan.buffers[i].shape), np.dtype(plan.buffers[i].dtype))
        for i in plan.inputs
    ]


def prepare_inputs(specs: Sequence[InputSpec], inputs: Sequence[Any]) -> list[np.ndarray]:
    """The caller's ``inputs`` as the C-order arrays of the model's shapes and dtypes,
    or one :class:`~edgecv.board.errors.ShapeError` line saying which input is wrong, how,
    and what to do. Arrays that already fit are passed through without a copy."""
    if len(inputs) != len(specs):
        names = ", ".join(f"`{name}` {shape}" for name, shape, _ in specs)
        raise ShapeError(
            f"the model takes {len(specs)} input(s) ({names}) and was given {len(inputs)}: "
            "call run() with one array per input, in that order"
        )
    return [prepare_input(spec, value) for spec, value in zip(specs, inputs)]


def prepare_input(spec: InputSpec, value: Any) -> np.ndarray:
    """One input (see :func:`prepare_inputs`)."""
    name, shape, dtype = spec
    if type(value) is np.ndarray:  # the usual case first: no conversion, no copy
        array = value
    else:
        array = _as_array(name, shape, dtype, value)
    if array.shape != shape:
        raise ShapeError(_shape_message(name, shape, array.shape))
    if array.dtype != dtype:
        array = _converted(name, dtype, array)
    if not array.flags.c_contiguous:  # Fortran order, a strided view: the backends copy
        array = np.ascontiguousarray(array)  # C-order bytes to the device
    return array


def _as_array(name: str, shape: tuple[int, ...], dtype: np.dtype, value: Any) -> np.ndarray:
    """``value`` read as an array: an ndarray subclass, a nested list of numbers, any
    object NumPy reads as an array; never a string, a mapping or None."""
    wanted = f"pass a NumPy array of shape {shape} and dtype {dtype}"
    if isinstance(value, np.ndarray):
        return np.asarray(value)  # a subclass (matrix, masked, memmap): its data
    if value is None or isinstance(value, (str, bytes, dict, set)):
        raise ShapeError(f"input `{name}` is {type(value).__name__}, not an array: {wanted}")
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, np.ndarray) for v in value):
        raise ShapeError(
            f"input `{name}` is a {type(value).__name__} of {len(value)} array(s): pass each "
            "input as its own argument, run(a, b), or np.stack the list if it is one batch"
        )
    try:
        array = np.asarray(value)
    except Exception as err:  # a ragged list; an object whose __array__ fails
        raise ShapeError(
            f"input `{name}` ({type(value).__name__}) cannot be read as an array "
            f"({foreign_message(err, limit=120)}): {wanted}"
        ) from None
    if array.dtype.kind in "OUSV":  # objects NumPy could only wrap, not read as numbers
        raise ShapeError(
            f"input `{name}` is {type(value).__name__}, which NumPy reads as {array.dtype} "
            f"data, not numbers: {wanted}"
        )
    return array


def _shape_message(name: str, shape: tuple[int, ...], got: tuple[int, ...]) -> str:
    if len(got) == len(shape) and 0 not in got:
        return (
            f"input `{name}` has shape {got}, the model was built for {shape}; redeploy with "
            f"--input-shape {','.join(map(str, got))} or resize the input"
        )
    what = "a scalar (0-d)" if not got else f"{'empty, ' * (0 in got)}{len(got)}-d, shape {got}"
    size, expected = int(np.prod(got, dtype=np.int64)), int(np.prod(shape, dtype=np.int64))
    fix = (
        f"reshape it to {shape} (x.reshape({', '.join(map(str, shape))}))"
        if size == expected
        else f"pass an array of shape {shape}"
    )
    return f"input `{name}` is {what}, the model takes {len(shape)}-d {shape}: {fix}"


def _converted(name: str, dtype: np.dtype, array: np.ndarray) -> np.ndarray:
    """``array`` as ``dtype`` where that keeps what its values mean: a float of any
    width as the model's float (float64 -> float32 rounds each value to the nearest
    float32, what a user casting it would get), an integer that fits the model's
    integer type exactly, another byte order. Anything else is refused."""
    source = array.dtype
    same_kind = source.kind == dtype.kind == "f" or (
        source.kind in "iu" and dtype.kind in "iu" and np.can_cast(source, dtype, "safe")
    )
    if same_kind or source.newbyteorder("=") == dtype:
        return array.astype(dtype, order="C")
    hint = ""
    if source.kind in "iub" and dtype.kind == "f":
        hint = (
            " (integers such as an image's uint8 pixels are not the model's input: "
            "preprocess them, or use predict(image) for an image)"
        )
    raise ShapeError(
        f"input `{name}` has dtype {source}, the model takes {dtype}{hint}: pass "
        f"x.astype(np.{dtype.name}) if its values are what the model expects"
    )


class ExecutionContext:
    """The per-inference state of one plan: allocated and bound once, reused by every
    inference run in it.

    Parameters
    ----------
    plan : Plan
        The static plan (memory already planned).
    backends : dict
        The backend of each device name the plan uses, as this context streams to it
        (:meth:`~.backend.Backend.stream` of the executor's backends).
    shared : dict
        Tensors of the buffers every context reads and none writes (the constants and
        views of them), by buffer id.
    """

    def __init__(self, plan: Plan, backends: dict[str, Backend], shared: dict[int, Any]):
        self.plan = plan
        self.backends = backends
        self.backend = backends[plan.devices()[0]]
        self._distinct = list({id(b): b for b in backends.values()}.values())
        # the largest thread pool of the calling thread's its kernels use
        # (Backend.calling_thread_pool), None where they use none: fixed with its streams
        pools = [b.calling_thread_pool for b in self._distinct]
        self.calling_thread_pool = max((n for n in pools if n is not None), default=None)
        # why the context cannot run (its device failed and no new context could be
        # made in its place: see Executor.run), None while it can
        self.broken: str | None = None
        # (backend, bytes) this context added to each backend's device-memory count
        self.device_bytes: list[tuple[Backend, int]] = []
        self.specs = input_specs(plan)
        slot_devices = plan.storage_devices or ["cpu"] * len(plan.storage_sizes)
        # views of pieces need their slot kept alive
        self._slots = [
            backends[slot_devices[i]].alloc(size) for i, size in enumerate(plan.storage_sizes)
        ]
        self.allocated_bytes = sum(plan.storage_sizes)
        tensors: list = [None] * len(plan.buffers)
        for buffer_id, tensor in shared.items():
            tensors[buffer_id] = tensor
        for buf in plan.buffers:
            backend = backends[buf.device]
            if buf.kind == "temp":
                slot = self._slots[buf.storage]
                tensors[buf.id] = backend.view(slot, buf.shape, buf.dtype, buf.offset)
            elif buf.kind == "input":
                storage = backend.alloc(max(buf.nbytes, 1))
                self.allocated_bytes += max(buf.nbytes, 1)
                tensors[buf.id] = backend.view(storage, buf.shape, buf.dtype)
        for buf in plan.buffers:  # views come after the buffer they view, in id order
            if buf.kind == "view" and tensors[buf.id] is None:
                root = plan.buffers[plan.root(buf.id)]
                backend = backends[buf.device]
                if root.kind == "temp":
                    slot = self._slots[root.storage]
                    tensors[buf.id] = backend.view(slot, buf.shape, buf.dtype, root.offset)
                else:
                    tensors[buf.id] = backend.view(tensors[root.id], buf.shape, buf.dtype)
        self.tensors = tensors
        self._inputs = [(backends[plan.buffers[i].device], tensors[i]) for i in plan.inputs]
        self._outputs = [(backends[plan.buffers[o].device], tensors[o]) for o in plan.outputs]
        self.steps = [step for step in plan.steps if not step.elided]
        # one per step that runs (an elided one's inputs were written in place)
        self.launches = [
            self._bind_copy(step) if step.kind == "copy" else self._bind_kernel(step)
            for step in self.steps
        ]

    def _bind_kernel(self, step) -> Callable[[], None]:
        """The step's kernel bound to its tensors and, where the plan places its device
        workspaces, to those (views of this context's storage, so each context has its
        own); a plan without them leaves the backend to allocate them."""
        backend, tensors = self.backends[step.device], self.tensors
        args = [tensors[a] for a in step.args]
        if step.workspaces:
            return backend.bind(step.kernel, args, [tensors[w] for w in step.workspaces])
        return backend.bind(step.kernel, args)

    def _bind_copy(self, step) -> Callable[[], None]:
        source, destination = (self.plan.buffers[a] for a in step.args)
        src_backend = self.backends[source.device]
        dst_backend = self.backends[destination.device]
        src, dst = self.tensors[source.id], self.tensors[destination.id]

        def run() -> None:  # downloads wait for the source device's queued work
            dst_backend.upload(dst, src_backend.download(src))

        return run

    def run(self, inputs: Sequence[Any]) -> list[np.ndarray]:
        """Run one inference on arrays in the plan's input order; return the outputs
        (fresh arrays: nothing returned aliases this context's memory). Inputs are
        checked and converted by :func:`prepare_inputs` first."""
        return self.run_prepared(prepare_inputs(self.specs, inputs))

    def run_prepared(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """:meth:`run` on inputs :func:`prepare_inputs` returned. A failure on the
        device is one :class:`InferenceError` (an :class:`~edgecv.board.errors.EdgecvError`
        of a backend passes as it is) naming where it happened; the context's memory
        then holds a partial inference, which the next one overwrites."""
        done = 0  # launches run so far: where a failure happened
        try:
            for backend in self._distinct:
                backend.make_current()
            for (backend, tensor), array in zip(self._inputs, arrays):
                backend.upload(tensor, array)
            for launch in self.launches:
                launch()
                done += 1
            for backend in self._distinct:
                backend.synchronize()
            return [backend.download(tensor) for backend, tensor in self._outputs]
        except EdgecvError:
            raise
        except Exception as err:
            raise InferenceError(self._failure(err, done)) from None

    def _failure(self, err: Exception, done: int) -> str:
        """One line: where the inference failed, the device's reason, what to do."""
        if done < len(self.launches):
            step = self.steps[done]
            what = "device copy" if step.kind == "copy" else f"kernel `{step.kernel}`"
            where = f"launch {done + 1} of {len(self.launches)} ({what} on the {step.device})"
        else:
            where = "reading the outputs back"
        return (
            f"inference failed at {where}: {type(err).__name__}: {one_line(err)}; the "
            "call's outputs are lost: call again (a failure that repeats: load the model "
            "again, or report it with the package)"
        )


def one_line(err: BaseException, limit: int = 300) -> str:
    """The reason of a device or kernel error on one line: TVM's argument checks say
    what was wrong on their first line and the value expected on their last
    (``Mismatched data.ndim on argument #0 when calling:`` / signature / ``expected
    4``); other errors' meaningful line is their last (:func:`foreign_message`)."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(" when calling:"):
        first = lines[0].removesuffix(" when calling:")
        last = lines[-1] if not lines[-1].startswith("`") else ""
        text = f"{first}, {last}" if last else first
        return text if len(text) <= limit else text[: limit - 3] + "..."
    return foreign_message(err, limit=limit)
