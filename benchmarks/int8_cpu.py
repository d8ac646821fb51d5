"""INT8 vs FP32 packages for the `cpu` profile: latency in alternating runs, and how
far INT8's answers move from FP32's on real photos.

    python benchmarks/int8_cpu.py                                  # mobilenet1.0, resnet50_v1
    python benchmarks/int8_cpu.py mobilenet1.0 --methods minmax,percentile,entropy

Per model (seeded random weights: GluonCV's are not reachable here;
``int8_real_weights.py`` measures a trained network), one FP32 package (``--layout``,
default auto: the graph tuner's choice, the FP32 package a user gets) and one INT8
package per calibration method, calibrated on crops of scikit-image's photos; then

- latency: median of ``--repeat`` runs, the packages taking turns
  (:func:`edgecv.bench.harness.alternate`);
- agreement with FP32 on other crops of the same photos and the photos themselves:
  top-1 agreement, top-5 overlap, the largest logit error relative to FP32's scale.

With random weights the statistics say little about a trained model's accuracy: the
logits of a random network are nearly flat, so a small error flips top-1 more easily
than in a trained one (which is where ``tests/test_int8.py``'s digits model stands in).
Not a test: numbers vary with load.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import edgecv
from edgecv.bench.harness import alternate
from edgecv.board.imaging import preprocess
from edgecv.deploy import PREPROCESSING, deploy
from edgecv.pipelines import BuildOptions

PHOTOS = (
    "astronaut",
    "cat",
    "coffee",
    "hubble_deep_field",
    "immunohistochemistry",
    "retina",
    "rocket",
    "colorwheel",
    "chelsea",
)


def photos() -> list[np.ndarray]:
    """scikit-image's colour photos (shipped in its wheel) as BGR uint8."""
    import skimage.data

    return [np.ascontiguousarray(getattr(skimage.data, n)()[:, :, :3][:, :, ::-1]) for n in PHOTOS]


def crops(images: list[np.ndarray], count: int, seed: int) -> list[np.ndarray]:
    """Random crops (40-100% of the shorter side, random aspect) and mirror images."""
    rng = np.random.RandomState(seed)
    out = []
    for i in range(count):
        image = images[i % len(images)]
        h, w = image.shape[:2]
        side = rng.uniform(0.4, 1.0) * min(h, w)
        ch = int(min(h, side * rng.uniform(0.8, 1.25)))
        cw = int(min(w, side * rng.uniform(0.8, 1.25)))
        y, x = rng.randint(0, h - ch + 1), rng.randint(0, w - cw + 1)
        crop = image[y : y + ch, x : x + cw]
        out.append(np.ascontiguousarray(crop[:, ::-1] if rng.rand() < 0.5 else crop))
    return out


def agreement(fp32, int8, inputs) -> dict:
    top1, overlap, errors = [], [], []
    for x in inputs:
        a, b = fp32.run(x)[0].reshape(-1), int8.run(x)[0].reshape(-1)
        top1.append(np.argmax(a) == np.argmax(b))
        overlap.append(len(set(np.argsort(-a)[:5]) & set(np.argsort(-b)[:5])) / 5)
        errors.append(np.abs(a - b).max() / np.abs(a).max())
    return {"top1": 100 * np.mean(top1), "top5": 100 * np.mean(overlap), "error": 100 * max(errors)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["mobilenet1.0", "resnet50_v1"])
    parser.add_argument("--methods", default="percentile", help="comma-separated")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--calibration-size", type=int, default=64)
    parser.add_argument("--layout", default="auto", help="of the FP32 package")
    parser.add_argument("--work", help="keep the packages here (default: a temporary folder)")
    parser.add_argument(
        "--keep-fp32", action="store_true", help="reuse the FP32 packages already in --work"
    )
    args = parser.parse_args()
    import cv2

    images = photos()
    with tempfile.TemporaryDirectory(prefix="edgecv-int8-") as tmp:
        work = Path(args.work or tmp)
        calibration = work / "calibration"
        calibration.mkdir(parents=True, exist_ok=True)
        for i, crop in enumerate(crops(images, args.calibration_size, seed=0)):
            cv2.imwrite(str(calibration / f"{i:03d}.png"), crop)
        evaluation = images + crops(images, 64, seed=1)
        for name in args.models:
            fp32_path = work / f"{name}-fp32"
            started = time.perf_counter()
            if not (args.keep_fp32 and (fp32_path / "manifest.json").exists()):
                deploy(
                    name,
                    fp32_path,
                    pretrained=False,
                    force=True,
                    options=BuildOptions(layout=args.layout),
                )
                print(f"{name}: fp32 deployed in {time.perf_counter() - started:.0f} s", flush=True)
            packages = {"fp32": edgecv.load(fp32_path)}
            for method in args.methods.split(","):
                path = work / f"{name}-int8-{method}-{time.strftime('%H%M%S')}"  # a new library
                started = time.perf_counter()
                options = BuildOptions(
                    precision="int8", calibrate=calibration, calibration_method=method
                )
                deploy(name, path, pretrained=False, force=True, options=options)
                print(
                    f"{name}: int8 ({method}) deployed in {time.perf_counter() - started:.0f} s",
                    flush=True,
                )
                packages[f"int8-{method}"] = edgecv.load(path)
            shape = packages["fp32"].input_shape
            inputs = [preprocess(im, PREPROCESSING, shape) for im in evaluation]
            timed = alternate(
                {k: (lambda m=m, x=inputs[0]: m.run(x)) for k, m in packages.items()}, args.repeat
            )
            base = timed["fp32"].median
            for key, t in timed.items():
                line = f"  {key:<18} {t.median * 1e3:8.2f} ms  fp32/this {base / t.median:5.2f}x"
                if key != "fp32":
                    a = agreement(packages["fp32"], packages[key], inputs)
                    line += (
                        f"  top-1 agreement {a['top1']:5.1f}%  top-5 overlap {a['top5']:5.1f}%"
                        f"  max logit error {a['error']:.1f}% of fp32's scale"
                    )
                print(line, flush=True)


if __name__ == "__main__":
    main()
