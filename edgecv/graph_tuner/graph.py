"""The layout graph: what the graph tuner knows of a model, in plain Python.

One :class:`LayoutNode` per tensor-producing binding of the Relax ``main`` function (plus the
inputs, the constants and one node for the function's outputs), in binding order,
which is a topological order. Convolutions choose their layout among their
``candidates``; every other node's layout follows from its inputs' layouts by the
same rules Relax's ``ConvertLayout`` applies (its ``FRelaxInferLayout`` functions),
so the transforms a plan predicts are the transforms the pass inserts:

========  ==========================================================================
kind      rule (``resolve``)
========  ==========================================================================
input     the function's input: plain NCHW
const     a constant: plain, and transforming it is free (``FoldConstant`` does it)
conv      its chosen layout: input in that layout when the input channels divide
          into its block, else plain NCHW (the first convolution, 3 channels);
          output in that layout
follow    one tensor input (elementwise, pooling, spatial reductions): its layout
binary    elementwise with two tensor inputs (residual add): a packed input's
          layout wins; the other input is transformed (invalid when its channels do
          not divide into the block: a channel-wise sum kept as 1 channel)
concat    every input's layout when they all agree, else plain NCHW for all
fixed     anything else (reshape, transpose, dense, detection operators, outputs):
          every input plain
========  ==========================================================================

TVM 0.27's ``ConvertLayout`` cannot convert between two packings (``NCHW8c`` to
``NCHW16c``: it fails on "Invalid layout axis"), so a plan that would need it, by a
transform or by a binary op or concat meeting two packings, is :data:`INVALID`: the
solver never chooses it. Packings meet only through plain tensors.

Layouts are strings: plain ``NCHW`` (``NC`` for rank 2, and so on) and packed
``NCHW8c`` (the channel axis split into blocks of 8, the block innermost).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

KINDS = ("input", "const", "conv", "follow", "binary", "concat", "fixed")
# The layout of a node no plan may produce (see the module docstring).
INVALID = "invalid"
_PLAIN_AXES = "NCHWDE"


def plain(rank: int) -> str:
    """The plain layout of a rank-``rank`` tensor whose axis 1 is the channel axis."""
    return _PLAIN_AXES[:rank] if rank <= len(_PLAIN_AXES) else "?" * rank


def packed(rank: int, block: int) -> str:
    """The layout of a rank-``rank`` tensor with its channels in blocks of ``block``."""
    return f"{plain(rank)}{block}c"


def block_of(layout: str) -> int:
    """The channel block of ``layout`` (1 for a plain layout)."""
    match = re.search(r"(\d+)c$", layout)
    return int(match.group(1)) if match else 1


def is_packed(layout: str) -> bool:
    return block_of(layout) > 1


def convertible(src: str, dst: str) -> bool:
    """Whether Relax can transform a tensor from ``src`` to ``dst`` (see the module
    docstring)."""
    return src == dst or not (is_packed(src) and is_packed(dst))


def with_rank(layout: str, rank: int) -> str:
    """``layout``'s packing applied to a tensor of rank ``rank`` (a reduction's output)."""
    block = block_of(layout)
    return packed(rank, block) if block > 1 else plain(rank)


@dataclass
class LayoutNode:
    """One tensor of the model and how its layout is decided (see the module docstring).

    ``shape`` is the logical (NCHW) shape of the node's output; ``inputs`` are the
    indices of the nodes it reads, in argument order; ``candidates`` the layouts a
    convolution may run in (plain first); ``name`` the Relax variable it binds.
    """

    name: str
    kind: str
    inputs: tuple[int, ...] = ()
    shape: tuple[int, ...] = ()
    candidates: tuple[str, ...] = ()
    op: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"node {self.name}: kind must be one of {KINDS}, not {self.kind!r}")

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass
class LayoutGraph:
    """Nodes in topological order (every input index is smaller than its node's)."""

    nodes: list[LayoutNode] = field(default_factory=list)
    _names: set[str] = field(default_factory=set, repr=False)

    def add(self, node: LayoutNode) -> int:
        """Append ``node``; its name is made unique (``#index`` appended on a clash)."""
        if any(i >= len(self.nodes) for i in node.inputs):
            raise ValueError(f"node {node.name} reads a node that comes after it")
        if node.name in self._names:
            node.name = f"{node.name}#{len(self.nodes)}"
        self._names.add(node.name)
        self.nodes.append(node)
        return len(self.nodes) - 1

    def convs(self) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if n.kind == "conv"]

    def consumers(self) -> list[list[int]]:
        users: list[list[int]] = [[] for _ in self.nodes]
        for index, node in enumerate(self.nodes):
            for i in node.inputs:
                users[i].append(index)
        return users

    def choices(self, index: int) -> tuple[str, ...]:
        """What the solver may choose for node ``index``: a convolution's candidates;
        every other node has the one value ``""`` (its layout follows its inputs)."""
        node = self.nodes[index]
        return node.candidates if node.kind == "conv" and node.candidates else ("",)

    def resolve(
        self, index: int, input_layouts: Sequence[str], choice: str = ""
    ) -> tuple[tuple[str, ...], str]:
        """The layouts node ``index`` needs its inputs in, and its output layout, given
        its inputs' current layouts (and a convolution's ``choice``)."""
        node, nodes = self.nodes[index], self.nodes
        ranks = [nodes[i].rank for i in node.inputs]
        plain_inputs = tuple(plain(r) for r in ranks)
        if node.kind in ("input", "const"):
            return (), plain(node.rank)
        if node.kind == "conv":
            layout = choice or plain(node.rank)
            channels = nodes[node.inputs[0]].shape[1]
            data = layout if channels % block_of(layout) == 0 else plain(4)
            return (data, *plain_inputs[1:]), layout
        if node.kind == "follow":
            layout = input_layouts[0]
            return (layout, *plain_inputs[1:]), with_rank(layout, node.rank)
        if node.kind == "binary":
            return _binary(input_layouts, [nodes[i].shape for i in node.inputs], node.rank)
        if node.kind == "concat":
            layout = _concat(input_layouts, node.rank)
            if layout == INVALID:
                return tuple(input_layouts), layout
            return tuple(layout for _ in node.inputs), layout
        return plain_inputs, plain(node.rank)


