"""Where does edgecv first depart from MXNet? A stage-by-stage probe of one model.

A whole-model comparison (:func:`edgecv.testing.compare_with_mxnet`) says *that* a
package's outputs differ from MXNet's; this probe says *where*. It runs both on the
same weights and input and compares every chosen internal output of the MXNet graph
(``sym.get_internals()``): MXNet's values come from one forward pass of the graph with
those outputs as heads; edgecv's from deploying the graph cut at the same nodes (the
same sub-graph with those outputs as its heads: one package, one run). The plan of a
package does not keep which MXNet node wrote which buffer, and fusion leaves most
intermediate values in no buffer at all, so cutting the graph is what gives edgecv's
value of a node.

What counts as a departure is measured, not assumed: MXNet is run again with every
input element moved by one float32 step (``np.nextafter``, up or down at random) in a
few random directions, and the largest change of each internal output is MXNet's own
*drift* there. A stage departs when edgecv's difference from MXNet exceeds ``factor``
times that drift (at least one float32 rounding step of the stage's largest value), or
when it changes a detection-style result (sorted indices, NMS keep lists) that MXNet's
own drift does not change.
A sort or selection stage that differs is run again alone on MXNet's values of its
inputs: if it then gives MXNet's answer, the difference is a tie that rounding broke,
and the stages after it follow that tie (``StageDifference.tie``, ``follows_tie``).

    python -m edgecv.testing.probe model-symbol.json model-0000.params --shape 1,3,512,512

``divergence.py`` runs the passes, ``graph.py`` names the stages and runs both sides,
``stages.py`` judges one stage, ``ties.py`` tells ties from departures, ``report.py``
holds the result.
"""

from .divergence import probe_divergence
from .report import DivergenceReport, StageDifference

__all__ = ["DivergenceReport", "StageDifference", "probe_divergence"]
