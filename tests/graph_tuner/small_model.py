"""A small MXNet model with every kind of node the graph tuner handles: a first conv on
3 channels, a residual add, a depthwise conv, a LeakyReLU (rewritten to stay packed),
a concat of a packable and an unpackable branch (4 channels), pooling and a dense head.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgecv._mxnet import import_mxnet

SHAPE = (1, 3, 12, 12)


def export_small_model(prefix: Path, seed: int = 0) -> tuple[Path, Path]:
    """Export the model with seeded random weights; returns (symbol, params)."""
    mx = import_mxnet()
    nn = mx.gluon.nn

    class Small(mx.gluon.HybridBlock):
        def __init__(self):
            super().__init__()
            with self.name_scope():
                self.a = nn.Conv2D(16, 3, padding=1, use_bias=False)
                self.a_bn = nn.BatchNorm()
                self.b = nn.Conv2D(16, 3, padding=1)
                self.dw = nn.Conv2D(16, 3, padding=1, groups=16, use_bias=False)
                self.c = nn.Conv2D(16, 1)
                self.d = nn.Conv2D(4, 3, padding=1, strides=1)
                self.dense = nn.Dense(5)

        def hybrid_forward(self, F, x):
            a = F.relu(self.a_bn(self.a(x)))
            x = F.relu(self.b(a) + a)
            x = F.LeakyReLU(self.dw(x), slope=0.1)
            x = F.concat(self.c(x), self.d(x), dim=1)
            x = F.Pooling(x, kernel=(2, 2), stride=(2, 2), pool_type="max")
            x = F.Pooling(x, global_pool=True, pool_type="avg", kernel=(1, 1))
            return self.dense(F.flatten(x))

    mx.random.seed(seed)
    net = Small()
    net.initialize(mx.init.Xavier(magnitude=2.0))
    net.hybridize()
    net(mx.nd.array(np.zeros(SHAPE, np.float32)))  # shapes known: BatchNorm stats can be set
    for name, param in net.collect_params().items():
        if name.endswith(("running_mean", "running_var", "gamma", "beta")):
            rng = np.random.RandomState(seed)
            low = 0.5 if name.endswith(("running_var", "gamma")) else -0.5
            param.set_data(mx.nd.array(rng.uniform(low, 1.0, param.shape)))
    net(mx.nd.array(np.zeros(SHAPE, np.float32)))
    prefix.parent.mkdir(parents=True, exist_ok=True)
    net.export(str(prefix))
    return Path(f"{prefix}-symbol.json"), Path(f"{prefix}-0000.params")
