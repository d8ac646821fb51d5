"""GluonCV model-zoo names -> exported MXNet graphs (``*-symbol.json`` + ``*.params``).

Weights come, in order of preference, from a local ``.params`` file the user gives
(saved with ``net.save_parameters``, as GluonCV's pretrained files are), from the
GluonCV model store when it can be reached (or is already in its local cache), or
else from a seeded random initialization, announced with a loud warning: such a
model computes the right *function* of the wrong weights, which is what parity
tests need and what a demo must never pretend is a trained model.

The seven models of ``data/zoo.json`` have short aliases; every other name of
``gluoncv.model_zoo.get_model_list()`` resolves through the family rules of
``data/zoo_families.json`` (task and input shapes), except the families marked
``skip`` there (video/action recognition).
"""

from __future__ import annotations

import json
import logging
import re
import socket
import warnings
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..._mxnet import import_gluoncv, import_mxnet
from ...board.errors import ModelNotFoundError, ParamsError, foreign_message
from .mxnet_graph import check_params_file
from .random_weights import MEAN_RGB, STD_RGB, random_init

log = logging.getLogger(__name__)

__all__ = ["MEAN_RGB", "STD_RGB", "ExportedModel", "ZooModel", "export", "resolve"]

# Class names given to the `*_custom` detectors, which GluonCV builds only with a list.
CUSTOM_CLASSES = ["person", "car", "bicycle", "dog"]


@dataclass(frozen=True)
class ZooModel:
    """A model the zoo knows: its canonical GluonCV name and how it is used."""

    name: str
    task: str  # "classification" | "detection" | "segmentation" | "pose" | ...
    input_size: int
    aliases: tuple[str, ...]
    labels: str
    family: str = ""
    inputs: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (name, shape) when not one "data"

    @property
    def default_shape(self) -> tuple[int, int, int, int]:
        return (1, 3, self.input_size, self.input_size)

    @property
    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        """Each input's default shape, by the name the exported graph gives it."""
        return dict(self.inputs) if self.inputs else {"data": self.default_shape}


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
    # every input by its graph name; {"data": input_shape} for single-input models
    input_shapes: dict[str, tuple[int, ...]] | None = None

    @property
    def graph_inputs(self) -> dict[str, tuple[int, ...]]:
        """Each graph input's shape by name (``data``; ``data0``, ``data1``, ... for a
        net with several inputs, as ``HybridBlock.export`` names them)."""
        return dict(self.input_shapes) if self.input_shapes else {"data": self.input_shape}


def zoo_models() -> dict[str, ZooModel]:
    """The models edgecv resolves by name, keyed by canonical GluonCV name."""
    raw = json.loads(resources.files("edgecv.data").joinpath("zoo.json").read_text())
    return {
        name: ZooModel(name, e["task"], e["input_size"], tuple(e["aliases"]), e["labels"])
        for name, e in raw.items()
    }


@dataclass(frozen=True)
class FamilyRule:
    """One rule of ``data/zoo_families.json``."""

    pattern: str
    family: str
    task: str
    inputs: dict
    skip: str | None = None


def family_rules() -> list[FamilyRule]:
    raw = json.loads(resources.files("edgecv.data").joinpath("zoo_families.json").read_text())
    return [FamilyRule(**rule) for rule in raw["rules"]]


def family_of(name: str) -> FamilyRule:
    """The first rule of ``data/zoo_families.json`` whose pattern matches ``name``."""
    for rule in family_rules():
        if re.search(rule.pattern, name):
            return rule
    raise ModelNotFoundError(f"no family rule matches `{name}` in zoo_families.json")


def gluoncv_names() -> list[str]:
    """Every name of ``gluoncv.model_zoo.get_model_list()``."""
    return list(import_gluoncv().model_zoo.get_model_list())


def resolve(name: str) -> ZooModel:
    """Resolve a zoo name or short alias (``ssd_mobilenet``) to its :class:`ZooModel`.

    Names of the seven tuned models and their aliases come from ``data/zoo.json``; any
    other GluonCV zoo name gets its family's task and input shapes.
    """
    models = zoo_models()
    if name in models:
        return models[name]
    for model in models.values():
        if name in model.aliases:
            return model
    if name in gluoncv_names():
        rule = family_of(name)
        if rule.skip:
            raise ModelNotFoundError(f"`{name}` is a {rule.family} model: {rule.skip}")
        inputs = tuple((n, tuple(s)) for n, s in rule.inputs.items())
        size = inputs[0][1][-1] if inputs else 224
        # CIFAR classifiers have 10 classes, not ImageNet's 1000; detectors carry theirs
        imagenet = rule.task == "classification" and not name.startswith("cifar_")
        labels = "imagenet" if imagenet else "net"
        return ZooModel(name, rule.task, size, (), labels, rule.family, inputs)
    known = ", ".join(f"{m.name} ({'/'.join(m.aliases)})" for m in models.values())
    raise ModelNotFoundError(
        f"unknown model `{name}`: not a GluonCV zoo name, alias or path to a `*-symbol.json` "
        f"file. Aliases: {known}; every name of gluoncv.model_zoo.get_model_list() except "
        "video/action models is accepted."
    )


