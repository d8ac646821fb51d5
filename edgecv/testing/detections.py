"""Detections against their reference, row by row: (ids, scores, boxes) of a detector,
rows whose scores tie compared as sets, within the tolerance table."""

from __future__ import annotations

import numpy as np

from .tolerances import TOLERANCES, assert_close


def match_detections(
    ours: list[np.ndarray],
    ref: list[np.ndarray],
    loosen: float = 1.0,
    box_scale: float = 1.0,
    cut: list[int] | None = None,
) -> int:
    """Compare (ids, scores, boxes); return the number of valid detections compared.

    Rows are walked in MXNet's order. A run of rows whose reference scores are each
    equal to the one before within the float32 tolerance is a tie: MXNet's sort and
    ours may order it differently without either being wrong, so within the run the
    rows are matched as a set (sorted by id then box). Everything else must match
    position by position. Boxes are decoded from pixel-sized anchors (``corner =
    anchor + offset``), so their rounding is relative to ``box_scale`` (the input
    size), not to the corner's own value, which can be near 0 after cancellation.

    A tie that runs into the end of a full output (every row valid: the output was
    cut inside the tie, by ``topk`` or its length) is the one place where which rows
    are in the output is not decided by the scores: candidates beyond the cut tie with
    those inside it, and rounding picks. Random-weight SSD-VGG scores all 100 rows
    within 3e-7 of each other out of thousands. Given a list ``cut``, such a group
    whose rows differ is compared by its scores only and its row count appended to
    ``cut``; without it (the zoo models' parity tests) every row must match.
    """
    ids, scores = (o[0].reshape(o.shape[1], -1) for o in ours[:2])
    rids, rscores = (o[0].reshape(o.shape[1], -1) for o in ref[:2])
    rtol, atol = TOLERANCES["float32"]
    rows = ids.shape[0]
    i = 0
    while i < rows:
        j = i + 1
        # the run goes on while each row ties with the one before it (0.33709, 0.33707,
        # 0.33707: the last two swapped places in YOLOv3's output, out of the first's
        # reach but tied with each other)
        while j < rows and abs(rscores[j, 0] - rscores[j - 1, 0]) <= loosen * (
            atol + rtol * abs(rscores[j - 1, 0])
        ):
            j += 1
        try:
            _match_rows(ours, ref, i, j, loosen, box_scale)
        except AssertionError:
            # a tie reaching the end of a full output: which tied candidates made the
            # cut is rounding's choice; their scores must still match
            full = (rids[:, 0] >= 0).all() and (ids[:, 0] >= 0).all()
            if cut is None or not (j == rows and j - i > 1 and full):
                raise
            assert_close(
                np.sort(scores[i:j, 0]),
                np.sort(rscores[i:j, 0]),
                f"scores of the tie cut at the end, rows {i}:{j}",
                loosen,
            )
            cut.append(j - i)
        i = j
    return int((rids[:, 0] >= 0).sum())


def _match_rows(ours, ref, i: int, j: int, loosen: float, box_scale: float) -> None:
    """Rows ``i:j`` of (ids, scores, boxes), as a set when they are a tie."""
    ours_rows, ref_rows = (
        np.concatenate([o[0][i:j].reshape(j - i, -1) for o in x], axis=1) for x in (ours, ref)
    )
    if j - i > 1:
        ours_rows, ref_rows = _by_class_and_box(ours_rows), _by_class_and_box(ref_rows)
    np.testing.assert_array_equal(ours_rows[:, 0], ref_rows[:, 0], err_msg=f"ids, rows {i}:{j}")
    assert_close(ours_rows[:, 1:2], ref_rows[:, 1:2], f"scores, rows {i}:{j}", loosen)
    # Box sizes are exp(std * d) * anchor: a relative error e in the regression d
    # becomes std * |d| * e in the box, on top of the corner = center +- size/2
    # cancellation; boxes get 10x the tolerance of the scores for that.
    assert_close(ours_rows[:, 2:], ref_rows[:, 2:], f"boxes, rows {i}:{j}", 10 * loosen, box_scale)


def _by_class_and_box(rows: np.ndarray) -> np.ndarray:
    """(id, score, box) rows sorted by id, then box corners rounded to a pixel, then
    score: the score, which differs within tolerance, must not order two tied rows, and
    neither may a box corner's last bits."""
    boxes = np.round(rows[:, 2:]).T[::-1]
    return rows[np.lexsort((rows[:, 1], *boxes, rows[:, 0]))]


def is_detection(outputs: list) -> bool:
    """(ids, scores, boxes, ...) of a detector: (1, N, 1), (1, N, 1), (1, N, 4)."""
    if len(outputs) < 3:
        return False
    shapes = [np.shape(o) for o in outputs[:3]]
    return all(len(s) == 3 and s[:2] == shapes[0][:2] for s in shapes) and [
        s[2] for s in shapes
    ] == [1, 1, 4]
