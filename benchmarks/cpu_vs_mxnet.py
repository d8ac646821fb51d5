"""edgecv CPU latency vs MXNet's, same machine, same process, same weights.

    python benchmarks/cpu_vs_mxnet.py                 # all seven models
    python benchmarks/cpu_vs_mxnet.py mobilenet ssd_mobilenet --repeat 20

Prints one row per model: median latency of each after warm-up and the ratio
(MXNet / edgecv: above 1 means edgecv is faster). Not a test: numbers vary with load.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import tvm

from edgecv._mxnet import import_mxnet
from edgecv.bench.harness import alternate
from edgecv.board.runtime.cpu import CPUBackend
from edgecv.board.runtime.executor import Executor
from edgecv.codegen.llvm import build_cpu
from edgecv.frontend.mxnet import zoo
from edgecv.frontend.mxnet.importer import from_mxnet
from edgecv.frontend.mxnet.mxnet_graph import load_params, load_symbol
from edgecv.frontend.mxnet.zoo import zoo_models
from edgecv.lowering import lower
from edgecv.profiles import load_profile

MODELS = list(zoo_models())  # the seven models with aliases (edgecv/data/zoo.json)


def bench(name: str, work: Path, repeat: int, schedule: bool) -> dict:
    mx = import_mxnet()
    exported = zoo.export(name, work / name, pretrained=False)
    x = np.random.RandomState(0).normal(size=exported.input_shape).astype(np.float32)
    t = time.perf_counter()
    imported = from_mxnet(
        load_symbol(exported.symbol_path),
        load_params(exported.params_path),
        {"data": exported.input_shape},
    )
    lowered = lower(imported.mod)
    lib = build_cpu(lowered.kernels, load_profile("cpu").tvm_target(), schedule=schedule)
    build_s = time.perf_counter() - t
    executor = Executor(lowered.plan, CPUBackend(lib), lowered.constants)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = mx.gluon.SymbolBlock.imports(
            str(exported.symbol_path), ["data"], str(exported.params_path)
        )
    net.hybridize(static_alloc=True, static_shape=True)
    xin = mx.nd.array(x)

    def mxnet_run():
        out = net(xin)
        for o in out if isinstance(out, (list, tuple)) else [out]:
            o.wait_to_read()

    # Alternating runs in one process (the shared harness): load drift hits both alike.
    timed = alternate({"edgecv": lambda: executor.run([x]), "mxnet": mxnet_run}, repeat, 2)
    ours, theirs = timed["edgecv"].median * 1e3, timed["mxnet"].median * 1e3
    return {
        "model": exported.name,
        "edgecv_ms": ours,
        "mxnet_ms": theirs,
        "launches": executor.num_launches,
        "build_s": build_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=MODELS)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--no-schedule", action="store_true", help="build kernels unscheduled")
    args = parser.parse_args()
    print(f"TVM threads: {tvm.runtime.num_threads()}  target: {load_profile('cpu').tvm_target()}")
    columns = (
        ("edgecv ms", 10),
        ("MXNet ms", 10),
        ("MXNet/edgecv", 13),
        ("launches", 9),
        ("build s", 8),
    )
    header = f"{'model':<28} " + " ".join(f"{c:>{w}}" for c, w in columns)
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            r = bench(zoo.resolve(name).name, Path(tmp), args.repeat, not args.no_schedule)
            print(
                f"{r['model']:<28} {r['edgecv_ms']:>10.1f} {r['mxnet_ms']:>10.1f} "
                f"{r['mxnet_ms'] / r['edgecv_ms']:>13.2f} {r['launches']:>9} {r['build_s']:>8.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
