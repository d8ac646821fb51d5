"""A registered operator against the same computation from built-in operators.

    python benchmarks/custom_ops.py [--repeat 20] [--size 16] [--devices cpu,intel]

The capsule convolution of ``demos/custom_ops/my_ops.py`` (``register_op``, one TE
kernel scheduled by edgecv's default rules) against the same layer written with MXNet's
built-in operators: pose row ``i`` moved to the batch, capsules x pose columns as the
channels of one convolution (weights rearranged to match), then back:
``transpose -> reshape -> Convolution -> reshape -> transpose``. Both are deployed as
packages (no tuning records) and timed as whole runs (median of ``--repeat`` after a
warm-up), after their outputs are checked against the NumPy reference. Prints the
ratio registered / built-in per device (issue 31's bar: within 1.5x).

Not a test: numbers depend on the machine and its load; the OpenCL device here is
Intel's CPU runtime standing in for an integrated GPU.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

DEMO = Path(__file__).resolve().parent.parent / "demos" / "custom_ops"
sys.path.insert(0, str(DEMO))
import custom_op_models  # noqa: E402, F401  (registers the Custom ops with MXNet)
import my_ops  # noqa: E402  (registers them with edgecv)

import edgecv  # noqa: E402
from edgecv._mxnet import import_mxnet  # noqa: E402
from edgecv.bench.harness import median_time  # noqa: E402
from edgecv.deploy import deploy  # noqa: E402
from edgecv.pipelines import BuildOptions  # noqa: E402
from edgecv.testing import assert_close  # noqa: E402

PROFILES = {"cpu": ("cpu", None), "intel": ("deeplens", "intel(r) opencl")}


def export_pair(folder: Path, cin: int, cout: int, poses: int, size: int, seed: int = 0):
    """Write the registered and the built-in versions of one capsule layer (3x3, pad 1)
    as symbol + params; returns the two symbol paths, the data, weight and shape."""
    mx = import_mxnet()
    rng = np.random.RandomState(seed)
    shape = (1, cin, poses, poses, size, size)
    weight = rng.normal(size=(cout, cin, 3, 3, poses, poses)) / np.sqrt(cin * 9 * poses)
    weight = weight.astype(np.float32)
    data = mx.sym.var("data")
    w = mx.sym.var("weight")
    registered = mx.sym.Custom(data, w, op_type="capsule_conv2d", stride=1, pad=1)
    x = mx.sym.transpose(data, axes=(0, 2, 1, 3, 4, 5))  # (N, P_i, Cin, P_k, H, W)
    x = mx.sym.reshape(x, shape=(-1, cin * poses, size, size))
    x = mx.sym.Convolution(x, w, kernel=(3, 3), pad=(1, 1), num_filter=cout * poses, no_bias=True)
    x = mx.sym.reshape(x, shape=(-1, poses, cout, poses, size, size))
    builtin = mx.sym.transpose(x, axes=(0, 2, 1, 3, 4, 5))
    # weight[(co, j), (ci, k), kh, kw] = w[co, ci, kh, kw, k, j]
    packed = weight.transpose(0, 5, 1, 4, 2, 3).reshape(cout * poses, cin * poses, 3, 3)
    paths = []
    for name, sym, value in (("registered", registered, weight), ("builtin", builtin, packed)):
        sym.save(str(folder / f"{name}-symbol.json"))
        mx.nd.save(str(folder / f"{name}-0000.params"), {"arg:weight": mx.nd.array(value)})
        paths.append(folder / f"{name}-symbol.json")
    return paths, rng.normal(size=shape).astype(np.float32), weight, shape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--size", type=int, default=16, help="height and width of the map")
    parser.add_argument("--capsules", type=int, default=8, help="input and output capsules")
    parser.add_argument("--devices", default="cpu,intel")
    args = parser.parse_args()
    options = BuildOptions(check_on=None, tuning=None, layout="NCHW")
    with tempfile.TemporaryDirectory(prefix="edgecv-custom-ops-") as tmp:
        folder = Path(tmp)
        c = args.capsules
        symbols, x, weight, shape = export_pair(folder, c, c, 4, args.size)
        expected = my_ops.capsule_reference(x, weight, stride=1, pad=1)
        print(f"capsule conv 3x3, {c} -> {c} capsules of 4x4 poses, {args.size}x{args.size}")
        for device in args.devices.split(","):
            profile, on = PROFILES[device]
            times = {}
            for symbol in symbols:
                package = deploy(
                    str(symbol),
                    folder / f"{symbol.stem}-{device}",
                    profile,
                    input_shape=shape,
                    options=options,
                )
                model = edgecv.load(package, on=on)
                assert_close(model.run(x)[0], expected, f"{symbol.stem} on {device}")
                times[symbol.stem] = median_time(lambda m=model: m.run(x), args.repeat)
            ratio = times["registered-symbol"] / times["builtin-symbol"]
            print(
                f"{device:6s} registered {times['registered-symbol'] * 1e3:8.3f} ms   "
                f"built-in {times['builtin-symbol'] * 1e3:8.3f} ms   "
                f"ratio {ratio:.2f}x"
            )


if __name__ == "__main__":
    main()
