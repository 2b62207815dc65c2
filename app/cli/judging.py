"""The verdict of ``tilesim compare``: :func:`tilesim.reference.judge` under the golden's
tolerance, and the error distribution the report adds.

* :func:`judge` — the one judge (floats: the seeds' element rule and, under the default rule,
  the golden-aware checks; ids: per-row sets, tie-aware with the golden's block scores).
* :func:`distribution` — percentiles (50/90/99/max) of ``|err|`` and of the ULP distance, and
  the relative L2 error.
"""

from __future__ import annotations

import numpy as np
from tilesim.cli import CliError

#: the percentiles the report gives (plus the max)
PERCENTILES = (50, 90, 99)


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
    """ULP distance per element in the golden's float dtype when ACTUAL is wider (ACTUAL
    rounded once to it), else in ACTUAL's dtype (the golden rounded once to it when the dtypes
    differ); ``-1`` where either is NaN; ``None`` for integer / bool outputs."""
    from tilesim.reference import ulp_distance

    if actual.dtype.kind not in "fV":
        return None
    g = golden
    if golden.dtype.kind in "fV" and actual.dtype.itemsize > golden.dtype.itemsize:
        with np.errstate(all="ignore"):
            a32 = actual.astype(np.float64).astype(np.float32)
            actual = a32.astype(golden.dtype) if golden.dtype != np.float32 else a32
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
# the verdict

#: the reference op of a golden's manifest -> the judge's ``kind`` (names the report's
#: coordinates)
_OP_KINDS = {
    "moe_grouped_gemm": "moe",
    "msa_sparse_decode": "msa_decode",
    "msa_main_branch": "msa_main",
    "msa_indexer": "msa_indexer",
    "sparse_attention_antiquant": "dsa",
    "sparse_attention_antiquant_kv_split": "dsa",
    "dsa_indexer": "dsa_indexer",
}
#: the ops whose judged output is ids
_ID_KINDS = ("msa_indexer", "dsa_indexer")


def golden_scores(scores: dict):
    """The golden's scores for the id judge: its ``block_scores`` (the MSA indexer), else its
    only ``scores`` tensor whatever its name, else ``None``."""
    if "block_scores" in scores:
        return scores["block_scores"]
    return next(iter(scores.values())) if len(scores) == 1 else None


def kind_of(manifest: dict | None, tol: dict) -> str | None:
    """The judge's ``kind`` for a golden's manifest (``None``: inferred from the tolerance).
    A float op under mode ``"set"`` (or ids under another mode) keeps ``None``."""
    kind = _OP_KINDS.get((manifest or {}).get("op"))
    if kind is None or (kind in _ID_KINDS) != (tol["mode"] == "set"):
        return None
    return kind


def judge(actual, golden, tol: dict, *, name: str, check_dtype=False, arithmetic="float64",
          rule="default", scores=None, kind=None):  # fmt: skip
    """:func:`tilesim.reference.judge` of ``actual`` vs ``golden`` under the tolerance dict
    ``tol``; bad tolerance values or data become a :class:`CliError`. ``check_dtype`` is
    accepted for the callers that pass it (the CLI checks dtypes before judging)."""
    from tilesim.reference.judge import judge as reference_judge

    del check_dtype
    try:
        return reference_judge(actual, golden, tol, scores=scores, rule=rule, name=name,
                               arithmetic=arithmetic, kind=kind)  # fmt: skip
    except (ValueError, TypeError) as e:
        raise CliError(str(e)) from None
