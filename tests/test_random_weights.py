"""Random weights' calibration: the closed form for symbolic BatchNorms gives what the
recorded training steps it stands for give."""

import numpy as np
import pytest

from edgecv._mxnet import import_mxnet
from edgecv.frontend.mxnet import random_weights

mx = import_mxnet()


def _symbolic_net():
    """Convolution, then two BatchNorms written as symbols (momentum 0.9 by default,
    then 0.5) inside a SymbolBlock, as SSD's feature extractor holds them."""
    data = mx.sym.var("data")
    y = mx.sym.Convolution(data, num_filter=8, kernel=(3, 3), pad=(1, 1), name="conv")
    y = mx.sym.BatchNorm(y, name="bn_a")
    y = mx.sym.Activation(y, act_type="relu")
    y = mx.sym.Convolution(y, num_filter=4, kernel=(1, 1), name="head")
    y = mx.sym.BatchNorm(y, momentum=0.5, name="bn_b")
    return mx.gluon.SymbolBlock(y, data)


def _statistics(net) -> dict[str, np.ndarray]:
    return {
        n: p.data().asnumpy()
        for n, p in net.collect_params().items()
        if n.endswith(("moving_mean", "moving_var"))
    }


def test_symbolic_batch_norms_get_the_statistics_of_thirty_training_steps():
    shape = (1, 3, 16, 16)
    net = _symbolic_net()
    random_weights.random_init(net, 3, [shape])
    got = _statistics(net)

    # the reference: the same seeded weights, statistics reset, thirty recorded steps
    reference = _symbolic_net()
    random_weights.random_init(reference, 3, [shape], calibrate=False)
    x = mx.nd.array(random_weights.example_input(shape, 3))
    for _ in range(random_weights.STEPS):
        with mx.autograd.record(train_mode=True):
            loss = reference(x).sum()
        loss.backward()
    want = _statistics(reference)
    assert (
        sorted(got)
        == sorted(want)
        == sorted(f"{bn}_{s}" for bn in ("bn_a", "bn_b") for s in ("moving_mean", "moving_var"))
    )
    for name in want:
        if name.endswith("var"):  # variances are floored at half their median
            floor = max(0.5 * float(np.median(want[name])), 1e-3)
            want[name] = np.maximum(want[name], floor)
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
    # the second BatchNorm's momentum (0.5) was read from its node: after thirty steps
    # its statistics are the batch's, not 0.9's blend with the initial ones
    assert random_weights._symbol_momenta(net)["bn_b_moving_var"] == pytest.approx(0.5)
