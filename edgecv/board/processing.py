"""What a model file does not carry: how an image becomes its input and how its outputs
become classes or boxes, typed, with presets, a JSON sidecar, flags, and the manifest's
``preprocessing`` / ``decoder`` / ``classes`` sections (this module writes and reads them).

A preset names a whole description (``imagenet``: GluonCV's, what every zoo package
has; ``torchvision``, ``torchvision-detection``, ``ultralytics``,
``ultralytics-nms``); a sidecar ``.json`` holds the same fields as the flags, and the
flags override single fields of either. Board side: Python 3.9, NumPy-free.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import EdgecvError, PackageError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
COLORS = ("RGB", "BGR")
RESIZES = ("stretch", "letterbox")
LAYOUTS = ("NCHW",)
# how outputs become results: top-k of logits (softmax) or of probabilities; GluonCV's
# (ids, scores, boxes); torchvision's (boxes, labels, scores); Ultralytics' raw head
# [1, 4+C, N] (NMS on the host) and its end-to-end head [1, N, 6]; `tensor`: none
DECODERS = (
    "logits",
    "probabilities",
    "gluoncv",
    "torchvision",
    "ultralytics",
    "ultralytics-nms",
    "tensor",
)
DETECTORS = ("gluoncv", "torchvision", "ultralytics", "ultralytics-nms")


@dataclass(frozen=True)
class Preprocessing:
    """image -> input tensor: resize (``stretch`` to the input size, or ``letterbox``:
    aspect kept, centred on ``pad`` grey), colour order, ``x * scale``, then
    ``(x - mean) / std`` per channel (in the model's colour order), as ``layout``."""

    color: str = "RGB"
    scale: float = 1.0 / 255.0
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    resize: str = "stretch"
    pad: float = 114.0  # letterbox's border, a pixel value (before scale)
    layout: str = "NCHW"

    def as_dict(self) -> dict[str, Any]:
        """The manifest's ``preprocessing`` section (what :func:`edgecv.board.imaging.preprocess`
        reads)."""
        out = dataclasses.asdict(self)
        out["mean"], out["std"] = list(self.mean), list(self.std)
        return out


@dataclass(frozen=True)
class Decoder:
    """outputs -> results: ``kind`` (one of :data:`DECODERS`); ``iou`` and
    ``confidence`` are the NMS overlap and the score threshold of ``ultralytics``."""

    kind: str = "logits"
    iou: float = 0.7
    confidence: float = 0.25

    @property
    def task(self) -> str:
        if self.kind in DETECTORS:
            return "detection"
        return "tensor" if self.kind == "tensor" else "classification"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Processing:
    """Both halves and the class names (``None``: the model source's own)."""

    preprocessing: Preprocessing
    decoder: Decoder
    classes: tuple[str, ...] | None = None


def coco80() -> tuple[str, ...]:
    """COCO's 80 detection classes, in the order Ultralytics' models number them."""
    text = (Path(__file__).parent / "coco80.txt").read_text(encoding="utf-8")
    return tuple(line.strip() for line in text.splitlines() if line.strip())


def preset(name: str) -> Processing:
    """The preset ``name`` (see :data:`PRESETS`)."""
    if name not in PRESETS:
        raise EdgecvError(
            f"unknown preprocessing preset `{name}`; use one of {', '.join(PRESETS)} or a "
            ".json file with the same fields"
        )
    if name == "imagenet":
        pre = Preprocessing(mean=IMAGENET_MEAN, std=IMAGENET_STD)
        return Processing(pre, Decoder("logits"))
    if name == "torchvision":
        pre = Preprocessing(mean=IMAGENET_MEAN, std=IMAGENET_STD)
        return Processing(pre, Decoder("logits"))
    if name == "torchvision-detection":  # normalized inside the graph
        return Processing(Preprocessing(), Decoder("torchvision"))
    kind = "ultralytics" if name == "ultralytics" else "ultralytics-nms"
    return Processing(Preprocessing(resize="letterbox", pad=114.0), Decoder(kind), coco80())


PRESETS = ("imagenet", "torchvision", "torchvision-detection", "ultralytics", "ultralytics-nms")

# the sidecar's fields (and the flags'): where each goes
_PRE_FIELDS = ("color", "scale", "mean", "std", "resize", "pad", "layout")
_DECODER_FIELDS = {"decoder": "kind", "iou": "iou", "confidence": "confidence"}
FIELDS = ("preset", *_PRE_FIELDS, *_DECODER_FIELDS, "classes")


def _number(value: Any, field: str, where: str) -> float:
    """``value`` as a finite float (``"1/255"`` too)."""
    if isinstance(value, str) and value.count("/") == 1:
        top, bottom = value.split("/")
        try:
            value = float(top) / float(bottom)
        except (ValueError, ZeroDivisionError):
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise EdgecvError(f"{where}: `{field}` should be a number, got {value!r:.60}")
    try:
        number = float(value)
    except ValueError:
        raise EdgecvError(f"{where}: `{field}` should be a number, got {value!r:.60}") from None
    if not math.isfinite(number):
        raise EdgecvError(f"{where}: `{field}` should be a finite number, got {value!r:.60}")
    return number


def _triple(value: Any, field: str, where: str) -> tuple[float, float, float]:
    """Three numbers, from a list or ``"R,G,B"``."""
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise EdgecvError(f"{where}: `{field}` should be 3 numbers (R, G, B), got {value!r:.60}")
    a, b, c = (_number(v, field, where) for v in value)
    return (a, b, c)


def _choice(value: Any, field: str, choices: tuple[str, ...], where: str) -> str:
    text = value.upper() if field in ("color", "layout") and isinstance(value, str) else value
    if text not in choices:
        raise EdgecvError(
            f"{where}: `{field}` should be one of {', '.join(choices)}, got {value!r:.60}"
        )
    return text


def with_fields(base: Processing, fields: dict[str, Any], where: str) -> Processing:
    """``base`` with the sidecar/flag ``fields`` (no ``preset``) set, each checked; an
    unknown field or bad value is one :class:`EdgecvError` naming it and ``where``."""
    unknown = sorted(set(fields) - set(FIELDS) - {"preset"})
    if unknown:
        raise EdgecvError(
            f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; the fields are "
            f"{', '.join(FIELDS)}"
        )
    pre: dict[str, Any] = {}
    dec: dict[str, Any] = {}
    for field, value in fields.items():
        if field in ("color", "resize", "layout"):
            choices = {"color": COLORS, "resize": RESIZES, "layout": LAYOUTS}[field]
            pre[field] = _choice(value, field, choices, where)
        elif field in ("mean", "std"):
            pre[field] = _triple(value, field, where)
            if field == "std" and 0.0 in pre[field]:
                raise EdgecvError(f"{where}: `std` should have no zero, got {value!r:.60}")
        elif field in ("scale", "pad"):
            pre[field] = _number(value, field, where)
        elif field == "decoder":
            dec["kind"] = _choice(value, field, DECODERS, where)
        elif field in ("iou", "confidence"):
            dec[field] = _number(value, field, where)
            if not 0.0 <= dec[field] <= 1.0:
                raise EdgecvError(f"{where}: `{field}` should be within 0-1, got {value!r:.60}")
    classes = base.classes
    if "classes" in fields:
        classes = _class_names(fields["classes"], where)
    return Processing(
        dataclasses.replace(base.preprocessing, **pre),
        dataclasses.replace(base.decoder, **dec),
        classes,
    )


def _class_names(value: Any, where: str) -> tuple[str, ...]:
    """A list of names, or a text file with one name a line (``coco80``: COCO's 80)."""
    if value == "coco80":
        return coco80()
    if isinstance(value, str):
        try:
            text = Path(value).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise EdgecvError(
                f"{where}: cannot read classes file {value} ({err.__class__.__name__}); give "
                "a text file with one class name a line"
            ) from None
        return tuple(line.strip() for line in text.splitlines() if line.strip())
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise EdgecvError(
            f"{where}: `classes` should be a list of names or a file of one name a line, "
            f"got {value!r:.60}"
        )
    return tuple(value)


def read_sidecar(path: str | Path) -> Processing:
    """A ``.json`` sidecar: an object of :data:`FIELDS`, starting from its ``preset``
    (``imagenet`` when it names none)."""
    where = str(path)
    try:
        fields = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise EdgecvError(f"cannot read {where}: {err.strerror or err}") from None
    except ValueError as err:
        raise EdgecvError(f"{where} is not JSON ({err}); write an object of fields") from None
    if not isinstance(fields, dict):
        raise EdgecvError(
            f"{where}: should be a JSON object of fields, got {type(fields).__name__}"
        )
    base = preset(str(fields.get("preset", "imagenet")))
    return with_fields(base, {k: v for k, v in fields.items() if k != "preset"}, where)


def resolve(spec: str | Path | Processing | None, overrides: dict[str, Any]) -> Processing | None:
    """``--preprocess`` (a preset name, a sidecar file, or already a description) with
    the flags' ``overrides``; ``None`` when neither is given (the source's default)."""
    if isinstance(spec, Processing):
        base: Processing | None = spec
    elif spec is None:
        base = None
    elif str(spec).endswith(".json"):
        base = read_sidecar(spec)
    else:
        base = preset(str(spec))
    if not overrides:
        return base
    return with_fields(base or preset("imagenet"), overrides, "deploy flags")


def to_manifest(processing: Processing) -> dict[str, Any]:
    """The manifest sections this description writes (``classes`` only when it has some)."""
    out: dict[str, Any] = {
        "preprocessing": processing.preprocessing.as_dict(),
        "decoder": processing.decoder.as_dict(),
    }
    if processing.classes is not None:
        out["classes"] = list(processing.classes)
    return out


def from_manifest(manifest: dict[str, Any], root: str | Path = "") -> Processing:
    """A package's description, checked. A package without a ``decoder`` section (every
    package before it existed) decodes as its task did: top-k of logits for a
    classifier, GluonCV's outputs for a detector."""
    where = f"{Path(root) / 'manifest.json'}"
    section = manifest.get("preprocessing")
    if not isinstance(section, dict):
        raise PackageError(f"{where}: field `preprocessing` is missing; redeploy the model")
    decoder = manifest.get("decoder")
    if decoder is None:
        task = (manifest.get("model") or {}).get("task")
        kind = {"classification": "logits", "detection": "gluoncv"}.get(task, "tensor")
        decoder = {"kind": kind}
    if not isinstance(decoder, dict):
        raise PackageError(f"{where}: field `decoder` should be an object; redeploy the model")
    fields = {k: v for k, v in section.items() if k in _PRE_FIELDS}
    fields.update({f: decoder[k] for f, k in _DECODER_FIELDS.items() if k in decoder})
    try:
        processing = with_fields(preset("imagenet"), fields, where)
    except EdgecvError as err:
        raise PackageError(f"{err}; the manifest is damaged: redeploy the model") from None
    classes = manifest.get("classes")
    return dataclasses.replace(processing, classes=None if classes is None else tuple(classes))


def add_arguments(parser) -> None:
    """``edgecv deploy``'s flags for this description."""
    parser.add_argument(
        "--preprocess",
        metavar="PRESET|FILE.json",
        help=f"pre- and post-processing: a preset ({', '.join(PRESETS)}) or a JSON sidecar "
        "with the fields below (default: the zoo's ImageNet one; torchvision's for an ONNX "
        "classifier)",
    )
    parser.add_argument("--mean", metavar="R,G,B", help="per-channel mean (after --scale)")
    parser.add_argument("--std", metavar="R,G,B", help="per-channel std (after --scale)")
    color = parser.add_mutually_exclusive_group()
    color.add_argument("--rgb", dest="color", action="store_const", const="RGB")
    color.add_argument("--bgr", dest="color", action="store_const", const="BGR")
    parser.add_argument("--scale", metavar="X", help="pixel scale, e.g. 1/255")
    parser.add_argument(
        "--letterbox",
        nargs="?",
        const=114.0,
        metavar="PAD",
        help="resize with the aspect kept, padded with PAD grey (default 114)",
    )
    parser.add_argument("--decoder", choices=DECODERS, help="how outputs become results")
    parser.add_argument("--classes", metavar="FILE", help="class names, one a line")


def from_arguments(args) -> Processing | None:
    """The description ``edgecv deploy``'s flags give (``None``: the default)."""
    overrides: dict[str, Any] = {}
    for field in ("mean", "std", "color", "scale", "decoder", "classes"):
        if getattr(args, field, None) is not None:
            overrides[field] = getattr(args, field)
    if getattr(args, "letterbox", None) is not None:
        overrides.update(resize="letterbox", pad=args.letterbox)
    return resolve(getattr(args, "preprocess", None), overrides)


__all__ = [
    "DECODERS",
    "PRESETS",
    "Decoder",
    "Preprocessing",
    "Processing",
    "from_manifest",
    "preset",
    "read_sidecar",
    "resolve",
    "to_manifest",
]
