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
    mx = import_mxnet()
    mx.random.seed(seed)
    rng = np.random.RandomState(seed)
    # He-style scaling keeps activations O(1) through deep ReLU stacks, so outputs carry
    # signal a parity test can check (the default init makes ResNet outputs ~1e-20).
    net.initialize(
        mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2), force_reinit=True
    )
    net(mx.nd.zeros(shape))  # finishes deferred initialization, so shapes are known
    for pname, param in net.collect_params().items():
        shape = param.shape
        if pname.endswith("running_var"):
            param.set_data(mx.nd.array(rng.uniform(0.5, 1.5, shape)))
        elif pname.endswith("running_mean") or pname.endswith("beta"):
            param.set_data(mx.nd.array(rng.normal(0, 0.1, shape)))
        elif pname.endswith("gamma"):
            param.set_data(mx.nd.array(rng.uniform(0.5, 1.5, shape)))
        elif pname.endswith("bias"):
            param.set_data(mx.nd.array(rng.normal(0, 0.1, shape)))


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
