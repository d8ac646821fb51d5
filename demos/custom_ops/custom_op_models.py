"""Small Gluon models that use the operators of ``my_ops.py`` as MXNet ``Custom`` ops.

MXNet runs a ``Custom`` op through Python (``mx.operator.CustomOp``), here the NumPy
references of ``my_ops.py``; exporting the hybridized model writes one ``Custom`` node
per use, with the ``op_type`` edgecv looks the registered operator up by. Weights are
seeded random; the sizes are tiny so a deploy stays fast.

    python demos/custom_ops/custom_op_models.py OUT_DIR   # exports the four models
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # my_ops, beside this file
import my_ops  # noqa: E402

from edgecv._mxnet import import_mxnet  # noqa: E402

mx = import_mxnet()
nn = mx.gluon.nn


def _custom(op_type: str, reference, inputs: list[str], shape_rule):
    """Register ``op_type`` with MXNet: forward by ``reference``, output shape by the
    same rule edgecv checks the compute against (inference only: no backward)."""

    class Op(mx.operator.CustomOp):
        def __init__(self, attrs):
            super().__init__()
            self.attrs = attrs

        def forward(self, is_train, req, in_data, out_data, aux):
            arrays = [x.asnumpy() for x in in_data]
            self.assign(out_data[0], req[0], mx.nd.array(reference(*arrays, **self.attrs)))

    class Prop(mx.operator.CustomOpProp):
        def __init__(self, **kwargs):
            super().__init__(need_top_grad=False)
            # Custom kwargs arrive as strings, as edgecv reads them from the symbol file
            self.attrs = {k: float(v) if "." in v else int(v) for k, v in kwargs.items()}

        def list_arguments(self):
            return inputs

        def infer_shape(self, in_shape):
            return in_shape, [shape_rule([tuple(s) for s in in_shape], self.attrs)], []

        def create_operator(self, ctx, shapes, dtypes):
            return Op(self.attrs)

    mx.operator.register(op_type)(Prop)


_custom("capsule_conv2d", my_ops.capsule_reference, ["data", "weight"], my_ops.capsule_shape)
_custom("dilated_depth_to_space", my_ops.d2s_reference, ["data"], my_ops.d2s_shape)
_custom("hard_swish", my_ops.hard_swish_reference, ["data"], lambda shapes, attrs: shapes[0])


class CapsuleConv(mx.gluon.HybridBlock):
    """Capsule convolution with its pose weights as a Gluon parameter."""

    op_type = "capsule_conv2d"  # what it exports as; register_op(CapsuleConv, ...) reads it

    def __init__(self, cin, cout, kernel=3, stride=1, pad=1, poses=4):
        super().__init__()
        self.stride, self.pad = stride, pad
        with self.name_scope():
            self.weight = self.params.get("weight", shape=(cout, cin, kernel, kernel, poses, poses))

    def hybrid_forward(self, F, x, weight):
        return F.Custom(x, weight, op_type=self.op_type, stride=self.stride, pad=self.pad)


class DilatedDepthToSpace(mx.gluon.HybridBlock):
    op_type = "dilated_depth_to_space"

    def __init__(self, block=2, dilation=2):
        super().__init__()
        self.block, self.dilation = block, dilation

    def hybrid_forward(self, F, x):
        return F.Custom(x, op_type=self.op_type, block=self.block, dilation=self.dilation)


class HardSwish(mx.gluon.HybridBlock):
    op_type = "hard_swish"

    def __init__(self, alpha=0.2, beta=0.5):
        super().__init__()
        self.alpha, self.beta = alpha, beta

    def hybrid_forward(self, F, x):
        return F.Custom(x, op_type=self.op_type, alpha=self.alpha, beta=self.beta)


class Mixed(mx.gluon.HybridBlock):
    """Built-in layers around all three operators: conv + BN + ReLU, capsules made of
    its channels, depth-to-space, hard-swish, a 1x1 conv head."""

    def __init__(self):
        super().__init__()
        with self.name_scope():
            self.stem = nn.HybridSequential()
            self.stem.add(nn.Conv2D(32, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"))
            self.caps = CapsuleConv(2, 2, kernel=3, stride=1, pad=1)
            self.d2s = DilatedDepthToSpace(block=2, dilation=2)
            self.act = HardSwish(alpha=1 / 6, beta=0.5)
            self.head = nn.Conv2D(4, 1)

    def hybrid_forward(self, F, x):
        y = self.stem(x)  # (1, 32, 8, 8) -> 2 capsules of 4x4 poses per pixel
        y = self.caps(F.reshape(y, shape=(0, 2, 4, 4, 8, 8)))
        y = F.reshape(y, shape=(0, 32, 8, 8))
        return self.head(self.act(self.d2s(y)))


def export(net, shape: tuple[int, ...], prefix: Path, seed: int = 0) -> tuple[Path, Path | None]:
    """Initialize ``net`` with seeded weights, run it once and export it; returns the
    symbol file and the params file (None for a model without weights: the empty file
    MXNet writes for it reads as an unnamed list, so it is removed)."""
    mx.random.seed(seed)
    net.initialize(mx.init.Xavier(magnitude=2.0))
    net.hybridize()
    net(mx.nd.array(np.random.RandomState(seed).normal(size=shape).astype(np.float32)))
    prefix.parent.mkdir(parents=True, exist_ok=True)
    net.export(str(prefix))
    params = Path(f"{prefix}-0000.params")
    if not list(net.collect_params().keys()):
        params.unlink()  # else a deploy finds it beside the symbol file and reads it
        params = None
    return Path(f"{prefix}-symbol.json"), params


# name -> (block factory, input shape): tiny, so a deploy takes seconds
MODELS = {
    "capsule": (lambda: CapsuleConv(2, 3, kernel=3, stride=1, pad=1), (1, 2, 4, 4, 6, 6)),
    "depth_to_space": (lambda: DilatedDepthToSpace(block=2, dilation=2), (1, 12, 4, 6)),
    "hard_swish": (lambda: HardSwish(alpha=0.2, beta=0.5), (1, 4, 5, 7)),
    "mixed": (Mixed, (1, 3, 8, 8)),
}


def export_model(name: str, folder: Path, seed: int = 0):
    """Export model ``name`` of :data:`MODELS` to ``folder``; returns (symbol, params,
    input shape)."""
    factory, shape = MODELS[name]
    symbol, params = export(factory(), shape, Path(folder) / name, seed)
    return symbol, params, shape


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "custom_op_models")
    for model in MODELS:
        print(*export_model(model, out)[:2])
