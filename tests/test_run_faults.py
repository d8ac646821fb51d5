"""Faults at run time (issue 32, "Under load", item 4).

A loaded model is called with whatever a program has at hand: arrays of another
dtype, byte order or memory layout, lists, scalars, objects that are not arrays, the
wrong number of them. What keeps its meaning is converted (another float width,
Fortran order, strided views: the outputs are those of the float32 C-order array);
the rest is refused with one line naming the input, what is wrong and what to do,
from any thread, while the other threads' calls stay right.

A kernel failing mid-run is made real, not mocked: the CPU backend is wrapped so that
an armed launch calls the real TVM kernel with a tensor of the wrong shape, and TVM's
own argument check raises; on OpenCL the context's command queue is swapped for a
queue of another OpenCL context, and the driver refuses the launch. Each gives one
EdgecvError for that call, the model's execution context is replaced (none is lost,
the others never see the failure), and the next call is right; when no new context
can be made the model is closed: every call is refused, none waits forever.
"""

from __future__ import annotations

import copy
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_error_line, run_cli

import edgecv
from edgecv.board.errors import EdgecvError, ShapeError
from edgecv.board.package import read_params
from edgecv.board.runtime.context import InferenceError, prepare_input
from edgecv.board.runtime.cpu import CPUBackend, CPUTensor
from edgecv.board.runtime.executor import Executor

SHAPE = (1, 3, 8, 8)
THREADS = 4


def tiny_model(folder: Path) -> tuple[Path, Path]:
    """A small MXNet graph with seeded weights, exported as a user's symbol and params
    files (no Gluon, so it is written in milliseconds): convolutions (a depthwise one),
    batch norm, ReLU and LeakyReLU, a concatenation, pooling and a dense head."""
    from edgecv._mxnet import import_mxnet

    mx = import_mxnet()
    s = mx.sym
    x = s.relu(
        s.BatchNorm(
            s.Convolution(s.var("data"), kernel=(3, 3), pad=(1, 1), num_filter=8, name="conv0"),
            name="bn0",
        )
    )
    x = s.LeakyReLU(
        s.Convolution(
            x, kernel=(3, 3), pad=(1, 1), num_filter=8, num_group=8, no_bias=True, name="dw"
        ),
        slope=0.1,
        name="leaky",
    )
    x = s.concat(
        s.Convolution(x, kernel=(1, 1), num_filter=4, name="pw"),
        s.Pooling(x, kernel=(3, 3), pad=(1, 1), stride=(1, 1), pool_type="avg"),
        dim=1,
        name="cat",
    )
    x = s.Pooling(x, kernel=(2, 2), stride=(2, 2), pool_type="max", name="pool")
    net = s.FullyConnected(x, num_hidden=5, flatten=True, name="fc")
    args, _, aux = net.infer_shape(data=SHAPE)
    rng = np.random.RandomState(0)

    def value(name: str, shape) -> np.ndarray:
        if name.endswith(("_gamma", "_var")):
            return rng.uniform(0.5, 1.5, shape).astype(np.float32)
        return rng.normal(0, 0.5, shape).astype(np.float32)

    arrays = {
        f"arg:{n}": mx.nd.array(value(n, sh))
        for n, sh in zip(net.list_arguments(), args, strict=True)
        if n != "data"
    }
    arrays.update(
        {
            f"aux:{n}": mx.nd.array(value(n, sh))
            for n, sh in zip(net.list_auxiliary_states(), aux, strict=True)
        }
    )
    folder.mkdir(parents=True, exist_ok=True)
    symbol, params = folder / "tiny-symbol.json", folder / "tiny-0000.params"
    net.save(str(symbol))
    mx.nd.save(str(params), arrays)
    return symbol, params


_BUILT: dict[str, Path] = {}  # profile -> package, once per test session (test_fuzz too)


def quick_package(profile: str, tmp_path_factory) -> Path:
    """The tiny model deployed for ``profile`` (once per session): no layout search, no
    tuning database, no device check, so a build takes a second or two."""
    from edgecv.deploy import deploy
    from edgecv.pipelines import BuildOptions

    if profile not in _BUILT:
        folder = tmp_path_factory.mktemp(f"tiny-{profile}")
        symbol, params = tiny_model(folder / "model")
        quick = BuildOptions(check_on=None, layout="NCHW", tuning=None)
        _BUILT[profile] = deploy(
            str(symbol),
            folder / "pkg",
            profile,
            params=str(params),
            input_shape=SHAPE,
            host="native",
            options=quick,
        )
    return _BUILT[profile]


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return quick_package("cpu", tmp_path_factory)


