"""A small classifier trained here, in seconds, on data that ships in a package: the
handwritten digits of scikit-learn (1797 images of 8x8, ten classes), upscaled to 32x32.

It is what INT8 is measured on where accuracy means something: a model with random
weights has no accuracy to keep. The network has the layers INT8 quantizes, in the
arrangements it must handle: a first convolution on a signed input, BatchNorm and ReLU
after every convolution, a depthwise and a 1x1 convolution, a residual block (a tensor
read by a convolution and by the add), pooling between, a dense head.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgecv._mxnet import import_mxnet

SIZE = 32


@dataclass
class Digits:
    symbol: Path
    params: Path
    input_shape: tuple[int, ...]
    x_train: np.ndarray  # N x 1 x 32 x 32 float32, preprocessed (in [-1, 1])
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def digits_data(seed: int = 0):
    """(x_train, y_train, x_test, y_test): 80/20 split, images in [-1, 1]."""
    import cv2
    from sklearn.datasets import load_digits

    digits = load_digits()
    small = digits.images.astype(np.float32) / 16.0
    linear = cv2.INTER_LINEAR
    images = np.stack([cv2.resize(im, (SIZE, SIZE), interpolation=linear) for im in small])
    x = ((images - 0.5) / 0.5)[:, None].astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.RandomState(seed).permutation(len(x))
    split = int(0.8 * len(x))
    train, test = order[:split], order[split:]
    return x[train], y[train], x[test], y[test]


def train_digits(
    prefix: Path, epochs: int = 6, seed: int = 0, width: int = 16, learning_rate: float = 0.01
) -> Digits:
    """Train the network on the digits and export it (``prefix-symbol.json``)."""
    mx = import_mxnet()
    nn = mx.gluon.nn
    mx.random.seed(seed)
    np.random.seed(seed)
    x_train, y_train, x_test, y_test = digits_data(seed)

    def conv(channels, kernel=3, groups=1, relu=True):
        block = nn.HybridSequential()
        block.add(nn.Conv2D(channels, kernel, padding=kernel // 2, groups=groups, use_bias=False))
        block.add(nn.BatchNorm())
        if relu:
            block.add(nn.Activation("relu"))
        return block

    class Net(mx.gluon.HybridBlock):
        def __init__(self):
            super().__init__()
            with self.name_scope():
                self.stem = conv(width)
                self.depthwise = conv(width, groups=width)
                self.pointwise = conv(2 * width, kernel=1)
                self.res1 = conv(2 * width)
                self.res2 = conv(2 * width, relu=False)
                self.head = nn.Dense(10)

        def hybrid_forward(self, F, x):
            x = F.Pooling(self.stem(x), kernel=(2, 2), stride=(2, 2), pool_type="max")
            x = self.pointwise(self.depthwise(x))
            x = F.Pooling(x, kernel=(2, 2), stride=(2, 2), pool_type="max")
            x = F.relu(x + self.res2(self.res1(x)))
            return self.head(F.Pooling(x, kernel=(1, 1), global_pool=True, pool_type="avg"))

    net = Net()
    net.initialize(mx.init.Xavier(magnitude=2.0))
    net.hybridize()
    steps = epochs * -(-len(x_train) // 64)
    schedule = mx.lr_scheduler.CosineScheduler(steps, base_lr=learning_rate, final_lr=0.0)
    settings = {"learning_rate": learning_rate, "lr_scheduler": schedule}
    trainer = mx.gluon.Trainer(net.collect_params(), "adam", settings)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.RandomState(seed)
    batch = 64
    for _ in range(epochs):
        order = rng.permutation(len(x_train))
        for start in range(0, len(order), batch):
            idx = order[start : start + batch]
            data, label = mx.nd.array(x_train[idx]), mx.nd.array(y_train[idx])
            with mx.autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            trainer.step(len(idx))
    prefix.parent.mkdir(parents=True, exist_ok=True)
    net.export(str(prefix))
    return Digits(
        Path(f"{prefix}-symbol.json"),
        Path(f"{prefix}-0000.params"),
        (1, 1, SIZE, SIZE),
        x_train,
        y_train,
        x_test,
        y_test,
    )


def accuracy(model, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """(top-1 accuracy in percent, the predicted classes) of a loaded package."""
    predicted = np.array([int(np.argmax(model.run(x[i : i + 1])[0])) for i in range(len(x))])
    return 100.0 * float(np.mean(predicted == y)), predicted
