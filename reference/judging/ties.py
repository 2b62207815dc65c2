"""Id outputs judged as sets, with ties recognised by the golden's scores.

Each row of an id output (``[..., k]`` int32/int64, ``-1`` an empty slot) is compared with the
golden's row as a set: ``missing`` and ``extra`` ids, duplicates, ids out of range, and, with
the rows' visible lengths, ids past a row's visible length (``invisible``) or after the
entries a reader uses (``unread``). An extra id whose golden score ties (within
:data:`TIE_ULPS` ULPs of the score dtype) with a missing one's is accepted as a tie; without the
rows' lengths a ``-inf`` score ties nothing. Candidates the golden left out that tie with a
row's lowest selected score are counted (``boundary_ties``). The seeds' view (``rule="seeds"``)
sorts each row and applies the element rule with ``atol = rtol = 0``. docs/numerics.md,
"Judging an output", states the rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tilesim.reference.judging.compare import compare
from tilesim.reference.judging.report import N_POSITIONS, Check, rows
from tilesim.reference.util.numerics import ULP_DTYPES, ulp_distance
from tilesim.shared.ranking import rank
from tilesim.shared.validate import host_data

#: two golden scores this many ULPs (score dtype) apart or closer tie
TIE_ULPS = 1


#: (IdRow field, words in the report)
_ID_LABELS = (
    ("missing", "missing"),
    ("extra", "extra"),
    ("invisible", "invisible"),
    ("duplicates", "duplicate"),
    ("out_of_range", "out-of-range"),
    ("unread", "unread"),
)


@dataclass
class IdRow:
    """One row of an id output that differs from the golden's (or ties with it). With the
    rows' visible lengths (``judge(visible=)``): ``invisible`` ids lie at or past the row's
    visible length, ``unread`` ids stand after the row's first ``min(k, visible)`` entries
    (the entries a reader of the ids uses; the golden leaves ``-1`` there)."""

    row: tuple | str  # the row's index, or its coordinates in words ("token 3")
    missing: list = field(default_factory=list)  # golden ids the actual lacks (not ties)
    extra: list = field(default_factory=list)  # visible actual ids the golden lacks (not ties)
    duplicates: list = field(default_factory=list)
    out_of_range: list = field(default_factory=list)
    ties: list = field(default_factory=list)  # [(actual id, golden id, score a, score g)]
    invisible: list = field(default_factory=list)  # ids at or past the visible length
    unread: list = field(default_factory=list)  # ids after the first min(k, visible) entries
    visible: int | None = None  # the row's visible length, when given
    used: int | None = None  # the entries read: min(k, visible), when given
    scores: dict = field(default_factory=dict)  # golden score of each missing / extra id
    empty: int = 0  # -1 slots among the entries read (visible given)
    index: int | None = None  # the row's flat index (rows = the leading axes flattened)

    @property
    def wrong(self) -> bool:
        return bool(self.missing or self.extra or self.duplicates or self.out_of_range
                    or self.invisible or self.unread)  # fmt: skip

    def id_text(self, what: str, label: str) -> str:
        """The row's ids of one kind (an :class:`IdRow` field ``what``) in words."""
        ids = getattr(self, what)
        text = f"{label} ids {ids}"
        if what == "invisible":
            text += f" (at or past the row's visible length {self.visible})"
        if what == "unread":
            text += f" (after the row's first {self.used} entries: not read, the golden has -1)"
        known = [self.scores[i] for i in ids if i in self.scores]
        if known and len(known) == len(ids) and what != "unread":
            text += " (golden scores " + ", ".join(f"{x:.9g}" for x in known) + ")"
        return text

    def text(self) -> str:
        """The row's line of the report."""
        parts = [self.id_text(what, label) for what, label in _ID_LABELS if getattr(self, what)]
        if self.empty:
            parts.append(f"{self.empty} of the first {self.used} entries are -1")
        for a, g, sa, sg in self.ties:
            parts.append(f"id {a} replaces {g}: golden scores tie ({sa:.9g} vs {sg:.9g})")
        where = self.row if isinstance(self.row, str) else f"row {self.row}"
        return f"  {where}: " + "; ".join(parts)


@dataclass
class IdReport:
    """The id-set comparison: rows that differ beyond ties, rows accepted by ties, and how
    many candidates tie with each row's selection boundary."""

    n_rows: int
    k: int
    wrong: list = field(default_factory=list)
    tied: list = field(default_factory=list)
    boundary_ties: int = 0  # unselected candidates tied with a row's lowest selected score
    scores_used: bool = False

    def lines(self) -> list[str]:
        """The report's lines: the first :data:`N_POSITIONS` wrong then tied rows, and the
        boundary ties."""
        out = [r.text() for r in (self.wrong + self.tied)[:N_POSITIONS]]
        if self.boundary_ties:
            out.append(
                f"  {self.boundary_ties} unselected candidate(s) tie with a row's lowest "
                f"selected score (within {TIE_ULPS} ULP)"
            )
        return out


