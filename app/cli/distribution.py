"""The error distribution a ``tilesim compare`` report adds to a float output's verdict:
percentiles (50/90/99/max) of ``|err|`` and of the ULP distance, and the relative L2 error
(:func:`distribution`, :func:`distribution_text`); :func:`ulp_distances` per element for the
``--png`` histogram.
"""

from __future__ import annotations

import numpy as np

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
