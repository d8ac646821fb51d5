"""INT8 against FP32 on a network with trained weights: nsfwjs's MobileNetV2.

No GluonCV or ImageNet weights are reachable here (no model store), so the agreement
numbers of ``int8_cpu.py`` come from random weights, whose logits are nearly flat. The
npm package ``nsfwjs`` (pinned below) ships trained networks inside it: a Keras
MobileNetV2 (the architecture of GluonCV's ``mobilenetv2_1.0``: inverted residuals,
ReLU6, linear bottlenecks) fine-tuned to 5 classes (drawing, hentai, neutral, porn,
sexy), in TensorFlow.js's layers format with its weights stored in 8 bits (TF.js
weight quantization: ``min + q * scale``). This script

1. fetches the package with ``npm pack`` (npm's registry; node reads its JS-wrapped
   files),
2. converts the Keras graph to an MXNet symbol and parameters (a user's model:
   ``*-symbol.json`` + ``.params``; the softmax left off, so the output is logits),
   and checks the conversion against TensorFlow.js itself when ``--check-tfjs DIR``
   names a folder where ``npm install @tensorflow/tfjs`` was run,
3. deploys it for the ``cpu`` profile in FP32 and in INT8 (calibrated on crops of
   scikit-image's photos, ``--methods``), and
4. reports, over the photos and other crops of them: top-1 agreement with FP32, the
   change of the 5 probabilities, the rms logit error, and the latency of each package
   (medians of alternating runs).

    python benchmarks/int8_real_weights.py --work /tmp/nsfw --crops 300

The inputs are RGB / 255, 224 x 224 (nsfwjs's preprocessing), given as arrays.
Not a test: it needs npm and the registry, and numbers vary with load.
"""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

NSFWJS = "nsfwjs@4.4.0"
MODEL = "package/dist/models/mobilenet_v2"
CLASSES = ("drawing", "hentai", "neutral", "porn", "sexy")
SHAPE = (1, 3, 224, 224)


