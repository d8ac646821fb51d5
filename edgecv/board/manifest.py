"""A package's manifest (``manifest.json``), typed: its one writer and reader.

``edgecv deploy`` makes a :class:`Manifest` (:meth:`Manifest.new`) and the package
writer seals it with the format and every file's sha256 (:meth:`Manifest.sealed`); the
loader, ``run``, ``bench`` and ``--explain`` read a checked one
(:meth:`Manifest.checked`) through its attributes. The JSON is what packages have always
held: packages deployed before this class read as they did. The ``build`` section keeps
each pipeline's facts as the pipeline wrote them; the ones other code reads have an
attribute here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, NoReturn

import numpy as np

from ._version import __version__
from .errors import PackageError
from .precision import PRECISIONS, Precision
from .processing import Processing, from_manifest

FORMAT = "edgecv-package"
FORMAT_VERSION = 2  # 2: plans place steps and buffers on devices (CPU fallback)
MANIFEST = "manifest.json"
# TVM's runtime libraries for the package's host, beside its CPU kernels (runtime/cpu.py):
# the runtime, and its extra library when a kernel calls one of TVM's library functions.
TVM_RUNTIME_FILES = ("kernels/libtvm_runtime.so", "kernels/libtvm_runtime_extra.so")
# The shared libraries a package's loader opens, by their key in build.kernels: each is
# always this file (written by edgecv.pipelines).
LIBRARY_FILES = {
    "cpu": "kernels/cpu.so",
    "tvm_runtime": TVM_RUNTIME_FILES[0],
    "tvm_runtime_extra": TVM_RUNTIME_FILES[1],
}
SHA256_DIGEST = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Tensor:
    """An input or output of the model: its name, shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


