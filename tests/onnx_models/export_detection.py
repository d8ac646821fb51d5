"""Re-export the torchvision detectors the ONNX detection tests deploy, committed without
their weights (:func:`seeded.strip`) so each file is kilobytes.

Run with a Python that has torch and torchvision (never a dependency of edgecv or its
tests)::

    /work/torchenv/bin/python tests/onnx_models/export_detection.py [NAME ...]

Each detector is built without weights (``weights=None, weights_backbone=None``) and
exported by the TorchScript-based exporter (``dynamo=False``, opset 17), the path
torchvision's own ONNX tests take for its detectors: a fixed input size, batch 1, and
the post-processing (score threshold, top-k candidates, batched NMS by coordinate
offsets, the best ``detections_per_img``) traced into the graph with data-dependent
shapes, which edgecv replaces with fixed-size outputs
(:mod:`edgecv.frontend.onnx.torchvision_detection`). The score threshold is raised
from torchvision's default where seeded random weights would pass every candidate, so
the tests see fewer detections than the cap.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import onnx
import torch
import torchvision

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from seeded import strip  # noqa: E402

# name -> (input size, keyword arguments of the model's builder). RetinaNet and FCOS
# choose candidates per feature level from the flattened scores and decode boxes after
# the top-k (edgecv.frontend.onnx.torchvision_levels); their builders resize to
# min_size..max_size, fixed here to the input's size.
MODELS = {
    "ssdlite320_mobilenet_v3_large": (320, {"score_thresh": 0.03}),
    "ssd300_vgg16": (300, {"score_thresh": 0.05}),
    "retinanet_resnet50_fpn": (320, {"min_size": 320, "max_size": 320}),
    "fcos_resnet50_fpn": (320, {"min_size": 320, "max_size": 320, "score_thresh": 0.3}),
    # the box head's softmax over 91 classes gives seeded weights (logits of order 1) scores
    # of 0.004-0.025, all under torchvision's 0.05: a threshold where a few dozen pass
    **{
        name: (320, {"min_size": 320, "max_size": 320, "box_score_thresh": 0.02})
        for name in (
            "fasterrcnn_mobilenet_v3_large_320_fpn",
            "fasterrcnn_mobilenet_v3_large_fpn",
            "fasterrcnn_resnet50_fpn",
            "fasterrcnn_resnet50_fpn_v2",
        )
    },
    # seeded weights give 91 classes' softmax scores of 0.03-0.035 on the test image:
    # torchvision's 0.05 keeps none, 0.032 a hundred candidates before the NMS
    "maskrcnn_resnet50_fpn": (320, {"min_size": 320, "max_size": 320, "box_score_thresh": 0.032}),
    # torchvision's RetinaNet and FCOS classes (head, anchors, post-processing) on a
    # two-level backbone of three convolutions (32 channels: FCOS's head normalizes in 32
    # groups), so the default suite can deploy them; thresholds where the seeded weights
    # (seeded.filled) pass a few hundred candidates, more than the top-k on the first level
    "tiny_retinanet": (128, {"score_thresh": 0.0135, "topk_candidates": 400}),
    "tiny_fcos": (128, {"score_thresh": 0.1, "topk_candidates": 400, "detections_per_img": 200}),
    # torchvision's FasterRCNN class (RPN, MultiScaleRoIAlign over both levels, box head,
    # post-processing) on the same backbone: 150 proposals per level before the RPN's
    # NMS and up to 300 after it, so its kept proposals end in padding rows
    # (edgecv.frontend.onnx.torchvision_rcnn); a threshold where the seeded weights pass
    # a few dozen detections
    "tiny_faster_rcnn": (
        128,
        {
            "rpn_pre_nms_top_n_test": 150,
            "rpn_post_nms_top_n_test": 300,
            "box_score_thresh": 0.26,
        },
    ),
    # torchvision's MaskRCNN class on it: Faster R-CNN's parts, a second
    # MultiScaleRoIAlign (14x14) on the detections, a one-convolution mask head and the
    # masks pasted into the image (edgecv.frontend.onnx.torchvision_masks)
    "tiny_mask_rcnn": (
        128,
        {
            "rpn_pre_nms_top_n_test": 150,
            "rpn_post_nms_top_n_test": 300,
            "box_score_thresh": 0.26,
        },
    ),
    # torchvision's KeypointRCNN class on it: a second MultiScaleRoIAlign (14x14), a
    # one-convolution keypoint head, 17 heatmaps of 56x56 per detection turned into
    # keypoints (edgecv.frontend.onnx.torchvision_keypoints)
    "tiny_keypoint_rcnn": (
        128,
        {
            "rpn_pre_nms_top_n_test": 150,
            "rpn_post_nms_top_n_test": 300,
            "box_score_thresh": 0.26,
        },
    ),
}


class TinyBackbone(torch.nn.Module):
    """Feature maps at 1/4 and 1/8 of the input, 32 channels each (``out_channels`` is
    what torchvision's detection heads read)."""

    out_channels = 32

    def __init__(self) -> None:
        super().__init__()
        conv = torch.nn.Conv2d
        self.stem = torch.nn.Sequential(
            conv(3, 32, 3, 2, 1), torch.nn.ReLU(), conv(32, 32, 3, 2, 1), torch.nn.ReLU()
        )
        self.down = torch.nn.Sequential(conv(32, 32, 3, 2, 1), torch.nn.ReLU())

    def forward(self, x):
        c4 = self.stem(x)
        return {"0": c4, "1": self.down(c4)}


def build(name: str, size: int, kwargs: dict) -> torch.nn.Module:
    """The model ``name`` without trained weights."""
    if not name.startswith("tiny_"):
        return torchvision.models.get_model(name, weights=None, weights_backbone=None, **kwargs)
    from torchvision.models import detection

    sizes = dict(min_size=size, max_size=size, num_classes=5, **kwargs)
    if name == "tiny_retinanet":
        anchors = detection.anchor_utils.AnchorGenerator(((16,), (32,)), ((0.5, 1.0, 2.0),) * 2)
        return detection.RetinaNet(TinyBackbone(), anchor_generator=anchors, **sizes)
    if name == "tiny_faster_rcnn":
        return _tiny_faster_rcnn(sizes)
    if name == "tiny_mask_rcnn":
        return _tiny_mask_rcnn(sizes)
    if name == "tiny_keypoint_rcnn":
        return _tiny_keypoint_rcnn(sizes)
    anchors = detection.anchor_utils.AnchorGenerator(((16,), (32,)), ((1.0,),) * 2)
    return detection.FCOS(TinyBackbone(), anchor_generator=anchors, **sizes)


def _tiny_faster_rcnn(sizes: dict) -> torch.nn.Module:
    """FasterRCNN on :class:`TinyBackbone`: the RoIs pooled 7x7 from the level of their
    size (canonical scale 64: below 32 pixels the first level, above it the second, so
    both are used at 128x128), a box head of 128 features."""
    from torchvision.models import detection
    from torchvision.ops import MultiScaleRoIAlign

    anchors = detection.anchor_utils.AnchorGenerator(((16,), (32,)), ((0.5, 1.0, 2.0),) * 2)
    pool = MultiScaleRoIAlign(["0", "1"], 7, 2, canonical_scale=64)
    head = detection.faster_rcnn.TwoMLPHead(TinyBackbone.out_channels * 7 * 7, 128)
    predictor = detection.faster_rcnn.FastRCNNPredictor(128, sizes.pop("num_classes"))
    return detection.FasterRCNN(
        TinyBackbone(),
        rpn_anchor_generator=anchors,
        box_roi_pool=pool,
        box_head=head,
        box_predictor=predictor,
        **sizes,
    )


def _tiny_mask_rcnn(sizes: dict) -> torch.nn.Module:
    """:func:`_tiny_faster_rcnn`'s model with torchvision's mask branch: the detections
    pooled 14x14 from the level of their size, one 3x3 convolution of 32 channels, the
    predictor's 28x28 mask per class."""
    from torchvision.models import detection
    from torchvision.ops import MultiScaleRoIAlign

    classes = sizes["num_classes"]
    faster = _tiny_faster_rcnn(sizes)
    faster.roi_heads.mask_roi_pool = MultiScaleRoIAlign(["0", "1"], 14, 2, canonical_scale=64)
    faster.roi_heads.mask_head = detection.mask_rcnn.MaskRCNNHeads(32, (32,), 1)
    faster.roi_heads.mask_predictor = detection.mask_rcnn.MaskRCNNPredictor(32, 32, classes)
    return faster


def _tiny_keypoint_rcnn(sizes: dict) -> torch.nn.Module:
    """:func:`_tiny_faster_rcnn`'s model with torchvision's keypoint branch: the
    detections pooled 14x14 from the level of their size, one 3x3 convolution of 32
    channels, the predictor's 17 heatmaps (56x56)."""
    from torchvision.models import detection
    from torchvision.ops import MultiScaleRoIAlign

    faster = _tiny_faster_rcnn(sizes)
    heads = faster.roi_heads
    heads.keypoint_roi_pool = MultiScaleRoIAlign(["0", "1"], 14, 2, canonical_scale=64)
    heads.keypoint_head = detection.keypoint_rcnn.KeypointRCNNHeads(32, (32,))
    heads.keypoint_predictor = detection.keypoint_rcnn.KeypointRCNNPredictor(32, 17)
    return faster


def output_names(net: torch.nn.Module) -> list[str]:
    """The names of the outputs, in the order of the model's result: the two-stage
    detectors (Faster R-CNN) return boxes, labels, scores; the one-stage ones boxes,
    scores, labels."""
    from torchvision.models.detection.generalized_rcnn import GeneralizedRCNN

    if isinstance(net, GeneralizedRCNN):
        heads = net.roi_heads
        masks = ["masks"] if heads.has_mask() else []
        keypoints = ["keypoints", "keypoints_scores"] if heads.has_keypoint() else []
        return ["boxes", "labels", "scores", *masks, *keypoints]
    return ["boxes", "scores", "labels"]


def export(name: str, size: int, kwargs: dict, out: Path) -> Path:
    torch.manual_seed(0)
    net = build(name, size, kwargs)
    x = torch.rand(1, 3, size, size)
    with tempfile.TemporaryDirectory() as tmp:
        full = Path(tmp) / f"{name}.onnx"
        torch.onnx.export(
            net.eval(),
            (x,),
            str(full),
            input_names=["image"],
            output_names=output_names(net),
            opset_version=17,
            dynamo=False,
        )
        model = onnx.load(str(full))
    path = out / f"{name}.onnx"
    onnx.save(strip(model), str(path))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=list(MODELS), help="models to export")
    # beside, not among, the classifiers test_onnx_deploy.py deploys (onnx_models/*.onnx)
    parser.add_argument("--out", type=Path, default=HERE / "detection", help="folder")
    args = parser.parse_args()
    for name in args.names:  # another torchvision detector: at 320x320
        size, kwargs = MODELS.get(name, (320, {"min_size": 320, "max_size": 320}))
        path = export(name, size, kwargs, args.out)
        print(f"{path.name}: {path.stat().st_size / 1024:.1f} KiB")


if __name__ == "__main__":
    main()
