"""The judge of the DeepSeek lightning indexer's two outputs, wherever they are judged (the
indexer and the decode step of :mod:`tilesim.reference.judge_plans`, the layer step's
``dsa_indexer`` stage of :mod:`tilesim.reference.judge_stages`):

* ``topk_indices`` — per-row id sets, tie-aware with the golden's ``scores``
  (:func:`judge_ids`, :data:`IDS_TOLERANCE`: no wrong row);
* ``scores`` FP32 ``[T, S]`` — a ``-inf`` of the golden (a position the row does not see) must
  be ``-inf`` in the dump ("visibility (-inf)"); the other elements are judged by the
  golden-aware checks alone, no published numbers (:func:`judge_scores`).
"""

from __future__ import annotations

import numpy as np
from tilesim.reference.judge import Check, Verdict, judge

#: the id judge of the indexer's ids: per-row sets, no wrong row
IDS_TOLERANCE = {"atol": 0.0, "rtol": 0.0, "ratio": 0.0, "mode": "set"}
#: the indexer's scores: no published numbers, the golden-aware checks judge them
SCORES_TOLERANCE = {"atol": None, "rtol": None, "ratio": 0.0, "mode": "ulp"}


def ids_tolerance(tol: dict) -> dict:
    """The id judge's tolerance under a case's ``tol``: set equality, the ``ratio`` of a
    set-mode tolerance (the indexer's) or 0 (the decode step's ``ratio`` is the attention's,
    per element)."""
    ratio = tol["ratio"] if tol["mode"] == "set" else 0.0
    return {**IDS_TOLERANCE, "ratio": ratio}


def judge_ids(actual, golden, *, scores=None, tolerance: dict = IDS_TOLERANCE,
              rule: str = "default", name: str = "topk_indices") -> Verdict:  # fmt: skip
    """The indexer's ids ``[T, topk]`` (int32 or int64, ``-1`` = an empty slot) against the
    golden's, tie-aware with the golden's ``scores`` ``[T, S]``."""
    return judge(actual, golden, tolerance, scores=scores, rule=rule, name=name,
                 kind="dsa_indexer")  # fmt: skip


def judge_scores(actual, golden, *, name: str = "scores", arithmetic: str = "float64") -> Verdict:
    """The indexer's FP32 scores ``[T, S]`` (module docstring); ``actual`` is not modified."""
    g = np.asarray(golden)
    a = np.asarray(actual)
    if a.size != g.size:
        raise ValueError(f"{name}: expected {g.size} scores, got {a.size}")
    a = a.reshape(g.shape)
    with np.errstate(invalid="ignore"):
        hidden = np.isneginf(g.astype(np.float64))
        differ = hidden != np.isneginf(a.astype(np.float64))
    v = judge(np.where(hidden, np.zeros((), a.dtype), a), np.where(hidden, 0, g),
              SCORES_TOLERANCE, name=name, arithmetic=arithmetic, kind="float")  # fmt: skip
    n_bad = int(differ.sum())
    where = tuple(int(i) for i in np.argwhere(differ)[0]) if n_bad else None
    txt = f"{int(hidden.sum())} positions not visible (-inf in the golden); {n_bad} differ"
    v.checks.insert(0, Check("visibility (-inf)", n_bad == 0, n_bad, 0, where, txt))
    v.passed = v.passed and n_bad == 0
    return v


def ids_tie_only(v: Verdict) -> bool:
    """Do the judged ids differ from the golden's at most by accepted score ties (and order
    within rows)? The default rule's id report has no wrong row; the seeds' rule passed."""
    return not v.ids.wrong if v.ids is not None else v.passed


__all__ = ["IDS_TOLERANCE", "SCORES_TOLERANCE", "ids_tie_only", "ids_tolerance", "judge_ids",
           "judge_scores"]  # fmt: skip
