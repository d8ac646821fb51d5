"""One stage of the probe judged: edgecv's difference from MXNet against MXNet's own
drift under one-step moves of the input; index outputs by their sets and order, row
outputs (NMS keep lists, sorted values) by rows matched as sets."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .report import StageDifference

# Outputs that are indices of a ranking: argsort's output, topk's indices. Their values
# are positions; what matters is which positions a row holds (as a set) and their order.
_INDEX_OPS = {"argsort"}
# Outputs whose rows may reorder or be replaced by a near tie (NMS keep lists, sorted
# values, proposals): their values are compared sorted, their rows matched as sets.
_ROW_OPS = {
    "_contrib_box_nms",
    "_contrib_box_non_maximum_suppression",
    "_contrib_MultiBoxDetection",
    "_contrib_Proposal",
    "_contrib_MultiProposal",
    "sort",
}
# Rows of a row output match when every field is within this fraction of the output's
# largest magnitude (10x the float32 atol of edgecv.testing.TOLERANCES: the boxes' rule).
_ROW_MATCH = 1e-4


@dataclass
class _Drift:
    """How far one of MXNet's one-step runs moved a stage: the largest change (of the
    sorted values for row outputs), and whether it changed index sets or kept rows
    (``sets``) or index positions (``order``)."""

    value: float
    sets: bool = False
    order: bool = False


def _scale(ref: np.ndarray) -> float:
    """The largest finite magnitude of MXNet's output (NaNs, MXNet's own where it reads
    memory it never wrote, are compared by position in _max_abs)."""
    largest = 0.0
    for (b,) in _blocks(ref):
        largest = max(largest, float(np.abs(b[np.isfinite(b)]).max(initial=0.0)))
    return largest


def _axis(attrs: dict) -> int | None:
    return int(attrs.get("axis", -1)) if str(attrs.get("axis", "-1")) != "None" else None


def _drift(op: str, attrs: dict, name: str, moved: np.ndarray, ref: np.ndarray) -> _Drift:
    moved, ref = np.asarray(moved), np.asarray(ref)
    if moved.shape != ref.shape:
        return _Drift(np.inf, True, True)
    kind = _kind(op, attrs, name)
    if kind == "rows":
        drift = _Drift(_max_abs(np.sort(moved, axis=None), np.sort(ref, axis=None)))
    else:
        drift = _Drift(_max_abs(moved, ref))
    if kind == "index":
        drift.sets = _index_sets_differ(moved, ref, _axis(attrs))
        drift.order = bool((moved != ref).any())
    elif kind == "rows":
        tol = _ROW_MATCH * max(_scale(ref), 1.0)
        drift.sets = sum(_unmatched_rows(moved, ref, tol)) > 0
    return drift


def _compare_stage(name, op, attrs, ours, ref, drifts: list[_Drift], factor) -> StageDifference:
    ours, ref = np.asarray(ours), np.asarray(ref)
    if ours.shape != ref.shape:
        return StageDifference(
            name, op, np.inf, 0.0, np.inf, True, detail=f"shape {ours.shape} != MXNet's {ref.shape}"
        )
    kind = _kind(op, attrs, name)
    mine = _drift(op, attrs, name, ours, ref)  # edgecv's difference, measured as a drift is
    diff = mine.value
    drift = max((d.value for d in drifts), default=0.0)
    scale = _scale(ref)
    step = max(np.finfo(np.float32).eps * scale, float(np.finfo(np.float32).tiny))
    ratio = diff / (drift if drift > step else step)
    departs = bool(ratio > factor)
    sets = drift_sets = None
    detail = ""
    if kind == "index":
        sets, drift_sets = mine.sets, any(d.sets for d in drifts)
        drift_order = any(d.order for d in drifts)
        departs = (sets and not drift_sets) or (mine.order and not drift_order)
        detail = f"{int((ours != ref).sum())} positions differ" if mine.order else ""
    elif kind == "rows":
        only_mx, only_ours = _unmatched_rows(ours, ref, _ROW_MATCH * max(scale, 1.0))
        sets, drift_sets = bool(only_mx or only_ours), any(d.sets for d in drifts)
        departs = departs or (sets and not drift_sets)
        if sets:
            detail = f"{only_mx} rows only in MXNet's, {only_ours} only in edgecv's"
    return StageDifference(
        name, op, diff, drift, float(ratio), bool(departs), sets, drift_sets, detail, scale
    )


def _kind(op: str, attrs: dict, name: str) -> str:
    """``index`` (positions of a ranking), ``rows`` (rows that may reorder) or ``values``."""
    if op in _INDEX_OPS:
        return "index"
    if op == "topk":
        ret = attrs.get("ret_typ", "indices")
        index_output = {"indices": "0", "both": "1"}.get(ret)
        position = name.rpartition("_output")[2] or "0"
        if index_output == position:
            return "index"
        return "rows" if ret in ("value", "both") else "values"
    return "rows" if op in _ROW_OPS else "values"


def _max_abs(a: np.ndarray, b: np.ndarray) -> float:
    """The largest absolute difference; NaN on both sides at a position is no difference,
    NaN on one side an infinite one."""
    largest = 0.0
    for x, y in _blocks(a, b):
        d = np.where(np.isnan(x) & np.isnan(y), 0.0, np.abs(x - y))
        largest = max(largest, float(np.nan_to_num(d, nan=np.inf).max(initial=0.0)))
    return largest


# elements compared at a time: a mask head's stage holds 200 million, and whole float64
# copies of it (and of its differences) took gigabytes per comparison
_BLOCK = 1 << 22


def _blocks(*arrays: np.ndarray):
    """The arrays' elements, flat, ``_BLOCK`` at a time, as float64."""
    flat = [np.asarray(a).reshape(-1) for a in arrays]
    for start in range(0, flat[0].size, _BLOCK):
        yield [f[start : start + _BLOCK].astype(np.float64) for f in flat]


def _index_sets_differ(ours: np.ndarray, ref: np.ndarray, axis: int | None) -> bool:
    """Whether any row (along ``axis``) holds another set of indices."""
    return not np.array_equal(np.sort(ours, axis=axis), np.sort(ref, axis=axis))


def _unmatched_rows(ours: np.ndarray, ref: np.ndarray, tol: float) -> tuple[int, int]:
    """Valid rows (not all -1) of MXNet's with no row of edgecv's within ``tol`` in every
    field, and the other way round: boxes one side kept and the other did not."""
    width = ref.shape[-1] if ref.ndim >= 2 else 1
    a = np.asarray(ours, np.float64).reshape(-1, width)
    b = np.asarray(ref, np.float64).reshape(-1, width)
    a, b = a[~(a == -1).all(1)], b[~(b == -1).all(1)]

    def unmatched(x, y):
        if not len(y):
            return len(x)
        if np.isfinite(x).all() and np.isfinite(y).all():
            # a row matches when its nearest row in the max-norm is within tol: a k-d tree
            # answers that in n log n (80,000 kept rows of an R-CNN's final NMS, compared
            # pair by pair, took a probe's pass many minutes)
            from scipy.spatial import cKDTree

            bound = float(np.nextafter(tol, np.inf))
            distance, _ = cKDTree(y).query(x, k=1, p=np.inf, distance_upper_bound=bound)
            return int((~(distance <= tol)).sum())
        count = 0
        for start in range(0, len(x), 256):  # bounded memory: 256 x len(y) x width
            chunk = x[start : start + 256]
            close = (np.abs(chunk[:, None, :] - y[None, :, :]) <= tol).all(-1).any(1)
            count += int((~close).sum())
        return count

    return unmatched(b, a), unmatched(a, b)
