"""One loaded model called from several threads at once (issue 32): every call's
outputs are those of the same input run alone, on the CPU and on both OpenCL
runtimes, whether the calls wait for the model's one execution context
(``streams=1``) or run in contexts of their own (``streams=3``).

The serial run is the reference: the same kernels on the same input give the same
bits, so any difference is a call that read or wrote another's memory. It is itself
checked against MXNet once, so that a model that is wrong everywhere does not pass.
Threads switch every 10 microseconds here (Python's default: 5 ms), so that calls
interleave at many points of an inference of this tiny model.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time

import numpy as np
import pytest
from conftest import mxnet_forward, needs_pocl
from graph_tuner.small_model import SHAPE, export_small_model
from test_opencl import device_or_skip

import edgecv
from edgecv.board.errors import EdgecvError, ShapeError
from edgecv.deploy import deploy
from edgecv.pipelines import BuildOptions
from edgecv.testing import assert_close

THREADS, CALLS = 4, 20
# what is built does not matter here, only that it is quick: no layout search, no tuning
# database, no check on a device at deploy time
QUICK = BuildOptions(check_on=None, layout="NCHW", tuning=None)

# (profile, OpenCL device): the CPU package, Intel's CPU OpenCL runtime, PoCL
TARGETS = [
    ("cpu", None),
    ("deeplens", "intel"),
    pytest.param("aisage", "pocl", marks=needs_pocl()),
]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    symbol, params = export_small_model(tmp_path_factory.mktemp("small") / "small")
    return symbol, params


@pytest.fixture(scope="module")
def package(small, tmp_path_factory):
    """The small model deployed for a profile, once per profile."""
    symbol, params = small
    deployed = {}

    def get(profile: str):
        if profile not in deployed:
            out = tmp_path_factory.mktemp(profile) / "pkg"
            deployed[profile] = deploy(
                str(symbol),
                out,
                profile,
                params=str(params),
                input_shape=SHAPE,
                host="native",
                options=QUICK,
            )
        return deployed[profile]

    return get


@pytest.fixture
def fast_thread_switches():
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(before)


def run_from_threads(model, inputs: list[np.ndarray]) -> list[list[np.ndarray]]:
    """Outputs of ``model.run`` on each input, from THREADS threads started together."""
    results: list = [None] * len(inputs)
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def work(first: int) -> None:
        try:
            start.wait()
            for i in range(first, len(inputs), THREADS):
                results[i] = model.run(inputs[i])
        except BaseException as err:  # re-raised in the test's thread below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("streams", [1, 3])
@pytest.mark.parametrize(("profile", "on"), TARGETS)
def test_threads_sharing_a_model_get_the_serial_results(
    small, package, profile, on, streams, fast_thread_switches
):
    if on is not None:
        device_or_skip(on)
    model = edgecv.load(package(profile), on=on, streams=streams)
    assert model.streams == streams
    rng = np.random.RandomState(streams)
    inputs = [rng.normal(size=SHAPE).astype(np.float32) for _ in range(THREADS * CALLS)]
    serial = [model.run(x) for x in inputs]
    concurrent = run_from_threads(model, inputs)
    wrong = [
        i
        for i, (got, want) in enumerate(zip(concurrent, serial, strict=True))
        if any(not np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    ]
    assert not wrong, (
        f"{len(wrong)} of {len(inputs)} calls from {THREADS} threads differ from the same "
        f"input run alone (calls {wrong[:10]}...)"
    )
    # after the threads: MXNet's OpenMP workers spin a while after a forward pass, and
    # on 2 cores they kept Intel's runtime from interleaving calls at all
    assert_close(serial[0][0], mxnet_forward(*small, inputs[0])[0], f"small model on {profile}")


@pytest.mark.parametrize("streams", [0, -2, 1.5, "2", True])
def test_streams_below_one_or_not_a_count_is_refused(package, streams):
    with pytest.raises(EdgecvError, match=rf"streams={streams!r}: expected a whole number"):
        edgecv.load(package("cpu"), streams=streams)


def test_a_failed_call_gives_its_context_back(package):
    """A call refused mid-way (a wrong input shape) must not keep the only context:
    every later call would wait for it forever."""
    model = edgecv.load(package("cpu"), streams=1)
    for _ in range(2):
        with pytest.raises(ShapeError):
            model.run(np.zeros((1, 3, 8, 8), np.float32))
    done = []
    later = threading.Thread(target=lambda: done.append(model.run(np.zeros(SHAPE, np.float32))))
    later.start()
    later.join(timeout=30)
    assert done, "a call after two refused ones is still waiting for an execution context"


def test_streams_contexts_share_constants_and_own_activations(package):
    """Each context adds its activation and input memory; the constants are uploaded
    once, whatever the number of streams."""
    one = edgecv.load(package("cpu"), streams=1).executor
    three = edgecv.load(package("cpu"), streams=3).executor
    per_context = one.contexts[0].allocated_bytes
    assert per_context > 0
    assert three.allocated_bytes - one.allocated_bytes == 2 * per_context
    shared = [i for i, b in enumerate(one.plan.buffers) if b.kind == "const"]
    assert shared
    first, second = three.contexts[0].tensors, three.contexts[1].tensors
    assert all(first[i] is second[i] for i in shared)
    assert all(first[i] is not second[i] for i in one.plan.inputs)


def test_streams_split_the_cores_between_the_calling_threads(package):
    """With streams=N each inference runs its CPU kernels on cores/N threads, so N calls
    at once keep the cores busy without oversubscribing them. TVM's pool belongs to the
    thread running the kernels and setting its size again makes its workers spin, so a
    thread is sized once: inferences of another pool size than the default run on
    threads kept for that size, never on the main thread or on a thread of another
    size; the main thread keeps every core."""
    import tvm_ffi

    from edgecv.board.runtime.cpu import pool_threads

    num_threads = tvm_ffi.get_global_func("runtime.NumThreads")
    cores = pool_threads()
    half = max(1, cores // 2)
    split = edgecv.load(package("cpu"), streams=2)
    whole = edgecv.load(package("cpu"), streams=1)
    seen: dict[str, list] = {"split": [], "whole": []}
    for name, model in (("split", split), ("whole", whole)):
        for context in model.executor.contexts:

            def recorded(arrays, run=context.run_prepared, log=seen[name]):
                outputs = run(arrays)
                log.append((threading.current_thread(), num_threads()))
                return outputs

            context.run_prepared = recorded

    def calls():
        for model in (split, whole, split, whole):
            model.run(np.zeros(SHAPE, np.float32))

    calls()  # from the main thread
    other = threading.Thread(target=calls)
    other.start()
    other.join()
    main = threading.main_thread()
    assert [n for _, n in seen["split"]] == [half] * 4
    assert [n for _, n in seen["whole"]] == [cores] * 4
    assert seen["whole"][0][0] is main
    split_threads = {t for t, _ in seen["split"]}
    assert (main in split_threads) == (half == cores)
    assert not split_threads & {t for t, _ in seen["whole"][1:]} or half == cores
    assert num_threads() == cores  # the main thread's pool was never resized
    assert [c.backend.threads for c in split.executor.contexts] == [half, half]


def test_short_lived_calling_threads_leave_no_threads_behind(package):
    """TVM's CPU thread pool belongs to the thread calling a kernel and outlives it: a
    new thread per call (a server's thread per request) left 2 threads behind each
    time. Calls from threads other than the main one run on threads edgecv keeps."""
    import os

    from edgecv.board.runtime.workers import kept_threads

    model = edgecv.load(package("cpu"), streams=2)
    x = np.random.RandomState(0).normal(size=SHAPE).astype(np.float32)
    want = model.run(x)

    def threads_now() -> int:
        # Thread.join returns once Python is done with the thread; its OS task may stay
        # listed a moment longer while it exits: count once the count holds for 50 ms
        count, deadline = len(os.listdir("/proc/self/task")), time.monotonic() + 5.0
        while time.monotonic() < deadline:
            time.sleep(0.05)
            now = len(os.listdir("/proc/self/task"))
            if now == count:
                break
            count = now
        return count

    def one_call_per_thread(count: int) -> None:
        for _ in range(count):
            got: list = []
            thread = threading.Thread(target=lambda got=got: got.append(model.run(x)))
            thread.start()
            thread.join()
            assert all(np.array_equal(a, b) for a, b in zip(got[0], want, strict=True))

    one_call_per_thread(3)  # the first calls make a kept thread and its pool
    before, kept = threads_now(), kept_threads()
    one_call_per_thread(20)
    assert threads_now() == before, "threads grew with the calling threads"
    assert kept_threads() == kept


def test_a_package_redeployed_in_place_runs_its_new_kernels(small, package, tmp_path):
    """The dynamic loader returns the library already loaded under a path: a package
    redeployed in place (--force) for another input size and loaded again in the same
    process ran the old kernels (wrong results). The new load must run the new ones.
    The first package is the module's `cpu` one, copied (the same deploy)."""
    symbol, params = small
    out = tmp_path / "pkg"
    shutil.copytree(package("cpu"), out)
    for shape in (SHAPE, (1, 3, 16, 16)):
        if shape != SHAPE:
            deploy(
                str(symbol),
                out,
                "cpu",
                params=str(params),
                input_shape=shape,
                host="native",
                options=QUICK,
                force=True,
            )
        model = edgecv.load(out)
        assert model.input_shape == shape
        x = np.random.RandomState(1).normal(size=shape).astype(np.float32)
        assert_close(model.run(x)[0], mxnet_forward(symbol, params, x)[0], f"after {shape}")