def _check_scores(scores, lead: tuple, name: str) -> np.ndarray | None:
    """The golden's scores as ``[rows, candidates]`` (any float dtype), or None. ``lead``: the
    golden ids' leading shape (their rows); the scores' leading shape must be ``lead`` or the
    rows flattened into one axis (C order), followed by at least one candidate: a shape is
    never read by its element count alone."""
    if scores is None:
        return None
    s = host_data(scores, "scores")
    if s.dtype not in ULP_DTYPES:
        raise TypeError(f"scores: expected a float dtype, got {s.dtype} ({name})")
    n_rows = int(np.prod(lead, dtype=np.int64))
    forms = [list(lead), *([[n_rows]] if [n_rows] != list(lead) else [])]
    if s.ndim < 1 or s.shape[:-1] not in [tuple(f) for f in forms] or s.shape[-1] < 1:
        want = " or ".join(str([*f, "candidates"]).replace("'", "") for f in forms)
        raise ValueError(
            f"scores: expected shape {want} (the golden ids' rows, then candidates >= 1), "
            f"got {list(s.shape)} ({name})"
        )
    return s.reshape(n_rows, s.shape[-1])


def _ties(s_row: np.ndarray, x: int, y: int, finite: bool = False) -> bool:
    """Do candidates ``x`` and ``y`` tie: scores within :data:`TIE_ULPS` of the score dtype
    (``finite``: and both finite)."""
    pair = s_row[[x, y]]
    if finite and not np.all(np.isfinite(pair.astype(np.float64))):
        return False
    d = int(ulp_distance(pair[:1], pair[1:])[0])
    return 0 <= d <= TIE_ULPS


def pair_ties(s_row, missing: list, extra: list, finite: bool = False):
    """Pair each extra id with a missing one whose golden score ties with it; returns
    ``(ties, missing left, extra left)``. ``finite`` (the rows' lengths are not known): a
    score of ``-inf`` ties nothing, as it cannot be told from a position past the row's
    length (which is never a tie)."""
    ties, left = [], list(missing)
    rest = []
    for e in [extra[i] for i in rank(s_row[extra])]:  # best first (NaN last: ties nothing)
        m = next((m for m in left if _ties(s_row, e, m, finite)), None)
        if m is None:
            rest.append(e)
            continue
        left.remove(m)
        ties.append((e, m, float(s_row[e]), float(s_row[m])))
    return ties, left, rest


def _id_row(a_row, g_row, s_row, coords, visible=None) -> tuple[IdRow | None, int]:
    """(IdRow when the row differs or ties, boundary-tie count) of one id row; ``visible``:
    the row's visible length (its first ``min(k, visible)`` entries are the selection)."""
    used = None if visible is None else min(a_row.size, int(visible))
    unread = [] if used is None else np.unique(a_row[used:][a_row[used:] != -1]).tolist()
    sel = a_row if used is None else a_row[:used]
    uniq, counts = np.unique(sel[sel != -1], return_counts=True)
    g_ids = np.unique(g_row[g_row != -1])
    bad = uniq < -1
    if s_row is not None:
        bad |= uniq >= s_row.size
    hidden = ~bad & (uniq >= visible) if visible is not None else np.zeros_like(bad)
    missing = np.setdiff1d(g_ids, uniq).tolist()
    extra = np.setdiff1d(uniq[~bad & ~hidden], g_ids).tolist()
    ties = []
    if s_row is not None and missing and extra:
        ties, missing, extra = pair_ties(s_row, missing, extra, finite=visible is None)
    n_bt = _boundary_ties(s_row, g_ids, visible) if s_row is not None else 0
    row = IdRow(coords, missing, extra, uniq[counts > 1].tolist(), uniq[bad].tolist(), ties,
                uniq[hidden].tolist(), unread, visible, used)  # fmt: skip
    if s_row is not None:
        row.scores = {i: float(s_row[i]) for i in missing + extra + row.invisible}
    row.empty = 0 if used is None else int((sel == -1).sum())
    return (row if (row.wrong or ties) else None), n_bt


