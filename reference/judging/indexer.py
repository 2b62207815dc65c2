"""The judge of the DeepSeek lightning indexer's two outputs, wherever they are judged (the
indexer and the decode step of :mod:`tilesim.reference.judging.plans`, the layer step's
``dsa_indexer`` stage of :mod:`tilesim.reference.judging.stages`). Which positions a row sees
comes from the lengths (:func:`indexer_visible`: ``seq_lens``, ``q_lens``), never from a score
value: a visible position may score ``-inf`` too (finite weights of ``-3e38`` drive its FP32
score there).

* ``topk_indices`` ``[T, topk]`` — row ``i``'s selection is its first ``min(topk, visible_i)``
  entries, the entries the sparse attention reads (``docs/ops/dsa.md``): there, as a set (in
  any order), the golden's ids up to score ties (:func:`judge_ids`, :data:`IDS_TOLERANCE`: no
  wrong row); a ``-1`` there is a missing id, an id after them is wrong (the indexer writes
  ``-1`` there), an id at or past ``visible_i`` is wrong whatever its score;
* ``scores`` FP32 ``[T, S]`` — every position a row does not see, and every visible one the
  golden scores ``-inf``, must be ``-inf`` in the dump ("visibility (-inf)"); the other
  elements are judged by the golden-aware checks alone, no published numbers
  (:func:`judge_scores`).
"""

from __future__ import annotations

import numpy as np
from tilesim.reference.judging import Check, Verdict, judge

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


def indexer_visible(seq_lens, q_lens, rows: int) -> np.ndarray:
    """int64 ``[rows]``: the positions each query row of the indexer sees
    (:func:`tilesim.shared.dsa_indexer.visible_lengths`); decode (``q_lens`` ``None``): ``s1 =
    rows // B`` rows per batch."""
    from tilesim.shared.dsa_indexer import visible_lengths

    lens = np.asarray(seq_lens).reshape(-1)
    if q_lens is None:
        if not lens.size or rows % lens.size:
            raise ValueError(f"seq_lens: expected B lengths with B dividing the {rows} id rows, "
                             f"got {lens.size}")  # fmt: skip
        q_lens = np.full(lens.size, rows // lens.size)
    vis = visible_lengths(lens, np.asarray(q_lens).reshape(-1))
    if vis.size != rows:
        raise ValueError(f"q_lens: expected {rows} query rows in all, got {vis.size}")
    return vis


def judge_ids(actual, golden, *, scores=None, visible=None, tolerance: dict = IDS_TOLERANCE,
              rule: str = "default", name: str = "topk_indices") -> Verdict:  # fmt: skip
    """The indexer's ids ``[T, topk]`` (int32 or int64, ``-1`` = an empty slot) against the
    golden's, tie-aware with the golden's ``scores`` ``[T, S]``; ``visible``: the rows'
    visible lengths (:func:`indexer_visible`; module docstring)."""
    return judge(actual, golden, tolerance, scores=scores, rule=rule, name=name,
                 kind="dsa_indexer", visible=visible)  # fmt: skip


def judge_scores(actual, golden, *, visible=None, name: str = "scores",
                 arithmetic: str = "float64") -> Verdict:  # fmt: skip
    """The indexer's FP32 scores ``[T, S]`` (module docstring); ``visible``: the rows' visible
    lengths (``None``: a ``-inf`` of the golden counts as not visible). ``actual`` is not
    modified."""
    g = np.asarray(golden)
    a = np.asarray(actual)
    if a.size != g.size:
        raise ValueError(f"{name}: expected {g.size} scores, got {a.size}")
    a = a.reshape(g.shape)
    with np.errstate(invalid="ignore"):
        g_inf, a_inf = np.isneginf(g.astype(np.float64)), np.isneginf(a.astype(np.float64))
    hidden = g_inf if visible is None else _hidden(g.shape, visible)
    differ = (hidden & ~a_inf) | (~hidden & (g_inf != a_inf))
    skip = hidden | g_inf | a_inf
    v = judge(np.where(skip, np.zeros((), a.dtype), a), np.where(skip, 0, g), SCORES_TOLERANCE,
              name=name, arithmetic=arithmetic, kind="float")  # fmt: skip
    n_bad = int(differ.sum())
    where = tuple(int(i) for i in np.argwhere(differ)[0]) if n_bad else None
    if visible is None:
        txt = f"{int(hidden.sum())} positions not visible (-inf in the golden); {n_bad} differ"
    else:
        n_inf = int((g_inf & ~hidden).sum())
        txt = (f"{int(hidden.sum())} positions not visible (from the lengths), {n_inf} "
               f"visible ones scored -inf; {n_bad} differ")  # fmt: skip
    v.checks.insert(0, Check("visibility (-inf)", n_bad == 0, n_bad, 0, where, txt))
    v.passed = v.passed and n_bad == 0
    return v


def _hidden(shape: tuple, visible) -> np.ndarray:
    """``[T, S]``: the positions at or past each row's visible length."""
    vis = np.asarray(visible, np.int64).reshape(-1, 1)
    if vis.shape[0] != int(np.prod(shape[:-1], dtype=np.int64)):
        raise ValueError(f"visible: expected one length per score row {list(shape[:-1])}, "
                         f"got {vis.shape[0]}")  # fmt: skip
    return (np.arange(shape[-1])[None, :] >= vis).reshape(shape)


def ids_tie_only(v: Verdict) -> bool:
    """Do the judged ids differ from the golden's at most by accepted score ties (and order
    within rows)? The default rule's id report has no wrong row; the seeds' rule passed."""
    return not v.ids.wrong if v.ids is not None else v.passed


__all__ = ["IDS_TOLERANCE", "SCORES_TOLERANCE", "ids_tie_only", "ids_tolerance",
           "indexer_visible", "judge_ids", "judge_scores"]  # fmt: skip
