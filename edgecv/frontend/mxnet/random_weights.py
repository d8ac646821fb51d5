"""Seeded random weights for zoo models built offline (no pretrained weights reachable).

Such a model computes the right *function* of the wrong weights, which is what parity
tests need; the weights are scaled and the BatchNorm statistics calibrated on a real
photo so activations, scores and boxes stay in the ranges trained nets produce.
"""

from __future__ import annotations

import numpy as np

from ..._mxnet import import_mxnet

# ImageNet preprocessing used by every GluonCV model: RGB in [0, 1], then normalized.
MEAN_RGB = (0.485, 0.456, 0.406)
STD_RGB = (0.229, 0.224, 0.225)


def random_init(net, seed: int, shapes: list[tuple[int, ...]], calibrate: bool = True) -> None:
    """Seeded random weights that keep every layer's activations O(1).

    MXNet's default initializer makes a ResNet's logits ~1e-20 and a YOLO head's boxes
    ~1e13: useless for parity checks. Here convolution/dense weights are He-normal, and
    each BatchNorm's running statistics are set to the actual statistics of its input
    on one random image (a forward pass in training mode with momentum 0), so every BN
    outputs roughly N(beta, gamma^2) whatever the depth.

    Parameters
    ----------
    net : mxnet.gluon.HybridBlock
        The model, not yet hybridized.
    seed : int
        Seed of every random value.
    shapes : list of tuple
        The shape of each input of ``net``'s forward, in order.
    calibrate : bool
        Calibrate the BatchNorm statistics (two more forward passes). Without it the
        weights are still seeded and He-scaled, which is all an import needs.
    """
    mx = import_mxnet()
    mx.random.seed(seed)
    rng = np.random.RandomState(seed)
    net.initialize(mx.init.Uniform(0.05), force_reinit=True)
    # An imperative forward finishes deferred initialization, so every shape is known;
    # some zoo nets (monodepth2, custom_mask_rcnn_fpn) cannot infer their parameters'
    # shapes symbolically and fail "Deferred initialization failed" when hybridized first.
    net(*[mx.nd.zeros(s) for s in shapes])
    params = net.collect_params()
    for pname, param in params.items():
        if isinstance(param, mx.gluon.parameter.Constant):
            continue  # SSD/YOLO anchors and offsets are part of the model, not weights
        pshape = param.shape
        if pname.endswith(("weight", "alpha")) and len(pshape) >= 2:
            fan_in = int(np.prod(pshape[1:]))
            std = np.sqrt(2.0 / max(fan_in, 1))
            if pname.removesuffix("weight") + "bias" in params:
                # A layer with a bias has no BatchNorm after it: an output head (class
                # logits, box regressions). A tenth of He scale keeps those in the few-
                # unit range trained heads produce; at full scale YOLO's exp() box sizes
                # reach millions of pixels and its sigmoid scores saturate into ties.
                std *= 0.1
            value = rng.normal(0.0, std, pshape)
        elif pname.endswith("gamma"):
            value = rng.uniform(0.5, 1.5, pshape)
        elif pname.endswith("running_var"):
            value = np.ones(pshape)
        elif pname.endswith("running_mean"):
            value = np.zeros(pshape)
        else:  # beta, bias and anything else 1-D
            value = rng.normal(0.0, 0.1, pshape)
        param.set_data(mx.nd.array(value))
    if not calibrate:
        return
    batch_norms = []
    net.apply(lambda b: batch_norms.append(b) if isinstance(b, mx.gluon.nn.BatchNorm) else None)
    calibration = [mx.nd.array(example_input(s, seed)) for s in shapes]

    # Gluon BN blocks: a pre-forward hook sets each one's running statistics to those of
    # the input it is about to normalize, so one inference pass calibrates them in order.
    def calibrate(block, inputs):
        x = inputs[0].asnumpy()
        axes = tuple(i for i in range(x.ndim) if i != 1)
        block.running_mean.set_data(mx.nd.array(x.mean(axis=axes)))
        block.running_var.set_data(mx.nd.array(_floored(x.var(axis=axes))))

    handles = [b.register_forward_pre_hook(calibrate) for b in batch_norms]
    net(*calibration)
    for handle in handles:
        handle.detach()
    # BatchNorms written as symbols inside a SymbolBlock (SSD's backbone and feature
    # expander) have no hook: MXNet updates their statistics in the backward pass of a
    # recorded training step (a forward alone leaves them untouched), as
    # r <- m r + (1 - m) b with the batch statistics b and the node's momentum m. Every
    # step sees the same image and weights, so b is the same each step, and STEPS steps
    # leave m^STEPS r0 + (1 - m^STEPS) b: one step gives b, the rest is arithmetic (the
    # thirty steps it stands for were 95% of SSD-512 ResNet-50's 100-second export).
    hooked = {id(p) for b in batch_norms for p in (b.running_mean, b.running_var)}
    symbolic = {
        n: p
        for n, p in net.collect_params().items()
        if n.endswith(("running_mean", "running_var", "moving_mean", "moving_var"))
        and id(p) not in hooked
    }
    if symbolic:
        _step_symbolic_statistics(net, batch_norms, calibration, symbolic)
    for name, param in symbolic.items():
        if name.endswith(("running_var", "moving_var")):
            param.set_data(mx.nd.array(_floored(param.data().asnumpy())))


