"""A layout plan applied to the Relax module: ``ConvertLayout`` with a per-call layout
callback, then redundant transform pairs removed.

Every convolution is given its layouts explicitly (plain ones too: a conv2d without a
desired layout would follow its input's packing with plain weights, which nothing
legalizes). Elementwise neighbours, pools and concatenations follow by Relax's own
rules, so they stay packed between packed convolutions; transforms appear only where
the plan changes layout. The packed convolutions are legalized later, in the fusion
passes, by :func:`~.legalize.legalize_map`.
"""

from __future__ import annotations

import tvm
from tvm import relax

from .extract import Extracted
from .fold import fold_constant_transforms
from .graph import block_of, is_packed

# operators with data/kernel layouts that no packed rule implements: they keep their
# own (plain) layouts, with a transform before them where their input is packed
KEPT_IN_THEIR_LAYOUT = (
    "relax.nn.conv2d_transpose",
    "relax.nn.conv1d",
    "relax.nn.conv1d_transpose",
    "relax.nn.conv3d",
)


def desired_layouts(call: relax.Call, layout: str) -> list[str]:
    """``[data, kernel, output]`` layouts of a conv2d ``call`` run in ``layout``."""
    if not is_packed(layout):
        return ["NCHW", "OIHW", "NCHW"]
    block = block_of(layout)
    channels = int(call.args[0].ty.shape[1])
    if int(call.attrs.groups) > 1:  # depthwise: one input channel per output channel
        return [layout, f"OIHW1i{block}o", layout]
    if channels % block:  # the first convolution: 3 input channels stay plain
        return ["NCHW", f"OIHW{block}o", layout]
    return [layout, f"OIHW{block}i{block}o", layout]


def convert_layouts(extracted: Extracted, layouts: dict[int, str]) -> tvm.IRModule:
    """``extracted.mod`` with each convolution node ``i`` in ``layouts[i]`` (plain when
    missing)."""
    wanted = {
        call.__chandle__(): desired_layouts(call, layouts.get(index, "NCHW"))
        for index, call in extracted.calls.items()
    }
    plain = ["NCHW", "OIHW", "NCHW"]
    conv2d = tvm.ir.Op.get("relax.nn.conv2d")

    def layout_cb(call: relax.Call) -> dict[str, list[str]]:
        if call.op.same_as(conv2d):
            return {"relax.nn.conv2d": wanted.get(call.__chandle__(), plain)}
        if isinstance(call.op, tvm.ir.Op) and call.op.name in KEPT_IN_THEIR_LAYOUT:
            # Relax would give it its packed input's layout, which its layout inference
            # cannot map onto its own 4-D attributes ("Layouts must have the same size")
            attrs = call.attrs
            return {call.op.name: [str(attrs.data_layout), str(attrs.kernel_layout)]}
        return {}

    passes = tvm.transform.Sequential(
        [
            relax.transform.ConvertLayout({}, layout_cb),
            relax.transform.Normalize(),
            tvm.ir.transform.module_pass(
                lambda mod, ctx: fold_constant_transforms(mod),
                opt_level=0,
                name="FoldConstantTransforms",
            ),
            relax.transform.OptimizeLayoutTransform(),
            relax.transform.DeadCodeElimination(["main"]),
        ]
    )
    return passes(extracted.mod)


def inserted_transforms(mod: tvm.IRModule) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The ``layout_transform`` calls of ``mod["main"]`` on tensors that are not
    constants (those fold away), as (input shape, output shape) pairs in order."""
    op = tvm.ir.Op.get("relax.layout_transform")
    found = []
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and value.op.same_as(op):
                if not isinstance(value.args[0], tvm.ir.expr.Constant):
                    shape_in = tuple(int(d) for d in value.args[0].ty.shape.values)
                    shape_out = tuple(int(d) for d in binding.var.ty.shape.values)
                    found.append((shape_in, shape_out))
    return found
