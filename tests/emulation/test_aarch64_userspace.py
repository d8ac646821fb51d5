"""The emulated aarch64 user space works: Python, NumPy, PoCL through pyopencl, tvm_ffi.

Needs ``bash tests/emulation/prepare_aarch64.sh`` (skipped otherwise).  Each
test starts the sysroot's aarch64 python3.11 under qemu-user in a chroot.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import aarch64
import numpy as np
import pytest

_REASON = aarch64.unavailable_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")


def _run_json(args: list[str], **kwargs) -> dict:
    """Run the guest python and parse the JSON object on its last stdout line."""
    result = aarch64.run_python(args, **kwargs)
    assert result.returncode == 0, (
        f"guest exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    )
    lines = result.stdout.strip().splitlines()
    assert lines, f"guest printed nothing\n{result.stderr}"
    return json.loads(lines[-1])


_NUMPY_PROBE = """
import json, platform, subprocess, sys
import numpy as np
child = subprocess.run([sys.executable, "-c", "import platform; print(platform.machine())"],
                       capture_output=True, text=True, check=True)
m = np.arange(1.0, 10.0).reshape(3, 3) + 2.0 * np.eye(3)
rhs = np.array([1.0, -2.0, 0.5])
print(json.dumps({
    "machine": platform.machine(),
    "maxsize": sys.maxsize,
    "byteorder": sys.byteorder,
    "executable": sys.executable,
    "child_machine": child.stdout.strip(),
    "numpy": np.__version__,
    "numpy_file": np.__file__,
    "solve": np.linalg.solve(m, rhs).tolist(),
    "matmul": (m @ m.T).tolist(),
    "int_sum": int(np.arange(1_000_000, dtype=np.int64).sum()),
    "float32_sum": float(np.linspace(0, 1, 1001, dtype=np.float32).sum()),
}))
"""


def test_python_and_numpy_run_as_aarch64():
    out = _run_json(["-c", _NUMPY_PROBE])

    assert out["machine"] == "aarch64"
    assert out["maxsize"] == 2**63 - 1
    assert out["byteorder"] == "little"
    assert out["executable"] == aarch64.GUEST_PYTHON
    assert out["child_machine"] == "aarch64"  # sys.executable runs in a subprocess too
    assert out["numpy"] == "1.26.4"
    assert out["numpy_file"].startswith(str(aarch64.site_packages()))

    m = np.arange(1.0, 10.0).reshape(3, 3) + 2.0 * np.eye(3)
    rhs = np.array([1.0, -2.0, 0.5])
    np.testing.assert_allclose(out["solve"], np.linalg.solve(m, rhs), rtol=1e-12)
    np.testing.assert_allclose(m @ np.array(out["solve"]), rhs, atol=1e-12)
    np.testing.assert_array_equal(out["matmul"], m @ m.T)
    assert out["int_sum"] == 999_999 * 1_000_000 // 2
    assert out["float32_sum"] == pytest.approx(500.5, rel=1e-6)

    # The chroot's mounts lived in a private mount namespace: none is left on the host.
    assert str(aarch64.sysroot()) not in Path("/proc/self/mountinfo").read_text()


_OPENCL_GUEST = textwrap.dedent(
    """
    import json, platform, sys, time
    from pathlib import Path

    import numpy as np
    import pyopencl as cl

    KERNEL = '''
    __kernel void scale_add(__global const float *a, __global const float *b,
                            __global float *out, const float scale)
    {
        const size_t i = get_global_id(0);
        out[i] = a[i] * scale + b[i];
    }
    '''

    work = Path(sys.argv[1])
    scale = np.float32(sys.argv[2])
    a = np.load(work / "a.npy")
    b = np.load(work / "b.npy")

    platforms = [p for p in cl.get_platforms() if p.name == "Portable Computing Language"]
    device = platforms[0].get_devices()[0]
    context = cl.Context([device])
    queue = cl.CommandQueue(context)

    start = time.perf_counter()
    program = cl.Program(context, KERNEL).build()
    build_s = time.perf_counter() - start

    mf = cl.mem_flags
    a_buf = cl.Buffer(context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
    b_buf = cl.Buffer(context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=b)
    out_buf = cl.Buffer(context, mf.WRITE_ONLY, a.nbytes)
    start = time.perf_counter()
    program.scale_add(queue, a.shape, None, a_buf, b_buf, out_buf, scale)
    out = np.empty_like(a)
    cl.enqueue_copy(queue, out, out_buf)
    queue.finish()
    run_s = time.perf_counter() - start  # includes PoCL's work-group function build
    np.save(work / "out.npy", out)

    print(json.dumps({
        "machine": platform.machine(),
        "platform": platforms[0].name,
        "device": device.name,
        "is_cpu": bool(device.type & cl.device_type.CPU),
        "build_s": round(build_s, 3),
        "run_s": round(run_s, 3),
    }))
    """
)


def test_pyopencl_kernel_runs_on_emulated_pocl(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(4099).astype(np.float32)  # not a multiple of any work-group size
    b = rng.standard_normal(4099).astype(np.float32)
    scale = np.float32(2.5)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    (tmp_path / "guest.py").write_text(_OPENCL_GUEST)

    # tmp_path is bind-mounted at the same path, so host paths work unchanged.
    out = _run_json(
        [str(tmp_path / "guest.py"), str(tmp_path), str(scale)],
        binds=[tmp_path],
        cwd=tmp_path,
        timeout=300,
    )
    # Shown with -rP: cold (first run, empty PoCL cache) vs cached build times.
    print(f"PoCL device {out['device']!r}: build {out['build_s']} s, first launch {out['run_s']} s")

    assert out["machine"] == "aarch64"
    assert out["platform"] == "Portable Computing Language"
    assert out["is_cpu"]
    result = np.load(tmp_path / "out.npy")
    assert result.dtype == np.float32 and result.shape == a.shape
    # PoCL may contract a*scale+b into one fused multiply-add: allow a rounding step.
    np.testing.assert_allclose(result, a * scale + b, rtol=1e-6, atol=1e-6)


_TVM_FFI_PROBE = """
import json, platform
import numpy as np
import tvm_ffi

@tvm_ffi.register_global_func("edgecv_test.mul_add")
def _mul_add(a, b, c):
    return a * b + c

mul_add = tvm_ffi.get_global_func("edgecv_test.mul_add")
tensor = tvm_ffi.from_dlpack(np.arange(6, dtype=np.float32).reshape(2, 3))
print(json.dumps({
    "machine": platform.machine(),
    "version": tvm_ffi.__version__,
    "array": list(tvm_ffi.convert([1, 2, 3])),
    "mul_add": mul_add(6, 7, 0.5),
    "shape": list(tensor.shape),
    "dtype": str(tensor.dtype),
}))
"""


def test_tvm_ffi_imports_and_calls_through_the_ffi():
    out = _run_json(["-c", _TVM_FFI_PROBE])

    assert out["machine"] == "aarch64"
    assert out["version"] == "0.1.14.post0"
    assert out["array"] == [1, 2, 3]
    assert out["mul_add"] == 42.5
    assert out["shape"] == [2, 3]
    assert out["dtype"] == "float32"