# The training steps the symbolic BatchNorms' statistics are computed for (see above).
STEPS = 30


def _step_symbolic_statistics(net, batch_norms, calibration, symbolic: dict) -> None:
    """Set the statistics ``symbolic`` (name -> parameter) to what STEPS recorded training
    steps on ``calibration`` leave (see :func:`random_init`)."""
    mx = import_mxnet()
    momenta = _symbol_momenta(net)
    before = {n: p.data().asnumpy().astype(np.float64) for n, p in symbolic.items()}
    frozen = [(b, b._kwargs.get("use_global_stats", False)) for b in batch_norms]
    for block, _ in frozen:  # keep the hook-calibrated statistics as they are
        block._kwargs["use_global_stats"] = True
    try:
        with mx.autograd.record(train_mode=True):
            out = net(*calibration)
            heads = [o for o in _flatten(out) if o.dtype == np.float32]
            loss = mx.nd.add_n(*[h.sum() for h in heads])
        loss.backward()
    except mx.base.MXNetError:
        # a net whose training forward needs labels (Faster R-CNN with FPN samples its
        # training targets from ground-truth boxes) keeps those statistics as
        # initialized: still seeded, only less well scaled
        return
    finally:
        for block, value in frozen:
            block._kwargs["use_global_stats"] = value
    for name, param in symbolic.items():
        m = momenta.get(name, DEFAULT_MOMENTUM)
        r0 = before[name]
        batch = (param.data().asnumpy().astype(np.float64) - m * r0) / (1.0 - m)
        kept = m**STEPS
        param.set_data(mx.nd.array((kept * r0 + (1.0 - kept) * batch).astype(np.float32)))


# MXNet's BatchNorm momentum when a node does not set one.
DEFAULT_MOMENTUM = 0.9


def _symbol_momenta(net) -> dict[str, float]:
    """Per running-statistics variable of ``net``'s SymbolBlocks, its BatchNorm's
    momentum."""
    import json

    mx = import_mxnet()
    blocks = []
    net.apply(lambda b: blocks.append(b) if isinstance(b, mx.gluon.SymbolBlock) else None)
    momenta = {}
    for block in blocks:
        nodes = json.loads(block._cached_graph[1].tojson())["nodes"]
        for node in nodes:
            if node["op"] != "BatchNorm":
                continue
            momentum = float(node.get("attrs", {}).get("momentum", DEFAULT_MOMENTUM))
            for index, *_ in node["inputs"][3:5]:  # moving_mean, moving_var
                momenta[nodes[index]["name"]] = momentum
    return momenta


def _floored(var: np.ndarray) -> np.ndarray:
    # On small feature maps (SSD's 2x2 and 1x1 layers) one image gives some channels a
    # near-zero variance, and BN would amplify them by 1/sqrt(eps): floor the variance at
    # half the layer's median, so no channel is boosted by more than sqrt(2).
    return np.maximum(var, max(0.5 * float(np.median(var)), 1e-3))


def example_input(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """An input of ``shape`` to calibrate random weights on: a photo where it can be.

    ``(N, 3k, H, W)`` inputs get :func:`calibration_image` (``k`` frames of it, for
    nets that take stacked frames); any other shape seeded standard-normal noise.
    """
    if len(shape) == 4 and shape[1] % 3 == 0 and shape[1] > 0:
        frame = calibration_image((shape[0], 3, shape[2], shape[3]))
        return np.ascontiguousarray(np.concatenate([frame] * (shape[1] // 3), axis=1))
    return np.random.RandomState(seed).standard_normal(shape).astype(np.float32)


def calibration_image(shape: tuple[int, ...]) -> np.ndarray:
    """A real photo (scikit-image's coffee cup), preprocessed to ``shape`` (N, 3, H, W).

    Random weights are calibrated on it rather than on noise: a network calibrated on
    i.i.d. noise sees very different activation statistics on any real image and
    outputs saturated scores and boxes millions of pixels wide.
    """
    import cv2
    import skimage.data

    rgb = cv2.resize(skimage.data.coffee(), (shape[3], shape[2]), interpolation=cv2.INTER_AREA)
    x = (rgb.astype(np.float32) / 255.0 - np.float32(MEAN_RGB)) / np.float32(STD_RGB)
    return np.ascontiguousarray(np.broadcast_to(x.transpose(2, 0, 1)[None], shape))


def _flatten(out) -> list:
    if isinstance(out, (list, tuple)):
        return [x for item in out for x in _flatten(item)]
    return [out]