@pytest.fixture
def fast_thread_switches():
    """Threads switch every 10 us (Python's default: 5 ms), so calls interleave at many
    points of an inference of this tiny model."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(before)


def x_of(seed: int) -> np.ndarray:
    return np.random.RandomState(seed).normal(size=SHAPE).astype(np.float32)


def idle_contexts(model) -> int:
    return model.executor._idle.qsize()


def assert_one_line(err: BaseException, *fragments: str) -> str:
    message = str(err)
    assert message and "\n" not in message, repr(message)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


# -- inputs ------------------------------------------------------------------------------


def test_inputs_are_converted_where_their_values_keep_their_meaning(package):
    """Another float width, byte order or memory layout, a nested list: the outputs are
    exactly those of the same values as a C-order float32 array."""
    model = edgecv.load(package)
    x = x_of(0)
    want = model.run(x)
    wide = np.zeros((1, 3, 8, 16), np.float32)
    wide[..., ::2] = x
    variants = {
        "float64": x.astype(np.float64),
        "Fortran order": np.asfortranarray(x),
        "strided view": wide[..., ::2],
        "big-endian float32": x.astype(">f4"),
        "transposed twice": np.ascontiguousarray(x.transpose(3, 2, 1, 0)).transpose(3, 2, 1, 0),
        "nested list": x.tolist(),
    }
    for what, value in variants.items():
        got = model.run(value)
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True)), what
    half = x.astype(np.float16)  # float16 -> float32 is exact: the values of `half`
    assert np.array_equal(model.run(half)[0], model.run(half.astype(np.float32))[0])
    spec = model.executor.specs[0]
    assert prepare_input(spec, x) is x  # what already fits is passed on, not copied


BAD_INPUTS = [
    (np.zeros(SHAPE, np.int64), "dtype int64, the model takes float32 (integers"),
    (np.zeros(SHAPE, np.uint8), "predict(image)"),
    (np.zeros(SHAPE, np.bool_), "dtype bool"),
    (np.zeros(SHAPE, np.complex64), "dtype complex64"),
    (np.full(SHAPE, None, object), "dtype object"),
    (np.float32(1.0), "is a scalar (0-d)"),
    (np.zeros(SHAPE[1:], np.float32), "reshape it to (1, 3, 8, 8)"),
    (np.zeros((1, 3, 9, 9), np.float32), "redeploy with --input-shape 1,3,9,9"),
    (np.zeros((2, 3, 8, 8), np.float32), "has shape (2, 3, 8, 8)"),
    (np.zeros((0,), np.float32), "is empty, 1-d, shape (0,)"),
    (np.zeros((1, 3, 0, 8), np.float32), "is empty, 4-d, shape (1, 3, 0, 8)"),
    (None, "is NoneType, not an array"),
    ("photo.jpg", "is str, not an array"),
    ({"data": 0}, "is dict, not an array"),
    ([np.zeros(SHAPE, np.float32)], "a list of 1 array(s): pass each input as its own"),
    ([[1.0, 2.0], [3.0]], "cannot be read as an array"),
    (object(), "which NumPy reads as object data"),
]


@pytest.mark.parametrize(("value", "fragment"), BAD_INPUTS)
def test_a_wrong_input_is_refused_in_one_line(package, value, fragment):
    model = edgecv.load(package)
    want = model.run(x_of(1))[0]
    with pytest.raises(ShapeError) as err:
        model.run(value)
    assert_one_line(err.value, "input `data`", fragment)
    assert idle_contexts(model) == 1
    assert np.array_equal(model.run(x_of(1))[0], want)


def test_the_wrong_number_of_inputs_is_refused_in_one_line(package):
    model = edgecv.load(package)
    for inputs in [(), (x_of(0), x_of(1))]:
        with pytest.raises(ShapeError) as err:
            model.run(*inputs)
        assert_one_line(
            err.value,
            "takes 1 input(s) (`data` (1, 3, 8, 8))",
            f"was given {len(inputs)}",
            "one array per input",
        )


@pytest.mark.parametrize("streams", [1, 2])
def test_threads_mixing_good_and_wrong_inputs(package, streams, fast_thread_switches):
    """Several threads call one model, good and wrong inputs interleaved: every good
    call gets its serial result, every wrong one its one-line refusal, and afterwards
    the model holds all its contexts, idle."""
    model = edgecv.load(package, streams=streams)
    calls = 12
    goods = [x_of(i) for i in range(THREADS * calls)]
    serial = [model.run(x)[0] for x in goods]
    wrong: list[str] = []
    bad: list[tuple[int, int]] = []
    start = threading.Barrier(THREADS)

    def work(thread: int) -> None:
        start.wait()
        for i in range(thread, len(goods), THREADS):
            value, fragment = BAD_INPUTS[i % len(BAD_INPUTS)]
            try:
                model.run(value)
            except ShapeError as err:
                if fragment in str(err) and "\n" not in str(err):
                    bad.append((thread, i))
            if not np.array_equal(model.run(goods[i])[0], serial[i]):
                wrong.append(f"call {i} of thread {thread}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a call is still waiting for a context"
    assert not wrong, wrong
    assert len(bad) == len(goods), "a wrong input was not refused with its one line"
    assert idle_contexts(model) == streams


def only_error_line(result, fragment: str) -> str:
    """A CLI refusal (exit 2, a user's error, not edgecv's) whose stderr is exactly one
    ``edgecv: error:`` line holding ``fragment``, besides ``[edgecv]`` progress lines."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    line = assert_one_error_line(result, fragment)
    others = [s for s in result.stderr.splitlines() if not s.startswith("[edgecv] ")]
    assert others == [line], result.stderr
    return line


