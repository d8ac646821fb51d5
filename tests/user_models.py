"""Small Gluon models of the kinds users bring (not in the zoo), built and exported here.

- :func:`tiny_yolo`: a YOLOv3-tiny-like detector: 3x3 convs + LeakyReLU, 2x2/2 max pools,
  an edge-mode ``Pad`` followed by a 2x2 stride-1 max pool (darknet's last pool), a
  nearest 2x ``UpSampling`` joined to an earlier map by ``Concat``, a head decoded to
  boxes and a per-class ``box_nms``.
- :func:`efficient_lite`: an EfficientNet-Lite-like classifier: 3x3 and 5x5 depthwise
  convs after asymmetric zero ``Pad`` (TensorFlow's "same" padding at stride 2),
  ``clip(0, 6)``, residual adds, global pooling and a dense head.

Weights are seeded random; the spatial sizes are small so a deploy stays fast.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgecv._mxnet import import_mxnet


def _export(net, shape: tuple[int, ...], prefix: Path, seed: int) -> tuple[Path, Path]:
    mx = import_mxnet()
    mx.random.seed(seed)
    np.random.seed(seed)
    net.initialize(mx.init.Xavier(magnitude=2.0))
    net.hybridize()
    net(mx.nd.array(np.random.RandomState(seed).normal(size=shape).astype(np.float32)))
    prefix.parent.mkdir(parents=True, exist_ok=True)
    net.export(str(prefix))
    return Path(f"{prefix}-symbol.json"), Path(f"{prefix}-0000.params")


def tiny_yolo(prefix: Path, size: int = 96, classes: int = 3, seed: int = 0):
    """Export the YOLOv3-tiny-like detector; returns (symbol, params, input shape)."""
    mx = import_mxnet()
    nn = mx.gluon.nn

    def conv(channels, kernel=3):
        block = nn.HybridSequential()
        block.add(nn.Conv2D(channels, kernel, padding=kernel // 2, use_bias=False))
        block.add(nn.BatchNorm())
        block.add(nn.LeakyReLU(0.1))
        return block

    class TinyYolo(mx.gluon.HybridBlock):
        def __init__(self):
            super().__init__()
            with self.name_scope():
                self.c1, self.c2, self.c3 = conv(8), conv(16), conv(32)
                self.c4, self.c5 = conv(32), conv(16, 1)
                self.c6 = conv(16)
                self.head = nn.Conv2D(5 + classes, 1)

        def hybrid_forward(self, F, x):
            x = F.Pooling(self.c1(x), kernel=(2, 2), stride=(2, 2), pool_type="max")
            x = F.Pooling(self.c2(x), kernel=(2, 2), stride=(2, 2), pool_type="max")
            route = self.c3(x)
            x = F.Pooling(route, kernel=(2, 2), stride=(2, 2), pool_type="max")
            # darknet's stride-1 pool keeps the size: pad one row/column by the edge
            x = F.pad(x, mode="edge", pad_width=(0, 0, 0, 0, 0, 1, 0, 1))
            x = F.Pooling(x, kernel=(2, 2), stride=(1, 1), pool_type="max")
            x = self.c5(self.c4(x))
            x = F.UpSampling(x, scale=2, sample_type="nearest")
            x = self.c6(F.concat(x, route, dim=1))
            y = self.head(x)  # (1, 5 + C, h, w)
            y = F.reshape(F.transpose(y, axes=(0, 2, 3, 1)), shape=(0, -1, 5 + classes))
            xy = F.sigmoid(F.slice_axis(y, axis=-1, begin=0, end=2)) * 10.0
            wh = F.exp(F.clip(F.slice_axis(y, axis=-1, begin=2, end=4), -2, 2)) * 4.0
            obj = F.sigmoid(F.slice_axis(y, axis=-1, begin=4, end=5))
            cls = F.softmax(F.slice_axis(y, axis=-1, begin=5, end=None), axis=-1)
            score = F.max(F.broadcast_mul(cls, obj), axis=-1, keepdims=True)
            cid = F.topk(cls, axis=-1, k=1, ret_typ="indices")  # float ids, as MXNet gives
            boxes = F.concat(xy - wh / 2, xy + wh / 2, dim=-1)
            dets = F.concat(cid, score, boxes, dim=-1)
            return F.contrib.box_nms(
                dets,
                overlap_thresh=0.45,
                valid_thresh=0.01,
                topk=50,
                coord_start=2,
                score_index=1,
                id_index=0,
                force_suppress=False,
            )

    shape = (1, 3, size, size)
    symbol, params = _export(TinyYolo(), shape, prefix, seed)
    return symbol, params, shape


def efficient_lite(prefix: Path, size: int = 64, classes: int = 10, seed: int = 0):
    """Export the EfficientNet-Lite-like classifier; returns (symbol, params, shape)."""
    mx = import_mxnet()
    nn = mx.gluon.nn

    class MBConv(mx.gluon.HybridBlock):
        def __init__(self, cin, cout, kernel, stride, expand):
            super().__init__()
            self.kernel, self.stride = kernel, stride
            self.residual = stride == 1 and cin == cout
            mid = cin * expand
            with self.name_scope():
                self.expand = nn.Conv2D(mid, 1, use_bias=False)
                self.bn1 = nn.BatchNorm()
                self.dw = nn.Conv2D(mid, kernel, strides=stride, groups=mid, use_bias=False)
                self.bn2 = nn.BatchNorm()
                self.project = nn.Conv2D(cout, 1, use_bias=False)
                self.bn3 = nn.BatchNorm()

        def hybrid_forward(self, F, x):
            y = F.clip(self.bn1(self.expand(x)), 0, 6)
            total = self.kernel - 1 if self.stride == 1 else self.kernel - 2
            before, after = total // 2, total - total // 2  # TF "same": more after
            y = F.pad(
                y,
                mode="constant",
                constant_value=0,
                pad_width=(0, 0, 0, 0, before, after, before, after),
            )
            y = F.clip(self.bn2(self.dw(y)), 0, 6)
            y = self.bn3(self.project(y))
            return y + x if self.residual else y

    class Lite(mx.gluon.HybridBlock):
        def __init__(self):
            super().__init__()
            with self.name_scope():
                self.stem = nn.Conv2D(16, 3, strides=2, padding=1, use_bias=False)
                self.bn = nn.BatchNorm()
                self.blocks = nn.HybridSequential()
                self.blocks.add(
                    MBConv(16, 16, 3, 1, 1),
                    MBConv(16, 24, 3, 2, 4),
                    MBConv(24, 24, 5, 1, 4),
                    MBConv(24, 40, 5, 2, 4),
                    MBConv(40, 40, 5, 1, 4),
                )
                self.head = nn.Dense(classes)

        def hybrid_forward(self, F, x):
            x = F.clip(self.bn(self.stem(x)), 0, 6)
            x = self.blocks(x)
            return self.head(F.Pooling(x, global_pool=True, pool_type="avg", kernel=(1, 1)))

    shape = (1, 3, size, size)
    symbol, params = _export(Lite(), shape, prefix, seed)
    return symbol, params, shape
