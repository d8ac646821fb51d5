"""Relax rewrites of the forms TVM's ONNX converters write into those edgecv's pipeline
reads (the forms the MXNet converters emit), run once on the imported module."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, rewrite_call, wildcard


def normalize(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` in the forms the pipeline expects: ``nn.batch_norm`` (a triple whose
    statistics outputs inference never reads) decomposed into the per-channel subtract,
    divide, multiply and add that fuse into the convolution before it, as the MXNet
    importer writes ``BatchNorm``; the triple's ``[0]`` read straight from its first
    field (the graph tuner would otherwise see a tuple item, which keeps NCHW) and the
    rest dropped; a ``split`` into parts as one ``strided_slice`` per part
    (:func:`split_as_slices`)."""
    mod = tvm.transform.Sequential(
        [
            relax.transform.DecomposeOpsForInference(),
            relax.transform.CanonicalizeBindings(),
            relax.transform.DeadCodeElimination(),
        ]
    )(mod)
    return split_as_slices(mod)


def split_as_slices(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each ``split`` of ``main`` into static parts written as a tuple of
    ``strided_slice`` calls: Relax's layout conversion gives a channel ``split`` of a
    packed tensor parts of 0 channels and fails, and the graph tuner then built the whole
    model in NCHW (YOLOv8's and YOLO11's blocks split their channels in two); it maps a
    slice. Everything else unchanged."""

    def rewrite(call: relax.Call, _matches) -> relax.Expr:
        x = call.args[0]
        if x.ty.shape is None or not all(isinstance(d, tvm.tirx.IntImm) for d in x.ty.shape):
            return call
        shape = [int(d) for d in x.ty.shape]
        axis = int(call.attrs.axis) % len(shape)
        parts = call.attrs.indices_or_sections
        if isinstance(parts, (int, tvm.tirx.IntImm)):
            if shape[axis] % int(parts):
                return call
            step = shape[axis] // int(parts)
            bounds = [i * step for i in range(int(parts) + 1)]
        else:
            bounds = [0, *(int(i) for i in parts), shape[axis]]
        return relax.Tuple(
            [
                relax.op.strided_slice(x, [axis], [begin], [end])
                for begin, end in zip(bounds[:-1], bounds[1:], strict=True)
            ]
        )

    pattern = is_op("relax.split")(wildcard())
    main = rewrite_call(pattern, rewrite, mod["main"])
    if main.same_as(mod["main"]):
        return mod
    out = tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs)
    out["main"] = main
    return out