def build_net(model: ZooModel):
    """Construct the GluonCV network of ``model`` offline (no weights loaded).

    Backbone downloads are switched off (``pretrained_base=False``) where the model
    accepts it, and the ``*_custom`` detectors, which need class names, get
    :data:`CUSTOM_CLASSES`.
    """
    gcv = import_gluoncv()
    kwargs: dict = {"pretrained_base": False}
    if "custom" in model.name:
        kwargs["classes"] = CUSTOM_CLASSES
    try:
        return gcv.model_zoo.get_model(model.name, pretrained=False, **kwargs)
    except TypeError as err:
        if "pretrained_base" not in str(err):
            raise
    except Warning as err:  # darknet53 raises Warning on a keyword it does not take
        if "kwargs" not in str(err):
            raise
    # classifiers pass unknown keywords down to a Block, which rejects them
    kwargs.pop("pretrained_base")
    return gcv.model_zoo.get_model(model.name, pretrained=False, **kwargs)


def input_shapes_of(model: ZooModel, net, input_shape: tuple[int, ...] | None):
    """The shapes to export ``net`` with: ``input_shape`` for a one-input model if given,
    else the family default; segmentation nets resize to their crop size inside the
    graph, so their input must be that size."""
    shapes = model.input_shapes
    if isinstance(input_shape, dict):
        names = list(graph_input_names(shapes))
        if sorted(input_shape) != sorted(names):
            raise ModelNotFoundError(
                f"{model.name} takes the inputs {', '.join(names)}; --input-shape named "
                f"{', '.join(input_shape)}"
            )
        return {k: tuple(input_shape[n]) for k, n in zip(shapes, names, strict=True)}
    if input_shape is not None:
        if len(shapes) != 1:
            raise ModelNotFoundError(
                f"{model.name} has {len(shapes)} inputs ({', '.join(graph_input_names(shapes))});"
                f" one --input-shape {tuple(input_shape)} cannot describe them: give "
                "NAME=N,C,H,W for each"
            )
        return {next(iter(shapes)): tuple(input_shape)}
    crop = getattr(net, "crop_size", None)
    if model.task == "segmentation" and isinstance(crop, int):
        ((name, shape),) = shapes.items()
        return {name: (*shape[:2], crop, crop)}
    return shapes


def _labels(model: ZooModel, net) -> list[str]:
    if model.labels == "imagenet":
        from gluoncv.data.imagenet.classification import ImageNet1kAttr

        return list(ImageNet1kAttr().classes)
    classes = getattr(net, "classes", None)
    # some nets (Fast-SCNN) expose `classes` as a class-level property object, not a list
    if not isinstance(classes, (list, tuple)) or not all(isinstance(c, str) for c in classes):
        return []
    return list(classes)


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
    calibrate: bool = True,
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
    calibrate : bool
        Calibrate random weights on a photo (see :mod:`.random_weights`); an import-only
        check can skip it.
    """
    model = resolve(name)
    mx = import_mxnet()
    net = build_net(model)
    shapes = input_shapes_of(model, net, input_shape)
    if params_file is not None:
        path = Path(params_file)
        if not path.is_file():
            raise ParamsError(f"params file {path} does not exist")
        check_params_file(path)  # a damaged file: refused before MXNet allocates for it
        try:
            net.load_parameters(str(path))
        except mx.base.MXNetError as err:  # MXNet could not read the file at all
            raise ParamsError(
                f"cannot read params file {path}: {foreign_message(err)} (truncated, or not an "
                "MXNet .params file written by `net.save_parameters()`)"
            ) from None
        except Exception as err:  # Gluon: names or shapes of another network
            raise ParamsError(
                f"{path} does not hold weights for {model.name}: {foreign_message(err, 300)} "
                "Expected a file written by `net.save_parameters()` for this model."
            ) from None
        weights = "params-file"
    elif pretrained and _try_pretrained(model, net, download_timeout_s):
        weights = "pretrained"
    else:
        random_init(net, seed, list(shapes.values()), calibrate=calibrate)
        weights = f"random(seed={seed})"
        warnings.warn(
            f"\n*** {model.name}: using RANDOM weights (seed {seed}): no --params file was given "
            f"and the GluonCV model store {'was not asked' if not pretrained else 'is unreachable'}"
            ". Outputs are meaningless for real images; pass --params FILE with trained "
            "weights. ***",
            stacklevel=2,
        )
    net.hybridize()
    net(*[mx.nd.zeros(s) for s in shapes.values()])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prefix = out / model.name
    net.export(str(prefix), epoch=0)
    return ExportedModel(
        name=model.name,
        task=model.task,
        symbol_path=Path(f"{prefix}-symbol.json"),
        params_path=Path(f"{prefix}-0000.params"),
        input_shape=next(iter(shapes.values())),
        classes=_labels(model, net),
        weights=weights,
        input_shapes=graph_input_names(shapes),
    )


def graph_input_names(shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    # HybridBlock.export names one input "data" and several "data0", "data1", ...
    if len(shapes) == 1:
        return {"data": next(iter(shapes.values()))}
    return {f"data{i}": s for i, s in enumerate(shapes.values())}