def fetch(work: Path) -> Path:
    """The folder of the package's MobileNetV2 (``npm pack``, unpacked in ``work``)."""
    folder = work / MODEL
    if not folder.is_dir():
        done = subprocess.run(
            ["npm", "pack", NSFWJS, "--pack-destination", str(work)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            sys.exit(f"npm pack {NSFWJS} failed (npm and its registry needed): {done.stderr}")
        tarball = work / done.stdout.strip().splitlines()[-1]
        with tarfile.open(tarball) as tar:
            tar.extractall(work, filter="data")
    return folder


def _node_export(path: Path):
    """The value a CommonJS file of the package exports (node evaluates it)."""
    script = f"process.stdout.write(JSON.stringify(require({json.dumps(str(path))})))"
    return json.loads(subprocess.check_output(["node", "-e", script]))


def read_model(folder: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """(Keras model config, weights by name) of TF.js's layers format, dequantized."""
    model = _node_export(folder / "model.min.js")
    data = base64.b64decode(_node_export(folder / "group1-shard1of1.min.js"))
    weights, offset = {}, 0
    for spec in model["weightsManifest"][0]["weights"]:
        count = int(np.prod(spec["shape"]))
        quant = spec.get("quantization")
        if quant is not None:
            if quant["dtype"] != "uint8":
                raise ValueError(f"{spec['name']}: {quant['dtype']} weights not handled")
            q = np.frombuffer(data, np.uint8, count, offset).astype(np.float64)
            value, offset = quant["min"] + q * quant["scale"], offset + count
        else:
            value, offset = np.frombuffer(data, np.float32, count, offset), offset + 4 * count
        weights[spec["name"]] = value.astype(np.float32).reshape(spec["shape"])
    if offset != len(data):
        raise ValueError(f"the weights manifest covers {offset} of {len(data)} bytes")
    return model["modelTopology"]["model_config"], weights


def to_mxnet(config: dict, weights: dict[str, np.ndarray], prefix: Path) -> tuple[Path, Path]:
    """The Keras graph as an MXNet symbol + parameters (the layer kinds of Keras's
    MobileNetV2 and a dense head; others refused). Keras kernels are HWIO (depthwise:
    HW, channels, multiplier), MXNet's OIHW."""
    from edgecv._mxnet import import_mxnet

    mx = import_mxnet()
    S = mx.sym
    made, args, auxs = {}, {}, {}
    out = None
    for layer in config["config"]["layers"]:
        c, name, kind = layer["config"], layer["config"]["name"], layer["class_name"]
        ins = [made[i[0]] for i in layer["inbound_nodes"][0]] if layer["inbound_nodes"] else []
        x = ins[0] if ins else None
        if kind == "InputLayer":
            out = S.var("data")
        elif kind == "ZeroPadding2D":
            (top, bottom), (left, right) = c["padding"]
            pad = (0, 0, 0, 0, top, bottom, left, right)
            out = S.pad(x, mode="constant", pad_width=pad, name=name)
        elif kind in ("Conv2D", "DepthwiseConv2D"):
            k, s = c["kernel_size"][0], c["strides"][0]
            if c["padding"] == "same" and s != 1:
                raise ValueError(f"{name}: 'same' padding with stride {s} is asymmetric")
            if kind == "Conv2D":
                w, groups = weights[f"{name}/kernel"].transpose(3, 2, 0, 1), 1
            else:
                if c["depth_multiplier"] != 1:
                    raise ValueError(f"{name}: depth multiplier {c['depth_multiplier']}")
                w = weights[f"{name}/depthwise_kernel"].transpose(2, 3, 0, 1)
                groups = w.shape[0]
            args[f"{name}_weight"] = w
            if c["use_bias"]:
                args[f"{name}_bias"] = weights[f"{name}/bias"]
            if c["activation"] != "linear":
                raise ValueError(f"{name}: activation {c['activation']}")
            pad = 0 if c["padding"] == "valid" else k // 2
            out = S.Convolution(
                x,
                num_filter=w.shape[0],
                kernel=(k, k),
                stride=(s, s),
                pad=(pad, pad),
                num_group=groups,
                no_bias=not c["use_bias"],
                name=name,
            )
        elif kind == "BatchNormalization":
            args[f"{name}_gamma"] = weights[f"{name}/gamma"]
            args[f"{name}_beta"] = weights[f"{name}/beta"]
            auxs[f"{name}_moving_mean"] = weights[f"{name}/moving_mean"]
            auxs[f"{name}_moving_var"] = weights[f"{name}/moving_variance"]
            out = S.BatchNorm(
                x, eps=c["epsilon"], fix_gamma=False, use_global_stats=True, name=name
            )
        elif kind == "ReLU":
            top = c.get("max_value")
            out = S.clip(x, 0, top, name=name) if top else S.relu(x, name=name)
        elif kind == "Add":
            out = S.elemwise_add(*ins, name=name)
        elif kind == "AveragePooling2D":
            if c["padding"] != "valid":
                raise ValueError(f"{name}: padding {c['padding']}")
            k, s = c["pool_size"][0], c["strides"][0]
            out = S.Pooling(x, kernel=(k, k), stride=(s, s), pool_type="avg", name=name)
        elif kind == "Flatten":  # after a 1x1 pooling: NHWC and NCHW flatten alike
            out = S.flatten(x, name=name)
        elif kind == "Dropout":
            out = x
        elif kind == "Dense":
            args[f"{name}_weight"] = weights[f"{name}/kernel"].T
            args[f"{name}_bias"] = weights[f"{name}/bias"]
            out = S.FullyConnected(x, num_hidden=c["units"], name=name)
            if c["activation"] == "relu":
                out = S.relu(out)
            elif c["activation"] not in ("softmax", "linear"):  # softmax left off: logits
                raise ValueError(f"{name}: activation {c['activation']}")
        else:
            raise ValueError(f"{name}: Keras layer {kind} is not converted")
        made[name] = out
    prefix.parent.mkdir(parents=True, exist_ok=True)
    symbol, params = Path(f"{prefix}-symbol.json"), Path(f"{prefix}-0000.params")
    out.save(str(symbol))
    saved = {f"arg:{k}": mx.nd.array(v) for k, v in args.items()}
    saved.update({f"aux:{k}": mx.nd.array(v) for k, v in auxs.items()})
    mx.nd.save(str(params), saved)
    return symbol, params


TFJS = """
const tf = require('@tensorflow/tfjs');
const fs = require('fs');
const [model, shard, input, count, output] = process.argv.slice(1);
(async () => {
  await tf.setBackend('cpu');
  const m = require(model);
  const bytes = Buffer.from(require(shard), 'base64');
  const data = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength);
  const net = await tf.loadLayersModel(
    tf.io.fromMemory(m.modelTopology, m.weightsManifest[0].weights, data));
  const raw = fs.readFileSync(input);
  const x = tf.tensor4d(new Float32Array(raw.buffer, raw.byteOffset, raw.byteLength / 4),
    [parseInt(count), 224, 224, 3]);
  fs.writeFileSync(output, Buffer.from((await net.predict(x).data()).buffer));
})();
"""


def check_with_tfjs(folder: Path, symbol: Path, params: Path, x: np.ndarray, tfjs: Path) -> float:
    """The largest difference of the 5 probabilities between TF.js running the package's
    own model and MXNet running the conversion, on the NCHW inputs ``x``."""
    with tempfile.TemporaryDirectory() as tmp:
        nhwc, out = Path(tmp) / "x.bin", Path(tmp) / "y.bin"
        np.ascontiguousarray(x.transpose(0, 2, 3, 1), dtype=np.float32).tofile(nhwc)
        model, shard = folder / "model.min.js", folder / "group1-shard1of1.min.js"
        args = [str(model), str(shard), str(nhwc), str(len(x)), str(out)]
        subprocess.run(["node", "-e", TFJS, *args], cwd=tfjs, check=True, capture_output=True)
        reference = np.fromfile(out, np.float32).reshape(len(x), len(CLASSES))
    from edgecv.bench.baselines import mxnet_baseline

    logits = mxnet_baseline(symbol, params, x.shape).run(x)[0]
    return float(np.abs(softmax(logits) - reference).max())


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def prepare(bgr: np.ndarray) -> np.ndarray:
    """nsfwjs's preprocessing: RGB / 255, bilinear resize to 224 x 224, as NCHW."""
    import cv2

    rgb = cv2.resize(bgr[:, :, ::-1], SHAPE[2:], interpolation=cv2.INTER_LINEAR)
    return np.ascontiguousarray((rgb.astype(np.float32) / 255).transpose(2, 0, 1)[None])


def main() -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from int8_cpu import crops, photos

    import edgecv
    from edgecv.bench.harness import alternate
    from edgecv.deploy import deploy
    from edgecv.pipelines import BuildOptions

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", help="keep everything here (default: a temporary folder)")
    parser.add_argument("--methods", default="percentile,minmax,entropy", help="comma-separated")
    parser.add_argument("--calibration-size", type=int, default=64)
    parser.add_argument("--crops", type=int, default=300, help="evaluation crops")
    parser.add_argument("--repeat", type=int, default=40)
    parser.add_argument("--check-tfjs", help="a folder with node_modules/@tensorflow/tfjs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgecv-real-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        folder = fetch(work)
        config, weights = read_model(folder)
        symbol, params = to_mxnet(config, weights, work / "mxnet" / "nsfw_mobilenet_v2")
        images = photos()
        evaluation = np.concatenate([prepare(im) for im in images + crops(images, args.crops, 1)])
        calibration = work / "calibration.npy"
        np.save(calibration, np.concatenate([prepare(c) for c in crops(images, 64, 0)]))
        if args.check_tfjs:
            error = check_with_tfjs(folder, symbol, params, evaluation[:8], Path(args.check_tfjs))
            print(f"conversion vs TF.js: largest probability difference {error:.2e} (8 inputs)")
        started = time.perf_counter()
        common = dict(params=str(params), input_shape=SHAPE, force=True)
        packages = {"fp32": edgecv.load(deploy(str(symbol), work / "fp32", **common))}
        print(f"fp32 deployed in {time.perf_counter() - started:.0f} s", flush=True)
        for method in args.methods.split(","):
            started = time.perf_counter()
            options = BuildOptions(
                precision="int8",
                calibrate=str(calibration),
                calibration_method=method,
                calibration_size=args.calibration_size,
            )
            path = deploy(str(symbol), work / f"int8-{method}", options=options, **common)
            print(f"int8 ({method}) deployed in {time.perf_counter() - started:.0f} s", flush=True)
            packages[f"int8-{method}"] = edgecv.load(path)
        outputs = {
            k: np.stack([m.run(x[None])[0].ravel() for x in evaluation])
            for k, m in packages.items()
        }
        reference = outputs["fp32"]
        top = reference.argmax(axis=1)
        ordered = np.sort(reference, axis=1)
        counts = ", ".join(
            f"{c} {n}" for c, n in zip(CLASSES, np.bincount(top, minlength=5), strict=True)
        )
        print(
            f"{len(evaluation)} inputs ({len(images)} photos, {args.crops} crops); FP32's "
            f"top-1: {counts}; median top-1 - top-2 logit margin "
            f"{np.median(ordered[:, -1] - ordered[:, -2]):.2f}"
        )
        timed = alternate(
            {k: (lambda m=m: m.run(evaluation[:1])) for k, m in packages.items()}, args.repeat
        )
        base = timed["fp32"].median
        for key, t in timed.items():
            line = f"  {key:<16} {t.median * 1e3:7.2f} ms  fp32/this {base / t.median:4.2f}x"
            if key != "fp32":
                got = outputs[key]
                differ = int(np.sum(got.argmax(axis=1) != top))
                change = np.abs(softmax(got) - softmax(reference))
                scale = np.abs(reference).max(axis=1)
                rms = np.sqrt(np.mean((got - reference) ** 2, axis=1)) / scale
                line += (
                    f"  top-1 agreement {100 * (1 - differ / len(top)):6.2f}% ({differ} differ)"
                    f"  probabilities: mean change {change.mean():.4f}, largest "
                    f"{change.max():.3f}  rms logit error {100 * rms.mean():.2f}%"
                )
            print(line, flush=True)


if __name__ == "__main__":
    main()