def test_cli_refuses_an_integer_input_in_one_line(package, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros(SHAPE, np.int64))
    result = run_cli("run", package, "--input", tmp_path / "x.npy")
    only_error_line(result, "input `data` has dtype int64")


# -- kernels failing mid-run --------------------------------------------------------------


class FaultyCPU(CPUBackend):
    """The real CPU backend, able to fail launches on demand.

    ``fail(n, kernel)`` arms the next ``n`` launches of ``kernel`` (on any stream of this
    backend): such a launch calls the real TVM kernel with its first argument swapped
    for a tensor of another rank, so TVM's generated argument check raises, as a kernel
    given what it was not compiled for does. ``refuse_streams`` makes :meth:`stream`
    fail (a device that cannot give a new execution context its queue any more).
    """

    def __init__(self, module):
        super().__init__(module)
        self.lock = threading.Lock()
        self.armed: dict[str, int] = {}
        self.failed: list[str] = []
        self.refuse_streams = False

    def fail(self, count: int, kernel: str) -> None:
        with self.lock:
            self.armed[kernel] = count

    def stream(self, streams: int = 1) -> FaultyCPU:
        if self.refuse_streams:
            raise RuntimeError("the device cannot make a new stream (simulated)")
        stream = super().stream(streams)
        return stream if stream is not self else copy.copy(self)

    def bind(self, name: str, tensors: list):
        function = self._function(name)
        handles = [t.handle for t in tensors]
        wrong = [CPUTensor(np.zeros(7, np.float32)).handle, *handles[1:]]
        parent = self  # copies made by stream() share lock, armed and failed

        def launch() -> None:
            if parent.armed.get(name):
                with parent.lock:
                    fire = parent.armed.get(name, 0) > 0
                    if fire:
                        parent.armed[name] -= 1
                        parent.failed.append(name)
                if fire:
                    function(*wrong)  # TVM raises: argument #0 has the wrong rank
            function(*handles)

        return launch


def faulty_model(package: Path, streams: int) -> tuple[Executor, FaultyCPU, np.ndarray, list]:
    """An executor of the package's plan on a FaultyCPU, with a reference input and its
    outputs (computed before any fault is armed)."""
    loaded = edgecv.load(package).executor
    backend = FaultyCPU(loaded.backends["cpu"].module)  # the package's own kernels
    executor = Executor(loaded.plan, backend, read_params(Path(package)), streams)
    x = x_of(3)
    return executor, backend, x, executor.run([x])


def second_kernel(executor: Executor) -> tuple[int, str]:
    """A kernel launched after the first one: (its launch number, its name)."""
    for index, step in enumerate(executor.steps):
        if index > 0 and step.kind == "kernel" and step.kernel != executor.steps[0].kernel:
            return index + 1, step.kernel
    raise AssertionError("the tiny model has one kernel only")


def test_a_kernel_failing_mid_run_is_one_error_and_the_next_call_is_right(package):
    executor, backend, x, want = faulty_model(package, streams=1)
    number, kernel = second_kernel(executor)
    before = executor.contexts[0]
    backend.fail(1, kernel)
    with pytest.raises(InferenceError) as err:
        executor.run([x])
    assert_one_line(
        err.value,
        f"launch {number} of {executor.num_launches}",
        f"kernel `{kernel}` on the cpu",
        "ndim on argument #0",
        "call again",
    )
    assert isinstance(err.value, EdgecvError) and backend.failed == [kernel]
    assert executor._idle.qsize() == 1  # given back, not lost
    assert executor.contexts[0] is not before  # replaced by a fresh one
    for _ in range(3):
        assert np.array_equal(executor.run([x])[0], want[0])