def _binary(layouts: Sequence[str], shapes: Sequence[tuple[int, ...]], out_rank: int):
    """Relax's rule for broadcasting elementwise ops with two tensor inputs."""
    (a, b), (ra, rb) = layouts, [len(s) for s in shapes]
    if is_packed(a) and is_packed(b) and a != b:
        return (a, b), INVALID
    if (is_packed(a) or is_packed(b)) and ra == rb:
        winner = a if is_packed(a) else b
        if any(len(s) > 1 and s[1] % block_of(winner) for s in shapes):
            # a channel axis the block does not divide, broadcast against the packed
            # one (an L2 normalization's sum over channels, kept as 1): Relax cannot
            # pack it and ConvertLayout fails ("Cannot broadcast from 5 to 4")
            return (a, b), INVALID
        return (winner, winner), winner
    if ra == 0:
        return (a, b), b
    if rb == 0:
        return (a, b), a
    # Both plain, or a packed input broadcast against one of another rank: Relax
    # follows the lower-rank input's (plain) layout.
    out = plain(out_rank)
    return (plain(ra), plain(rb)), out


def _concat(layouts: Sequence[str], rank: int) -> str:
    """TVM 0.27's rule for a concatenation of inputs in ``layouts``."""
    if all(lay == layouts[0] for lay in layouts):
        return layouts[0]
    if len({lay for lay in layouts if is_packed(lay)}) > 1:
        return INVALID
    return plain(rank)
