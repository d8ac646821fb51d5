"""``check_op``: a registered operator deployed alone on each local device, as a user's
test would, against its NumPy reference."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .tolerances import assert_close


def check_op(
    name: str,
    shapes: Sequence[tuple[int, ...]],
    attrs: dict | None = None,
    devices: Sequence[str] | None = None,
    seed: int = 0,
    loosen: float = 1.0,
) -> dict[str, float]:
    """Check the operator registered as ``name`` (:func:`edgecv.register_op`) against its
    NumPy reference on random inputs, compiled alone on each device as a deploy would.

    Each device gets a one-node model of the op (a ``Custom`` node with ``op_type`` =
    ``name``), deployed through the whole pipeline (import, fusion, the schedule stage,
    code, package), loaded and run on normal random float32 inputs; its output must
    match ``reference(*inputs, **attrs)`` per :data:`TOLERANCES`.

    Parameters
    ----------
    name : str
        The registered operator; it must have a ``reference``.
    shapes : sequence of tuple
        The shape of each input, in the order ``compute`` takes them (weights too).
    attrs : dict, optional
        The node's attributes, as the compute function and the reference receive them.
    devices : sequence of str, optional
        ``cpu`` and OpenCL device queries (``intel``, ``pocl``; see ``edgecv devices``);
        by default ``cpu`` and every OpenCL device found but simulators. An OpenCL device
        with Intel subgroups is built for the ``deeplens`` profile, another for ``aisage``
        (with this machine's CPU as host), the boards they stand in for.
    seed : int
        Seed of the random inputs.
    loosen : float
        Multiplies the tolerances (say why when passing more than 1: a long reduction).

    Returns
    -------
    dict
        Device -> largest absolute difference from the reference.
    """
    from edgecv.board.model import load
    from edgecv.board.runtime.opencl_devices import opencl_devices
    from edgecv.board.runtime.opencl_program import is_simulator
    from edgecv.deploy import deploy
    from edgecv.op_registry import RegistrationError, registered_op
    from edgecv.pipelines import BuildOptions

    op = registered_op(name)
    if op is None or op.reference is None:
        why = "is not registered" if op is None else "has no reference"
        raise RegistrationError(
            f"check_op: operator `{name}` {why}; register it with "
            "edgecv.register_op(name, compute, shape=..., reference=numpy_function)"
        )
    attrs = dict(attrs or {})
    rng = np.random.RandomState(seed)
    inputs = [rng.normal(size=tuple(s)).astype(np.float32) for s in shapes]
    expected = np.asarray(op.reference(*inputs, **attrs))
    found = {d.platform: d for d in opencl_devices()}
    if devices is None:  # a simulator (Oclgrind) checks races, at minutes per kernel
        devices = ["cpu", *(p for p in found if not is_simulator(p))]
    errors: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="edgecv-check-op-") as tmp:
        symbol = Path(tmp) / f"{name}-symbol.json"
        symbol.write_text(_one_node_symbol(name, len(inputs), attrs))
        shape_of = {f"in{i}": tuple(x.shape) for i, x in enumerate(inputs)}
        for device in devices:
            if device == "cpu":
                profile, host, on = "cpu", None, None
            else:
                match = [d for d in found.values() if d.matches(device)]
                if not match:
                    raise RegistrationError(
                        f"check_op: no OpenCL device matches {device!r}; found: "
                        f"{', '.join(found) or 'none'}"
                    )
                intel = match[0].intel_subgroups
                profile, host = ("deeplens", None) if intel else ("aisage", "native")
                on = device
            options = BuildOptions(check_on=None, tuning=None, layout="NCHW")
            package = deploy(
                str(symbol),
                Path(tmp) / f"pkg-{len(errors)}",
                profile,
                input_shape=shape_of,
                host=host,
                options=options,
            )
            (actual,) = load(package, on=on).run(*inputs)
            assert_close(actual, expected, f"{name} on {device}", loosen=loosen)
            errors[device] = float(np.abs(actual.astype(np.float64) - expected).max())
    return errors


def _one_node_symbol(name: str, inputs: int, attrs: dict) -> str:
    """MXNet symbol JSON of one ``Custom`` node of ``op_type`` ``name`` on inputs
    ``in0..inN-1``, its attributes written as MXNet writes them (strings)."""
    nodes = [{"op": "null", "name": f"in{i}", "inputs": []} for i in range(inputs)]
    custom = {"op_type": name, **{k: str(v) for k, v in attrs.items()}}
    nodes.append(
        {
            "op": "Custom",
            "name": name,
            "attrs": custom,
            "inputs": [[i, 0, 0] for i in range(inputs)],
        }
    )
    return json.dumps(
        {
            "nodes": nodes,
            "arg_nodes": list(range(inputs)),
            "node_row_ptr": list(range(inputs + 2)),
            "heads": [[inputs, 0, 0]],
            "attrs": {"mxnet_version": ["int", 10901]},
        }
    )
