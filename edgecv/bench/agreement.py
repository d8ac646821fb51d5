"""How far a baseline's outputs are from edgecv's: the largest difference over the
reference's scale, and whether the top class (or the top detection's) agrees."""

from __future__ import annotations

import numpy as np

from ..testing import TOLERANCES


def agreement(ours: list[np.ndarray], theirs: list[np.ndarray], detection: bool = False) -> dict:
    """Largest difference over all outputs, relative to the reference's scale, and
    whether the top class (classifiers) or the top detection's class agrees.

    A detector's (ids, scores, boxes) list detections by score: rows whose reference
    scores are equal within float32 rounding come in either order from two correct
    runtimes, so each such run of rows is compared sorted by class and box.
    """
    if len(ours) != len(theirs):
        return {"error": f"{len(theirs)} outputs, edgecv has {len(ours)}"}
    theirs = [
        np.asarray(b).reshape(a.shape) if np.size(b) == np.size(a) else np.asarray(b)
        for a, b in zip(ours, theirs, strict=True)
    ]
    for a, b in zip(ours, theirs, strict=True):
        if np.shape(a) != np.shape(b):
            return {"error": f"output shapes {np.shape(b)} vs edgecv {np.shape(a)}"}
    if detection and len(ours) == 3 and len({np.shape(a)[:2] for a in ours}) == 1:
        ours, theirs = [_sorted_within_ties(o, theirs[1]) for o in (ours, theirs)]
        same_top = bool(ours[0].reshape(-1)[0] == theirs[0].reshape(-1)[0])
    else:
        same_top = bool(np.argmax(ours[0].reshape(-1)) == np.argmax(theirs[0].reshape(-1)))
    worst = 0.0
    for a, b in zip(ours, theirs, strict=True):
        scale = max(1.0, float(np.abs(b).max(initial=0.0)))
        worst = max(worst, float(np.abs(a.astype(np.float64) - b).max(initial=0.0)) / scale)
    return {"max_rel_diff": worst, "same_top1": same_top}


def _sorted_within_ties(outputs: list[np.ndarray], ref_scores: np.ndarray) -> list[np.ndarray]:
    """(ids, scores, boxes) with each run of rows whose ``ref_scores`` tie (within the
    float32 tolerance) sorted by class, then box; ``ref_scores`` are the reference's,
    so both sides are cut into the same runs."""
    rtol, atol = TOLERANCES["float32"]
    batch, rows = outputs[1].shape[:2]
    table = np.concatenate([o.reshape(batch, rows, -1) for o in outputs], -1)
    scores = ref_scores.reshape(batch, rows)
    for n in range(batch):
        start = 0
        while start < rows:
            end = start + 1
            tie = atol + rtol * abs(float(scores[n, start]))
            while end < rows and abs(float(scores[n, end] - scores[n, start])) <= tie:
                end += 1
            run = table[n, start:end]
            table[n, start:end] = run[np.lexsort((run[:, 1], *run[:, :1:-1].T, run[:, 0]))]
            start = end
    widths = np.cumsum([o.reshape(batch, rows, -1).shape[-1] for o in outputs])[:-1]
    return [
        part.reshape(o.shape).astype(o.dtype)
        for part, o in zip(np.split(table, widths, -1), outputs, strict=True)
    ]
