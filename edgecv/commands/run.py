"""``edgecv run PACKAGE``: a package on image files, a bundled sample photo or raw input
tensors; prints the decoded results and the latency, optionally writes the outputs and
an annotated image. A board runs this without the compiler side."""

from __future__ import annotations

import argparse
import time
from functools import partial
from pathlib import Path

import numpy as np

from ..board.arguments import pin_argument
from ..board.errors import EdgecvError, ShapeError
from ..board.outputs import check_image_path, check_output_folder, save_arrays, save_image

SAMPLES = ("astronaut", "chelsea", "coffee", "motorcycle_left", "rocket")


def add_parser(sub, common) -> None:
    """Register ``run`` on the CLI's subparsers."""
    r = sub.add_parser("run", parents=[common], help="run a package on images or a tensor")
    r.add_argument("package", help="package folder or .tar.gz")
    r.add_argument("images", nargs="*", help="image files")
    r.add_argument(
        "--input",
        action="append",
        help="raw input tensor (.npy), no "
        "preprocessing; once per input, in order, for a model with several",
    )
    r.add_argument(
        "--sample", choices=SAMPLES, help="also run on a real photo shipped inside scikit-image"
    )
    r.add_argument("--output", help="write all outputs to this .npz (output0, output1, ...)")
    r.add_argument("--save", help="write the annotated image here (detectors)")
    r.add_argument(
        "--threshold",
        type=float,
        help="detection score threshold (default 0.5; the decoder's 0.25 for Ultralytics)",
    )
    r.add_argument("--repeat", type=int, default=5, help="timed runs after one warm-up")
    r.add_argument("--on", help="OpenCL device: part of its platform/device name (intel, pocl)")
    pin_argument(r)
    r.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..board.model import load

    # Where results go is checked before the model runs, not after.
    if args.save:
        check_image_path(args.save)
    if args.output:
        check_output_folder(args.output)
    model = load(args.package, on=args.on, sha256=args.sha256)
    from ..board.imaging import read_image

    # (what is printed, the stem a saved image gets, how to read it)
    images = [(path, Path(path).stem, partial(read_image, path)) for path in args.images]
    if args.sample:  # decoded in memory: no file at a temp path another user could own
        label = f"{args.sample} (scikit-image's sample photo)"
        images.append((label, args.sample, partial(sample_photo, args.sample)))
    if not images and not args.input:
        raise EdgecvError("nothing to run: give image files, --sample NAME or --input X.npy")
    if images:
        model.require_one_input("run IMAGE")
    if args.input:
        _run_tensors(model, args)
    for label, stem, read in images:
        _run_image(model, label, stem, read(), args, several=len(images) > 1)
    return 0


def _run_tensors(model, args: argparse.Namespace) -> None:
    """``--input X.npy`` once per input: the outputs' shapes and the latency."""
    names = [tensor.name for tensor in model.manifest.inputs]
    if len(args.input) != len(names):
        raise ShapeError(
            f"{args.package} takes {len(names)} input(s) ({', '.join(names)}); "
            f"--input was given {len(args.input)} time(s)"
        )
    xs = [_load_array(path) for path in args.input]
    outputs, latency = _timed(lambda _: model.run(*xs), None, repeat=args.repeat)
    _report_outputs(model, outputs, args.output)
    print(f"latency: {latency * 1e3:.2f} ms (median of {args.repeat})")


def _run_image(
    model, label: str, stem: str, image: np.ndarray, args: argparse.Namespace, several: bool
) -> None:
    """One image preprocessed as the package says: its decoded results and latency."""
    x = model.preprocess(image)
    outputs, latency = _timed(model.run, x, repeat=args.repeat)
    print(f"{label}:")
    kind = model.processing.decoder.kind
    if kind in ("logits", "probabilities"):
        for label, prob in model.decode(outputs, image.shape[:2]):
            print(f"  {prob:7.4f}  {label}")
    elif kind == "tensor":
        shapes = ", ".join("x".join(map(str, o.shape)) for o in outputs)
        print(f"  outputs: {shapes} (no decoder: deploy with --decoder or --preprocess)")
    else:
        _print_detections(model, image, stem, outputs, latency, args, several)
    print(f"  latency: {latency * 1e3:.2f} ms (median of {args.repeat})")
    if args.output:
        _report_outputs(model, outputs, args.output)


def _print_detections(model, image, stem, outputs, latency, args, several) -> None:
    """A detector's boxes above the threshold (else the best three, said so), and the
    annotated image with ``--save``."""
    from ..board.imaging import draw

    found = model.decode(outputs, image.shape[:2], args.threshold)
    shown = found or model.decode(outputs, image.shape[:2], -1.0)[:3]
    if not found:
        floor = "the decoder's" if args.threshold is None else args.threshold
        print(f"  no detections with score >= {floor}; best {len(shown)}:")
    for det in shown:
        box = ", ".join(f"{v:.0f}" for v in det.box)
        print(f"  {det.score:7.4f}  {det.label:<14} [{box}]")
    if args.save:
        out = Path(args.save)
        if several:
            out = out.with_name(f"{out.stem}-{stem}{out.suffix}")
        save_image(out, draw(image, found, fps=1.0 / latency))
        print(f"  annotated image: {out}")


def sample_photo(name: str) -> np.ndarray:
    """scikit-image's bundled photo ``name`` as OpenCV reads an image: BGR, uint8."""
    import skimage.data

    rgb = getattr(skimage.data, name)()
    if rgb.ndim == 2:
        rgb = np.stack([rgb] * 3, axis=-1)
    return np.ascontiguousarray(rgb[:, :, :3][:, :, ::-1])


def _load_array(path: str) -> np.ndarray:
    try:
        x = np.load(path)
    except (OSError, ValueError) as err:
        raise EdgecvError(f"cannot read --input {path}: {err}") from None
    if not isinstance(x, np.ndarray):
        raise ShapeError(f"--input {path} must hold one array (.npy), not an archive")
    return x


def _timed(fn, x, repeat: int):
    outputs = fn(x)
    times = []
    for _ in range(max(repeat, 1)):
        t = time.perf_counter()
        outputs = fn(x)
        times.append(time.perf_counter() - t)
    return outputs, float(np.median(times))


def _report_outputs(model, outputs: list[np.ndarray], path: str | None) -> None:
    for i, out in enumerate(outputs):
        print(f"output{i} {model.manifest.outputs[i].name}: shape {out.shape} {out.dtype}")
    if path:
        written = save_arrays(path, {f"output{i}": o for i, o in enumerate(outputs)})
        print(f"wrote {written}")
