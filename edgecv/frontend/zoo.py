"""GluonCV model-zoo names -> exported MXNet graphs (``*-symbol.json`` + ``*.params``).

Weights come, in order of preference, from a local ``.params`` file the user gives
(saved with ``net.save_parameters``, as GluonCV's pretrained files are), from the
GluonCV model store when it can be reached (or is already in its local cache), or
else from a seeded random initialization, announced with a loud warning: such a
model computes the right *function* of the wrong weights, which is what parity
tests need and what a demo must never pretend is a trained model.
"""

from __future__ import annotations

import json
import logging
import socket
import warnings
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from .._mxnet import import_gluoncv, import_mxnet
from ..errors import ModelNotFoundError, ParamsError

log = logging.getLogger(__name__)

# ImageNet preprocessing used by every GluonCV model: RGB in [0, 1], then normalized.
MEAN_RGB = (0.485, 0.456, 0.406)
STD_RGB = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ZooModel:
    """A model the zoo knows: its canonical GluonCV name and how it is used."""

    name: str
    task: str  # "classification" | "detection"
    input_size: int
    aliases: tuple[str, ...]
    labels: str

    @property
    def default_shape(self) -> tuple[int, int, int, int]:
        return (1, 3, self.input_size, self.input_size)


@dataclass
class ExportedModel:
    """An MXNet graph on disk and what edgecv needs to know to deploy it."""

    name: str
    task: str
    symbol_path: Path
    params_path: Path
    input_shape: tuple[int, ...]
    classes: list[str]
    weights: str  # "params-file" | "pretrained" | "random(seed=N)"


def zoo_models() -> dict[str, ZooModel]:
    """The models edgecv resolves by name, keyed by canonical GluonCV name."""
    raw = json.loads(resources.files("edgecv.data").joinpath("zoo.json").read_text())
    return {
        name: ZooModel(name, e["task"], e["input_size"], tuple(e["aliases"]), e["labels"])
        for name, e in raw.items()
    }


def resolve(name: str) -> ZooModel:
    """Resolve a zoo name or short alias (``ssd_mobilenet``) to its :class:`ZooModel`."""
    models = zoo_models()
    if name in models:
        return models[name]
    for model in models.values():
        if name in model.aliases:
            return model
    known = ", ".join(f"{m.name} ({'/'.join(m.aliases)})" for m in models.values())
    raise ModelNotFoundError(
        f"unknown model `{name}`: not a zoo name, alias or path to a `*-symbol.json` file. "
        f"Known models: {known}"
    )


def _random_init(net, seed: int, shape: tuple[int, ...]) -> None:
    """Seeded random weights that keep every layer's activations O(1).

    MXNet's default initializer makes a ResNet's logits ~1e-20 and a YOLO head's boxes
    ~1e13: useless for parity checks. Here convolution/dense weights are He-normal, and
    each BatchNorm's running statistics are set to the actual statistics of its input
    on one random image (a forward pass in training mode with momentum 0), so every BN
    outputs roughly N(beta, gamma^2) whatever the depth.
    """
    mx = import_mxnet()
    mx.random.seed(seed)
    rng = np.random.RandomState(seed)
    net.initialize(mx.init.Uniform(0.05), force_reinit=True)
    net(mx.nd.zeros(shape))  # finishes deferred initialization, so shapes are known
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
    batch_norms = []
    net.apply(lambda b: batch_norms.append(b) if isinstance(b, mx.gluon.nn.BatchNorm) else None)
    calibration = mx.nd.array(calibration_image(shape))

    # Gluon BN blocks: a pre-forward hook sets each one's running statistics to those of
    # the input it is about to normalize, so one inference pass calibrates them in order.
    def calibrate(block, inputs):
        x = inputs[0].asnumpy()
        axes = tuple(i for i in range(x.ndim) if i != 1)
        block.running_mean.set_data(mx.nd.array(x.mean(axis=axes)))
        block.running_var.set_data(mx.nd.array(_floored(x.var(axis=axes))))

    handles = [b.register_forward_pre_hook(calibrate) for b in batch_norms]
    net(calibration)
    for handle in handles:
        handle.detach()
    # BatchNorms written as symbols inside a SymbolBlock (SSD's feature expander) have no
    # hook: MXNet updates their statistics in the backward pass of a recorded training
    # step (a forward alone leaves them untouched), with momentum 0.9, so 30 steps.
    gluon_vars = {id(b.running_var) for b in batch_norms}
    symbolic = [
        p
        for n, p in net.collect_params().items()
        if n.endswith(("running_var", "moving_var")) and id(p) not in gluon_vars
    ]
    if symbolic:
        frozen = [(b, b._kwargs.get("use_global_stats", False)) for b in batch_norms]
        for block, _ in frozen:  # keep the hook-calibrated statistics as they are
            block._kwargs["use_global_stats"] = True
        for _ in range(30):
            with mx.autograd.record(train_mode=True):
                out = net(calibration)
                heads = [o for o in _flatten(out) if o.dtype == np.float32]
                loss = mx.nd.add_n(*[h.sum() for h in heads])
            loss.backward()
        for block, value in frozen:
            block._kwargs["use_global_stats"] = value
    for param in symbolic:
        param.set_data(mx.nd.array(_floored(param.data().asnumpy())))


