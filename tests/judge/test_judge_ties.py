"""Ties and coordinates of the judge: a position past a row's length is
never a tie whatever the scores say, with or without the rows' lengths; accepted ties appear in
the stage report's text; a cache's rows are named by their slots.

Scores are written by hand: a row of 16 candidates with distinct finite scores, one visible
candidate scored ``-inf`` (finite weights can drive a visible score there) and every position
from the row's length 10 on ``-inf`` (not seen)."""

from __future__ import annotations

import numpy as np
import pytest
from tilesim.reference.judging import judge
from tilesim.reference.judging.indexer import judge_ids
from tilesim.reference.judging.stages import judge_output, output_spec

LENGTH = 10


def _scores() -> np.ndarray:
    s = np.linspace(1.0, 0.1, 16).astype(np.float32)
    s[5] = -np.inf  # visible, scored -inf
    s[LENGTH:] = -np.inf  # not seen
    return s[None]


def _golden() -> np.ndarray:
    return np.arange(8, dtype=np.int32)[None]  # topk 8 of the 10 visible positions


@pytest.mark.parametrize("lengths", [None, np.array([LENGTH])], ids=["no_lengths", "lengths"])
def test_a_position_past_the_row_length_is_never_a_tie(lengths):
    """Id 5 (visible, -inf) swapped for 12 (past the length, -inf): the two scores are equal,
    yet the row is wrong."""
    dev = _golden().copy()
    dev[0, 5] = 12
    v = judge_ids(dev, _golden(), scores=_scores(), visible=lengths)
    assert not v.passed and v.failed == ["id sets"], v.summary()
    assert not v.ids.tied and len(v.ids.wrong) == 1
    assert "replaces" not in v.summary()


def test_two_visible_minus_inf_scores_tie_when_the_lengths_say_both_are_seen():
    """With the lengths, -inf on two visible positions is a tie like any equal pair: id 5 and
    id 8 (made -inf, visible) swap."""
    s = _scores().copy()
    s[0, 8] = -np.inf
    dev = _golden().copy()
    dev[0, 5] = 8
    v = judge_ids(dev, _golden(), scores=s, visible=np.array([LENGTH]))
    assert v.passed and len(v.ids.tied) == 1, v.summary()
    w = judge_ids(dev, _golden(), scores=s)  # without the lengths: not trusted
    assert not w.passed, w.summary()


def test_a_finite_tie_is_accepted_without_the_lengths():
    s = _scores().copy()
    s[0, 9] = s[0, 7]
    dev = _golden().copy()
    dev[0, 7] = 9
    v = judge_ids(dev, _golden(), scores=s)
    assert v.passed and v.ids.tied[0].ties == [(9, 7, float(s[0, 7]), float(s[0, 7]))]


def test_accepted_ties_appear_in_the_stage_report_text():
    s = _scores().copy()
    s[0, 9] = s[0, 7]
    dev = _golden().copy()
    dev[0, 7] = 9
    spec = output_spec("topk_indices", "int8", {})
    res = judge_output("topk_indices", dev, _golden(), spec, scores=s,
                       visible=np.array([LENGTH]))  # fmt: skip
    assert res.passed
    text = "\n".join(res.lines())
    assert "id 9 replaces 7: golden scores tie" in text, text
    assert "1 rows accepted by score ties" in text, text


def test_row_labels_name_rows_and_elements():
    g = np.ones((3, 4), np.float32)
    a = g.copy()
    a[1, 2] = np.nan
    a[2, 0] = 1.5
    v = judge(a, g, {"atol": 0.0, "rtol": 0.0, "ratio": 0.0, "mode": "compare"},
              row_labels=np.array([870, 938, 939]))  # fmt: skip
    assert v.nonfinite == [((938, 2), "nan")]
    assert v.seeds.max_abs_pos == (939, 0)
    assert all(w[0][0] in (938, 939) for w in v.seeds.worst)
    worst = next(c for c in v.checks if c.name == "relative L2 (worst row)")
    assert worst.where in ((938,), (939,))
    with pytest.raises(ValueError, match="row_labels"):
        judge(a, g, {"atol": 0.0, "rtol": 0.0, "ratio": 0.0, "mode": "compare"},
              row_labels=[1, 2])  # fmt: skip


@pytest.mark.parametrize("visible, exc, words", [
    (np.array([10.0]), TypeError, "visible: expected integer lengths"),
    (np.array([True]), TypeError, "visible: expected integer lengths"),
    (np.array([[LENGTH]]), ValueError, r"visible: expected 1 lengths \[rows\]"),
    (np.array([-1]), ValueError, r"visible\[0\]: expected a length in \[0, 16\]"),
    (np.array([17]), ValueError, r"visible\[0\]: expected a length in \[0, 16\] \(the scores'"),
    (np.array([2**63 + 1], np.uint64), ValueError, r"visible\[0\]: expected a length in \[0, 16\]"),
])  # fmt: skip
def test_bad_visible_lengths_are_named(visible, exc, words):
    """The rows' lengths: integers (a TypeError otherwise), one per id row, each at most the
    scores' candidates (a longer row would see columns the scores do not have)."""
    with pytest.raises(exc, match=words):
        judge_ids(_golden(), _golden(), scores=_scores(), visible=visible)


def test_without_scores_a_length_past_int64_is_refused():
    """No scores bound the lengths; one above the INT64 maximum would wrap negative."""
    with pytest.raises(
        ValueError, match=r"visible\[0\]: expected a length in \[0, 9223372036854775807\]"
    ):
        judge_ids(_golden(), _golden(), visible=np.array([2**64 - 1], np.uint64))


@pytest.mark.parametrize("which", ["actual", "golden"])
def test_uint64_ids_past_int64_are_refused(which):
    """Ids are read as INT64 (-1 = an empty slot): 2**64 - 1 would read as an empty slot and
    match a golden's -1, so it is refused, naming the argument."""
    ids = np.array([[0, 1, -1]], np.int64)
    wide = ids.astype(np.uint64)  # -1 becomes 2**64 - 1
    pair = {"actual": wide, "golden": ids} if which == "actual" else {"actual": ids, "golden": wide}
    tol = {"mode": "set", "atol": 0.0, "rtol": 0.0, "ratio": 0.0}
    with pytest.raises(ValueError, match=rf"^{which}: expected ids within the INT64 range"):
        judge(pair["actual"], pair["golden"], tol, kind="ids")