def _boundary_ties(s_row: np.ndarray, g_ids: np.ndarray, visible=None) -> int:
    """Unselected (visible) candidates whose score ties with the golden's lowest selected
    score."""
    n = s_row.size if visible is None else min(s_row.size, int(visible))
    valid = g_ids[(g_ids >= 0) & (g_ids < n)]
    if not valid.size or valid.size == n:
        return 0
    low = valid[np.argmin(s_row[valid].astype(np.float64))]
    d = ulp_distance(s_row[:n], np.full(n, s_row[low], dtype=s_row.dtype))
    near = (d >= 0) & (d <= TIE_ULPS)
    if visible is None:  # no lengths: a -inf score may be a position the row does not see
        near &= np.isfinite(s_row[:n].astype(np.float64))
    near[valid] = False
    return int(near.sum())


def _check_visible(visible, n_rows: int, name: str, width: int | None) -> np.ndarray | None:
    """The rows' visible lengths as int64 ``[rows]``, or None: an integer dtype
    (``TypeError``), one dimension of ``n_rows``, each in ``[0, width]`` (``width``: the
    scores' candidates; None: no scores, so at most the INT64 maximum) (``ValueError``)."""
    if visible is None:
        return None
    v = np.asarray(host_data(visible, "visible", scalars=True))
    if v.dtype.kind not in "iu":
        raise TypeError(f"visible: expected integer lengths (one per id row), got {v.dtype} "
                        f"({name})")  # fmt: skip
    if v.ndim != 1 or v.size != n_rows:
        raise ValueError(f"visible: expected {n_rows} lengths [rows] (one per id row), got "
                         f"shape {list(v.shape)} ({name})")  # fmt: skip
    hi = int(np.iinfo(np.int64).max) if width is None else width
    bad = (v < 0) | (v > hi) if v.size else np.zeros(0, bool)
    if bad.any():
        r = int(np.argmax(bad))
        what = "the scores' candidates" if width is not None else "the INT64 maximum"
        raise ValueError(f"visible[{r}]: expected a length in [0, {hi}] ({what}), got "
                         f"{int(v[r])} ({name})")  # fmt: skip
    return v.astype(np.int64)


def judge_id_rows(a, g, tol, rule, name, scores, names, visible) -> dict:
    """The :class:`~tilesim.reference.judging.report.Verdict` fields of an id pair ``a``, ``g``
    (integer host arrays ``[..., k]`` of one shape) under the checked tolerance ``tol``:
    ``rule="seeds"`` the sorted rows under the element rule (``seeds``, ``checks``), else the
    rows as sets with ties (``ids``, one ``"id sets"`` check passing when at most
    ``round(ratio * rows)`` rows differ beyond ties, ``warnings`` when no scores are given)."""
    if rule == "seeds":  # the seeds' view: rows sorted, then exact element equality
        sa, sg = np.sort(a.astype(np.int64), axis=-1), np.sort(g.astype(np.int64), axis=-1)
        rep = compare(sa, sg, atol=0.0, rtol=0.0, ratio=tol["ratio"], name=name, check_dtype=False)
        return {"seeds": rep, "checks": [Check("seeds element rule (sorted rows)", rep.passed,
                rep.n_fail, rep.threshold, rep.max_abs_pos)]}  # fmt: skip
    ar, gr = rows(a.astype(np.int64)), rows(g.astype(np.int64))
    s = _check_scores(scores, g.shape[:-1], name)
    vis = _check_visible(visible, gr.shape[0], name, None if s is None else s.shape[-1])
    rep = IdReport(n_rows=gr.shape[0], k=gr.shape[1], scores_used=s is not None)
    for r in range(gr.shape[0]):
        row, n_bt = _id_row(ar[r], gr[r], None if s is None else s[r], names(r),
                            None if vis is None else vis[r])  # fmt: skip
        if row is not None:
            row.index = r
        rep.boundary_ties += n_bt
        if row is not None:
            (rep.wrong if row.wrong else rep.tied).append(row)
    allowed = int(round(tol["ratio"] * rep.n_rows))
    worst = rep.wrong[0].row if rep.wrong else None
    txt = f"{len(rep.wrong)} of {rep.n_rows} rows differ beyond ties (allowed {allowed})"
    if rep.tied:
        txt += f"; {len(rep.tied)} rows accepted by score ties"
    check = Check("id sets", len(rep.wrong) <= allowed, len(rep.wrong), allowed, worst, txt)
    warnings = [] if s is not None else [
        "no golden scores: ids compared as exact sets, ties cannot be recognised"
    ]  # fmt: skip
    return {"ids": rep, "checks": [check], "warnings": warnings}


__all__ = ["TIE_ULPS", "IdReport", "IdRow", "judge_id_rows", "pair_ties"]