def _floored(var: np.ndarray) -> np.ndarray:
    # On small feature maps (SSD's 2x2 and 1x1 layers) one image gives some channels a
    # near-zero variance, and BN would amplify them by 1/sqrt(eps): floor the variance at
    # half the layer's median, so no channel is boosted by more than sqrt(2).
    return np.maximum(var, max(0.5 * float(np.median(var)), 1e-3))


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


def _labels(model: ZooModel, net) -> list[str]:
    if model.labels == "imagenet":
        from gluoncv.data.imagenet.classification import ImageNet1kAttr

        return list(ImageNet1kAttr().classes)
    return list(getattr(net, "classes", []))


def _try_pretrained(model: ZooModel, net, timeout_s: float) -> bool:
    from gluoncv.model_zoo import model_store

    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(timeout_s)
    try:
        path = model_store.get_model_file(model.name)
        net.load_parameters(path)
        return True
    except Exception as err:  # no network, no cache, checksum mismatch: fall back
        log.info("pretrained weights for %s unavailable: %s", model.name, err)
        return False
    finally:
        socket.setdefaulttimeout(old)


def export(
    name: str,
    out_dir: str | Path,
    params_file: str | Path | None = None,
    input_shape: tuple[int, ...] | None = None,
    pretrained: bool = True,
    seed: int = 0,
    download_timeout_s: float = 10.0,
) -> ExportedModel:
    """Build a zoo model, load its weights, and export its graph to ``out_dir``.

    Parameters
    ----------
    name : str
        Zoo name or alias.
    out_dir : path
        Where ``<name>-symbol.json`` and ``<name>-0000.params`` are written.
    params_file : path, optional
        Weights saved with ``net.save_parameters`` (GluonCV's pretrained format).
    input_shape : tuple, optional
        NCHW input shape; the model's usual size by default.
    pretrained : bool
        Try the GluonCV model store (its cache, then the network) before random weights.
    seed : int
        Seed of the random weights when nothing else is available.
    """
    model = resolve(name)
    gcv = import_gluoncv()
    mx = import_mxnet()
    kwargs = {"pretrained_base": False} if model.task == "detection" else {}
    net = gcv.model_zoo.get_model(model.name, pretrained=False, **kwargs)
    if params_file is not None:
        path = Path(params_file)
        if not path.is_file():
            raise ParamsError(f"params file {path} does not exist")
        try:
            net.load_parameters(str(path))
        except Exception as err:
            detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ParamsError(
                f"{path} does not hold weights for {model.name}: {detail}. Expected a file "
                f"written by `net.save_parameters()` for this model."
            ) from None
        weights = "params-file"
    elif pretrained and _try_pretrained(model, net, download_timeout_s):
        weights = "pretrained"
    else:
        _random_init(net, seed, tuple(input_shape) if input_shape else model.default_shape)
        weights = f"random(seed={seed})"
        warnings.warn(
            f"\n*** {model.name}: using RANDOM weights (seed {seed}): no --params file was given "
            f"and the GluonCV model store {'was not asked' if not pretrained else 'is unreachable'}"
            ". Outputs are meaningless for real images; pass --params FILE with trained "
            "weights. ***",
            stacklevel=2,
        )
    shape = tuple(input_shape) if input_shape else model.default_shape
    net.hybridize()
    net(mx.nd.zeros(shape))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prefix = out / model.name
    net.export(str(prefix), epoch=0)
    return ExportedModel(
        name=model.name,
        task=model.task,
        symbol_path=Path(f"{prefix}-symbol.json"),
        params_path=Path(f"{prefix}-0000.params"),
        input_shape=shape,
        classes=_labels(model, net),
        weights=weights,
    )
