"""Which of an ONNX graph's operators edgecv converts: TVM's converter table for the
default domain, and the operators a user registered (:func:`edgecv.register_op`, by op
type, custom domains included). The whole graph is checked before anything else is asked,
and every operator without a converter is named in one error, with its count."""

from __future__ import annotations

from ...board.errors import ConversionError, EdgecvError, UnsupportedOpsError
from ...op_registry import RegisteredOp, registered_op
from .model_file import DEFAULT_DOMAINS

# Nodes TVM's importer handles itself, outside its converter table.
_BUILT_IN = ("Constant", "If")
# Nodes no converter takes that edgecv's detection rewrite replaces in the forms it knows
# (torchvision's Mask and Keypoint R-CNN write their last step as a Loop): accepted here,
# and one that the rewrite left is refused by :func:`check_rewritten`.
_REWRITTEN = ("Loop",)


def supported_ops() -> list[str]:
    """The default-domain ONNX op types TVM's frontend converts."""
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    return sorted({*_get_convert_map(), *_BUILT_IN, *_REWRITTEN})


def check_rewritten(model, source: str) -> None:
    """Refuse, in one line, a node of :data:`_REWRITTEN` that the rewrites left."""
    left = sorted({n.op_type for n in model.graph.node if n.op_type in _REWRITTEN})
    if left:
        raise ConversionError(
            f"{source}: {', '.join(left)} has no converter; edgecv replaces it only in "
            f"torchvision's Mask R-CNN and Keypoint R-CNN (the masks pasted into the image, "
            f"the heatmaps' keypoints: docs/models.md, torchvision's detectors): replace it "
            f"in the model or register a custom op"
        )


def _nodes(graph):
    """Every node of ``graph`` and of the graphs nested in its attributes (If branches)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in (*([attr.g] if attr.HasField("g") else []), *attr.graphs):
                yield from _nodes(sub)


def _label(node) -> str:
    return node.op_type if node.domain in DEFAULT_DOMAINS else f"{node.domain}::{node.op_type}"


def registered_ops(model) -> dict[str, RegisteredOp]:
    """The op types of ``model`` a registered operator converts, by op type; raises one
    :class:`UnsupportedOpsError` naming every op type nothing converts.

    A node of a custom domain is converted only by a registered operator of its op type;
    a default-domain node by TVM's converter, or by a registered operator when TVM has
    none (registering a standard op type that TVM converts is refused, as for MXNet).
    """
    table = set(supported_ops())
    missing: dict[str, int] = {}
    chosen: dict[str, RegisteredOp] = {}
    for node in _nodes(model.graph):
        custom = node.domain not in DEFAULT_DOMAINS
        registered = registered_op(node.op_type)
        if registered is not None and not custom and node.op_type in table:
            raise EdgecvError(
                f"`{node.op_type}` is registered with edgecv.register_op, but edgecv converts "
                "this standard ONNX op already; register your operator under the op type of "
                "a custom domain"
            )
        if registered is not None:
            chosen[node.op_type] = registered
        elif custom or node.op_type not in table:
            missing[_label(node)] = missing.get(_label(node), 0) + 1
    if missing:
        raise UnsupportedOpsError(missing, sorted(table), frontend="ONNX")
    return chosen
