"""The verdict of ``tilesim compare``: the compare rule, the tie-aware id compare and the error
distribution.

* :func:`judge` — :func:`tilesim.reference.compare` under a tolerance dict; mode ``"set"``
  (block-id outputs) compares each row's ids as a set, and with the golden's block scores
  (:func:`tie_check`) accepts a selection that differs from the golden only among candidates
  tied at the selection boundary.
* :func:`distribution` — percentiles (50/90/99/max) of ``|err|`` and of the ULP distance, and
  the relative L2 error.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tilesim.cli import CliError

#: the percentiles the report gives (plus the max)
PERCENTILES = (50, 90, 99)
#: two FP32 scores closer than this many ULPs are a tie at the selection boundary
TIE_ULPS = 1


# ---------------------------------------------------------------------------------------------
# the error distribution


def _percentiles(x: np.ndarray) -> dict:
    """``{"p50", "p90", "p99", "max"}`` of ``x`` (the inverted-CDF percentile: a value some
    element actually has), ``None`` values for an empty ``x``."""
    keys = [f"p{p}" for p in PERCENTILES] + ["max"]
    if x.size == 0:
        return dict.fromkeys(keys)
    vals = np.percentile(x, PERCENTILES, method="inverted_cdf").tolist() + [x.max()]
    return {k: float(v) for k, v in zip(keys, vals, strict=True)}


def ulp_distances(actual: np.ndarray, golden: np.ndarray) -> np.ndarray | None:
    """ULP distance per element in ACTUAL's float dtype (the golden rounded once to it when the
    dtypes differ); ``-1`` where either is NaN; ``None`` for integer / bool outputs."""
    from tilesim.reference import ulp_distance

    if actual.dtype.kind not in "fV":
        return None
    g = golden
    if g.dtype != actual.dtype:
        with np.errstate(all="ignore"):
            g64 = golden.astype(np.float64)
            g = g64 if actual.dtype == np.float64 else g64.astype(np.float32).astype(actual.dtype)
    try:
        return ulp_distance(actual, g)
    except (TypeError, ValueError):
        return None


def distribution(actual: np.ndarray, golden: np.ndarray) -> dict:
    """``{"abs_err": percentiles, "ulp": percentiles or None, "rel_l2": float}`` over the
    elements where both tensors are finite (``n_finite`` of ``numel``)."""
    a = actual.astype(np.float64)
    g = golden.astype(np.float64)
    ok = np.isfinite(a) & np.isfinite(g)
    err = np.abs(a[ok] - g[ok])
    gn = float(np.sqrt(np.sum(g[ok] ** 2)))
    en = float(np.sqrt(np.sum(err**2)))
    rel = en / gn if gn > 0 else (0.0 if en == 0 else float("inf"))
    ulps = ulp_distances(actual, golden)
    return {
        "numel": int(a.size),
        "n_finite": int(ok.sum()),
        "abs_err": _percentiles(err),
        "ulp": None if ulps is None else _percentiles(ulps[ok & (ulps >= 0)].astype(np.float64)),
        "rel_l2": rel,
    }


def distribution_text(d: dict) -> str:
    def row(p: dict, fmt: str) -> str:
        return " ".join(f"{k} {'-' if v is None else format(v, fmt)}" for k, v in p.items())

    line = f"  |err| {row(d['abs_err'], '.4g')}"
    if d["ulp"] is not None:
        line += f"; ULP {row(d['ulp'], '.0f')}"
    line += f"; relative L2 {d['rel_l2']:.4g}"
    if d["n_finite"] != d["numel"]:
        line += f" (over the {d['n_finite']} of {d['numel']} elements finite in both)"
    return line


# ---------------------------------------------------------------------------------------------
# tie-aware id compare


@dataclass
class RowTies:
    """One selection row with candidates tied at its boundary."""

    row: int
    boundary: float  # the golden's lowest selected (non-local) score
    tied: list[int]  # every candidate block within TIE_ULPS of the boundary
    actual_only: list[int] = field(default_factory=list)
    golden_only: list[int] = field(default_factory=list)

    def text(self) -> str:
        s = (
            f"  row {self.row}: blocks {self.tied} tie at the selection boundary "
            f"(score {self.boundary:.9g}, within {TIE_ULPS} FP32 ULP)"
        )
        if self.actual_only:
            s += f"; actual picks {self.actual_only}, golden {self.golden_only}: accepted"
        return s


@dataclass
class TieResult:
    """The id rows accepted by ties, the rows that differ beyond them, the tie report."""

    accepted: list[int]
    mismatched: list[int]
    ties: list[RowTies]


def _row_ties(r: int, a_row, g_row, score: np.ndarray):
    """(RowTies or None, explained?) for one row."""
    from tilesim.reference import ulp_distance

    nb = score.size
    a, g = set(a_row.tolist()), set(g_row.tolist())
    valid = len(a) == a_row.size and all(0 <= b < nb for b in a)
    local = nb - 1
    ranked = sorted(g - {local}) if nb > g_row.size else []
    if not ranked:  # nb <= k: arange, nothing is ranked
        return None, valid and a == g
    t = np.float32(min(score[b] for b in ranked))
    d = ulp_distance(score.astype(np.float32), np.full(nb, t, np.float32))
    near = (d >= 0) & (d <= TIE_ULPS)  # -1 = NaN: never a tie
    tied = [b for b in range(nb - 1) if near[b]]
    diff = a ^ g
    explained = valid and local in a and all(b != local and near[b] for b in diff)
    if diff and not explained:
        return None, False
    if not diff and len(tied) == sum(b in g for b in tied):  # no candidate left out: no tie
        return None, True
    return RowTies(r, float(t), tied, sorted(a - g), sorted(g - a)), True


def tie_check(actual: np.ndarray, golden: np.ndarray, scores: np.ndarray) -> TieResult:
    """Rows of block ids ``actual`` vs ``golden`` (``[rows, k]``) under the golden's block
    scores ``[rows, nb]`` (FP32): a row is accepted when its ids are distinct, in range, hold
    the local block ``nb-1``, and differ from the golden's only by blocks whose score is
    within :data:`TIE_ULPS` FP32 ULP of the boundary (the golden's lowest selected non-local
    score)."""
    if actual.shape != golden.shape or scores.ndim != 2 or scores.shape[0] != golden.shape[0]:
        raise CliError(
            f"block scores {list(scores.shape)} do not fit ids {list(golden.shape)} "
            f"(actual {list(actual.shape)})"
        )
    res = TieResult([], [], [])
    for r in range(golden.shape[0]):
        rt, ok = _row_ties(r, actual[r], golden[r], scores[r])
        if rt is not None:
            res.ties.append(rt)
        if set(actual[r].tolist()) != set(golden[r].tolist()):
            (res.accepted if ok else res.mismatched).append(r)
    return res


# ---------------------------------------------------------------------------------------------
# the verdict


def judge(actual, golden, tol: dict, *, name: str, check_dtype=True, arithmetic="float64"):
    """The report of ``actual`` vs ``golden`` under ``tol``: the compare rule, or for mode
    ``"set"`` equality of every row's id set (both sorted along the last axis, then exact)."""
    from tilesim.reference import compare

    if tol["mode"] == "set":  # block-id selections: order is not part of the contract
        actual, golden = np.sort(actual, axis=-1), np.sort(golden, axis=-1)
    try:
        return compare(
            actual,
            golden,
            atol=tol["atol"],
            rtol=tol["rtol"],
            ratio=tol["ratio"],
            name=name,
            check_dtype=check_dtype,
            arithmetic=arithmetic,
        )
    except (ValueError, TypeError) as e:  # bad tolerance values, complex data
        raise CliError(str(e)) from None


def judge_ids(actual, golden, scores, tol: dict, *, name: str, check_dtype=True):
    """Mode ``"set"`` with block scores: rows accepted by ties count as equal (their golden row
    is used); returns ``(report, TieResult)``."""
    ties = tie_check(actual, golden, scores)
    adjusted = actual.copy()
    for r in ties.accepted:
        adjusted[r] = golden[r]
    return judge(adjusted, golden, tol, name=name, check_dtype=check_dtype), ties