@dataclass(frozen=True)
class Manifest:
    """One package's manifest. ``raw`` is its JSON object, as written and read."""

    raw: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        """The JSON's top-level sections by key, read-only (``model.manifest["build"]``),
        as the manifest was a plain dict before it had an owner: user code keeps working."""
        return self.raw[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self.raw

    @classmethod
    def new(
        cls,
        model: dict[str, Any],
        profile: dict[str, Any],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        classes: list[str] | None,
        sections: dict[str, Any],
        build: dict[str, Any],
        versions: dict[str, str],
    ) -> Manifest:
        """A deploy's manifest: the model (name, task, weights, symbol, source), the
        profile as deployed, the tensors, the classes, the pre- and post-processing
        ``sections`` (:func:`edgecv.board.processing.to_manifest`; classes there replace the
        source's), the build's facts and the versions."""
        return cls(
            {
                "model": model,
                "profile": profile,
                "inputs": [t.as_dict() for t in inputs],
                "outputs": [t.as_dict() for t in outputs],
                "classes": classes,
                **sections,
                "versions": versions,
                "build": build,
            }
        )

    def sealed(self, files: dict[str, str]) -> Manifest:
        """This manifest as a package holds it: the format first, the sha256 of every
        other file of the package (``files``, by relative path) last."""
        body = {k: v for k, v in self.raw.items() if k not in ("format", "format_version")}
        body.pop("files", None)
        return Manifest(
            {"format": FORMAT, "format_version": FORMAT_VERSION, **body, "files": files}
        )

    def to_json(self) -> str:
        return json.dumps(self.raw, indent=2)

    @classmethod
    def checked(cls, raw: Any, root: Path) -> Manifest:
        """The manifest of the package at ``root`` from its parsed JSON ``raw``, refused
        with one line naming the field when the loader could not use it
        (:func:`check_manifest`)."""
        check_manifest(raw, root)
        return cls(raw)

    # -- the model and the profile ----------------------------------------------------
    @property
    def model_name(self) -> str:
        return self.raw["model"]["name"]

    @property
    def task(self) -> str:
        return self.raw["model"]["task"]

    @property
    def source(self) -> dict[str, Any] | None:
        """What the model's source was (:mod:`edgecv.source`), for rebuilding baselines;
        None in packages made before it was recorded."""
        return self.raw["model"].get("source")

    @property
    def profile(self) -> dict[str, Any]:
        """The device profile as deployed (its JSON)."""
        return self.raw["profile"]

    @property
    def profile_name(self) -> str:
        return self.raw["profile"]["name"]

    @property
    def runtime(self) -> str:
        """The profile's backend: ``cpu``, ``opencl`` or ``cuda``."""
        return self.raw["profile"]["runtime"]

    @property
    def gpu(self) -> dict[str, Any]:
        """The profile's ``gpu`` section (empty for a CPU profile)."""
        return self.raw["profile"].get("gpu") or {}

    # -- tensors and processing -------------------------------------------------------
    @property
    def inputs(self) -> tuple[Tensor, ...]:
        return tuple(_tensor(t) for t in self.raw["inputs"])

    @property
    def outputs(self) -> tuple[Tensor, ...]:
        return tuple(_tensor(t) for t in self.raw["outputs"])

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The first input's shape."""
        return tuple(self.raw["inputs"][0]["shape"])

    @property
    def classes(self) -> list[str]:
        """The class names (empty where the model carries none)."""
        return self.raw.get("classes", [])

    @property
    def preprocessing(self) -> dict[str, Any]:
        """The ``preprocessing`` section, as :func:`edgecv.board.imaging.preprocess` takes it."""
        return self.raw["preprocessing"]

    def processing(self, root: str | Path = "") -> Processing:
        """The package's pre- and post-processing, checked (:mod:`edgecv.board.processing`)."""
        return from_manifest(self.raw, root)

    # -- the build --------------------------------------------------------------------
    @property
    def build(self) -> dict[str, Any]:
        """The ``build`` section: every pipeline's facts, by name."""
        return self.raw["build"]

    @property
    def kernels(self) -> dict[str, str]:
        """The package's kernel files by kind (``cpu``, ``opencl``, ``cuda``, ...)."""
        return self.raw["build"]["kernels"]

    @property
    def precision(self) -> Precision:
        """The build's precision (float32 in packages made before it was recorded)."""
        return Precision.parse(self.raw["build"].get("precision", Precision.FP32.value))

    @property
    def host(self) -> dict[str, Any] | None:
        """The host the CPU kernels were compiled for (triple, cpu, features)."""
        return self.raw["build"].get("host")

    @property
    def requires(self) -> list[str]:
        """The OpenCL extensions the kernels need."""
        return self.raw["build"].get("requires", [])

    @property
    def cuda_arch(self) -> str | int:
        return self.raw["build"]["cuda"]["arch"]

    @property
    def kernel_ops(self) -> dict[str, list[str]]:
        """The model's operators fused into each kernel."""
        return self.raw["build"].get("kernel_ops", {})

    @property
    def tuning_databases(self) -> list[str]:
        """The database folders the build read records from, highest priority first."""
        return self.raw["build"].get("tuning_databases") or []

    @property
    def placement(self) -> dict[str, Any] | None:
        """Where each launch runs and the device copies (None: all on one device)."""
        return self.raw["build"].get("placement")

    @property
    def layouts(self) -> dict[str, Any] | None:
        """The graph tuner's layout per convolution and the transforms it inserted."""
        return self.raw["build"].get("layouts")

    @property
    def schedules(self) -> dict[str, Any]:
        """Which rule scheduled each kernel, per device, and a count per rule."""
        return self.raw["build"].get("schedules", {})

    @property
    def quantization(self) -> dict[str, Any]:
        """An INT8 build's facts (the scales, the calibration); empty for another."""
        return self.raw["build"].get("quantization", {})

    @property
    def launches(self) -> int:
        """How many launches run per inference."""
        return self.raw["build"]["launches"]

    @property
    def files(self) -> dict[str, str]:
        """The sha256 of every other file of the package, by relative path."""
        return self.raw["files"]

    @property
    def loaded_files(self) -> list[str]:
        """The package files :func:`edgecv.load` reads, relative to the package folder."""
        return ["plan.json", "params.npz", *self.kernels.values()]


def _tensor(raw: dict[str, Any]) -> Tensor:
    return Tensor(raw["name"], tuple(raw["shape"]), raw["dtype"])


def check_manifest(manifest: Any, root: Path) -> None:
    """Refuse, with one line naming the field, a manifest the loader could not use: its
    format, format version and edgecv version first (a manifest of another version may
    hold other fields), then every field that loading and running the package read."""
    _check_format(manifest, root)
    fields = _Fields(manifest, root)
    files = fields.get("files", dict)
    for relative, digest in files.items():
        _check_relative(relative, f"files: {relative!r}", root)
        if not isinstance(digest, str) or not SHA256_DIGEST.fullmatch(digest):
            fields.fail(f"files.{relative}", "a sha256 (64 hex digits)", digest)
    _check_build(fields, root)
    inputs = fields.get("inputs", list)
    if not inputs:
        fields.fail("inputs", "one entry per model input", inputs)
    for index in range(len(inputs)):
        fields.tensor(f"inputs.{index}")
    for index in range(len(fields.get("outputs", list))):
        fields.tensor(f"outputs.{index}")
    fields.get("model.name", str)
    fields.get("model.task", str)
    fields.get("profile.name", str)
    fields.get("profile.runtime", str)
    fields.get("profile.gpu", dict, required=False)
    fields.get("preprocessing.color", str, required=False)
    fields.get("preprocessing.scale", (int, float), required=False)
    for key in ("mean", "std"):
        values = fields.get(f"preprocessing.{key}", list)
        if len(values) != 3 or not all(_is_number(v) for v in values):
            fields.fail(f"preprocessing.{key}", "3 numbers (R, G, B)", values)
    fields.strings("classes", required=False)
    from_manifest(manifest, root)  # resize, pad, layout, decoder: their owner's checks


def _check_format(manifest: Any, root: Path) -> None:
    """A manifest of this package format and this edgecv's version."""
    if not isinstance(manifest, dict):
        raise PackageError(
            f"{root / MANIFEST} holds a JSON {type(manifest).__name__}, not an edgecv "
            "manifest; redeploy the model"
        )
    if manifest.get("format") != FORMAT:
        raise PackageError(
            f"{root} is not an edgecv package (format {manifest.get('format')!r:.60})"
        )
    version = manifest.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:
        raise PackageError(
            f"{root} has package format {version!r:.40}, this edgecv reads format "
            f"{FORMAT_VERSION}; redeploy the model with this edgecv"
        )
    versions = manifest.get("versions")
    built_with = versions.get("edgecv") if isinstance(versions, dict) else None
    if built_with != __version__:
        if not (isinstance(built_with, str) and built_with.isprintable()):
            built_with = f"{built_with!r:.40}"
        raise PackageError(
            f"{root} was built by edgecv {built_with}, this is edgecv {__version__}; kernels and "
            "plans are not portable across versions: redeploy the model"
        )


def _check_build(fields: _Fields, root: Path) -> None:
    """The ``build`` fields the loader reads: the kernel files (the libraries it opens
    at the names the format gives them), the host, the extensions, the CUDA arch."""
    kernels = fields.get("build.kernels", dict)
    if not kernels:
        fields.fail("build.kernels", "the package's kernel files", kernels)
    for name, relative in kernels.items():
        field = f"build.kernels.{name if name.isprintable() else repr(name)}"
        if not isinstance(relative, str):
            fields.fail(field, "a file of the package", relative)
        _check_relative(relative, field, root)
        # what the dynamic loader opens is named by the format, not by the manifest: the
        # package's TVM runtime opened as its kernel library registers TVM's functions a
        # second time, and the process aborts
        expected = LIBRARY_FILES.get(name)
        if relative != expected and (expected or relative in LIBRARY_FILES.values()):
            fields.fail(
                field,
                f"{expected!r}" if expected else "a file no other entry of build.kernels names",
                relative,
            )
    host = fields.get("build.host", (dict, type(None)), required=False)
    if host:
        fields.get("build.host.triple", str)
        fields.get("build.host.cpu", (str, type(None)), required=False)
        fields.strings("build.host.features", required=False)
    fields.strings("build.requires", required=False)
    if "cuda" in kernels:
        fields.get("build.cuda.arch", (str, int))
    precision = fields.get("build.precision", str, required=False)
    if precision is not None and precision not in PRECISIONS:
        fields.fail("build.precision", f"one of {', '.join(PRECISIONS)}", precision)


class _Fields:
    """Typed reads of a manifest's fields by dotted path, refusing a missing or
    ill-typed one with its path, what it should be and what was found."""

    _MISSING = object()

    def __init__(self, manifest: dict[str, Any], root: Path):
        self.manifest, self.root = manifest, root

    def fail(self, path: str, expected: str, found: Any) -> NoReturn:
        shown = "nothing" if found is self._MISSING else f"{type(found).__name__} {found!r:.60}"
        raise PackageError(
            f"{self.root / MANIFEST}: field `{path}` should be {expected}, found {shown}; the "
            "manifest is damaged or from another tool: redeploy the model"
        )

    def get(self, path: str, kinds: type | tuple[type, ...], required: bool = True) -> Any:
        value: Any = self.manifest
        for key in path.split("."):
            if isinstance(value, list) and key.isdigit() and int(key) < len(value):
                value = value[int(key)]
            elif isinstance(value, dict) and key in value:
                value = value[key]
            else:
                value = self._MISSING
                break
        if value is self._MISSING and not required:
            return None
        if value is self._MISSING or not isinstance(value, kinds) or isinstance(value, bool):
            kinds = kinds if isinstance(kinds, tuple) else (kinds,)
            names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            self.fail(path, f"a {names}", value)
        return value

    def strings(self, path: str, required: bool = True) -> list[str] | None:
        values = self.get(path, list, required)
        if values is not None and not all(isinstance(v, str) for v in values):
            self.fail(path, "a list of strings", values)
        return values

    def tensor(self, path: str) -> None:
        self.get(f"{path}.name", str)
        shape = self.get(f"{path}.shape", list)
        if not all(type(d) is int and d >= 0 for d in shape):
            self.fail(f"{path}.shape", "a list of sizes (whole numbers >= 0)", shape)
        dtype = self.get(f"{path}.dtype", str)
        try:
            np.dtype(dtype)
        except TypeError:
            self.fail(f"{path}.dtype", "a NumPy dtype name", dtype)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_relative(relative: str, field: str, root: Path) -> None:
    """A file named by the manifest must lie inside the package folder: a relative
    path, no ``..``, so a damaged or hostile manifest cannot make the loader read or
    load a file from elsewhere."""
    parts = PurePosixPath(relative).parts
    if (
        not relative
        or relative.startswith(("/", "\\"))
        or re.match(r"^[A-Za-z]:", relative)
        or ".." in parts
        or not relative.isprintable()  # a control character: no file deploy writes
    ):
        raise PackageError(
            f"{root / MANIFEST}: `{field}` names {relative!r}, which is not a file inside the "
            "package; the manifest is damaged: redeploy the model"
        )
