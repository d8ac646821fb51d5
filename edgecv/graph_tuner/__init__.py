"""The graph tuner: a data layout per convolution, chosen by dynamic programming over
measured kernel and layout-transform times.

- :mod:`.graph`: the layout graph and Relax's layout rules, in plain Python;
- :mod:`.extract`: Relax ``main`` -> layout graph;
- :mod:`.solver`: exact DP over the graph (states carry every live branch's layout),
  iterated greedy when the states explode;
- :mod:`.costs`, :mod:`.measure`, :mod:`.devices`: kernel and transform times, measured
  on the device and cached;
- :mod:`.apply`, :mod:`.activations`: the plan applied with Relax's ``ConvertLayout``
  (the lowering legalizes packed convolutions to ``conv2d_NCHWc``-style computes and
  Winograd's: :mod:`edgecv.lowering.legalize`, :mod:`edgecv.lowering.winograd`);
- :mod:`.stage`: all of it as the pipeline stage before the Relax passes.
"""

from .stage import LAYOUT_MODES, choose_layouts

__all__ = ["LAYOUT_MODES", "choose_layouts"]