def test_a_failure_in_one_stream_leaves_the_others_right(package, fast_thread_switches):
    """Three streams, four threads calling at once; one launch fails somewhere in the
    middle: exactly that call fails, every other call gets its serial result, and the
    model ends with its three contexts idle, one of them new."""
    executor, backend, _, _ = faulty_model(package, streams=3)
    _, kernel = second_kernel(executor)
    inputs = [x_of(i) for i in range(THREADS * 10)]
    serial = [executor.run([x])[0] for x in inputs]
    contexts = list(executor.contexts)
    results: list = [None] * len(inputs)
    start = threading.Barrier(THREADS)

    def work(thread: int) -> None:
        start.wait()
        for i in range(thread, len(inputs), THREADS):
            if i == len(inputs) // 2:
                backend.fail(1, kernel)
            try:
                results[i] = executor.run([inputs[i]])[0]
            except EdgecvError as err:
                results[i] = err

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    failed = [r for r in results if isinstance(r, EdgecvError)]
    assert len(failed) == 1 and isinstance(failed[0], InferenceError), failed
    assert_one_line(failed[0], f"kernel `{kernel}`")
    wrong = [
        i
        for i, r in enumerate(results)
        if not isinstance(r, EdgecvError) and not np.array_equal(r, serial[i])
    ]
    assert not wrong, f"calls {wrong} differ from their serial results"
    assert executor._idle.qsize() == 3
    kept = sum(c in contexts for c in executor.contexts)
    assert kept == 2, "the failed context should be replaced, the other two kept"


def test_a_model_whose_device_gives_no_new_context_is_closed_not_hung(package):
    """When the failed context cannot be replaced, every call is refused with why (from
    several threads at once: none waits forever); once the device gives contexts again,
    the next call replaces the broken one and is right."""
    executor, backend, x, want = faulty_model(package, streams=1)
    _, kernel = second_kernel(executor)
    backend.refuse_streams = True
    backend.fail(1, kernel)
    with pytest.raises(InferenceError):
        executor.run([x])
    refusals: list[str] = []

    def call() -> None:
        try:
            executor.run([x])
        except EdgecvError as err:
            refusals.append(str(err))

    threads = [threading.Thread(target=call) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a call waits on a closed model"
    assert len(refusals) == THREADS
    for message in refusals:
        assert "\n" not in message
        assert "can no longer run" in message and "load the model again" in message
        assert "cannot make a new stream" in message and "Mismatched" in message
    backend.refuse_streams = False
    assert np.array_equal(executor.run([x])[0], want[0])
    assert executor._idle.qsize() == 1


def test_an_opencl_queue_gone_bad_mid_run(tmp_path_factory):
    """On Intel's OpenCL runtime: one context's command queue is swapped, mid-run, for
    a queue of another OpenCL context (so the driver refuses the next launch with
    INVALID_CONTEXT). That call fails with one line; its context is replaced, with the
    device memory it held given back to the model's count; the other stream and every
    later call are right."""
    from test_opencl import device_or_skip

    device_or_skip("intel")
    model = edgecv.load(quick_package("deeplens", tmp_path_factory), on="intel", streams=2)
    executor = model.executor
    x = x_of(5)
    want = model.run(x)[0]
    cl = executor.backend.cl
    foreign = cl.CommandQueue(cl.Context([executor.backend.device]))
    fired = threading.Event()

    def swap_queue_before(context, launch):
        def run() -> None:
            if not fired.is_set():
                fired.set()
                context.backends["gpu"].queue = foreign
            launch()

        return run

    for context in executor.contexts:
        context.launches[1] = swap_queue_before(context, context.launches[1])
    contexts, allocated = list(executor.contexts), executor.backend.allocated_bytes
    with pytest.raises(InferenceError) as err:
        model.run(x)
    assert_one_line(
        err.value, f"launch 2 of {executor.num_launches}", "on the gpu", "INVALID_CONTEXT"
    )
    assert sum(c in contexts for c in executor.contexts) == 1
    assert executor.backend.allocated_bytes == allocated
    for _ in range(4):  # both contexts, in turn
        assert np.array_equal(model.run(x)[0], want)
    assert idle_contexts(model) == 2
