"""Float outputs: the seeds' element rule and the golden-aware layer of the default rule.

The golden-aware layer bounds the relative L2 error ``||a - g|| / ||g||`` and the cosine
similarity, over the whole tensor and per row (:func:`tilesim.reference.judging.report.rows`),
in units of the unit roundoff ``u`` of the rounding the output carries (BF16 ``2^-8``): the
op's calibrated multiple (:data:`OP_L2_UNITS`, from each op's record) where the judge's
``kind`` names a calibrated op, else the dtype's rule (:data:`TENSOR_L2_UNITS`,
:data:`ROW_L2_UNITS`), never below :data:`L2_FLOOR`. A row-ULP budget (``row_ulp``) counts
``|a - g|`` in ULPs at each row's largest ``|golden|`` (:func:`row_ulp_errors`); a tolerance
looser than the golden (``atol >= max |golden|``) is flagged. NaN/Inf positions and the
largest ULP distance (in the golden's dtype too when the dump is wider) are reported.
docs/numerics.md, "Judging an output" and "Calibration", states the rules and the margins.
"""

from __future__ import annotations

import math

import numpy as np
from tilesim.reference.judging.compare import compare
from tilesim.reference.judging.report import N_POSITIONS, Check, RowNames, rows
from tilesim.reference.util.numerics import ULP_DTYPES, ulp_distance
from tilesim.shared.casts import BF16, FP8_E4M3
from tilesim.shared.registry.ops import judge_l2_units

#: unit roundoff (half an ULP at 1) of each float output dtype
UNIT_ROUNDOFF = {
    BF16: 2.0**-8,
    np.dtype(np.float16): 2.0**-11,
    np.dtype(np.float32): 2.0**-24,
    np.dtype(np.float64): 2.0**-53,
    FP8_E4M3: 2.0**-4,
}

#: the relative-L2 bounds ``(whole tensor, one row)`` of each calibrated op's float output, by
#: the judge's ``kind``, in units of the unit roundoff of the rounding the output carries. Each
#: sits between the worst correct output (the golden against the float64 oracles times
#: sqrt(2), the golden under the op's other legal tilings and rounding choices) and the
#: smallest fault (a row, head or block scaled by 1 + 2u, 1.01, 1.02), with the margins of
#: docs/numerics.md ("Calibration"); the tensor bound equals the row bound, as a small output
#: is a few rows whose spread is the row spread. Each op's record carries its figures
#: (:attr:`tilesim.shared.registry.op_record.Call.l2_units`)
OP_L2_UNITS = judge_l2_units()

#: relative-L2 bound of the whole tensor of a float output no op calibrates (``kind`` "float",
#: an uncalibrated layout), in units of the output dtype's unit roundoff
TENSOR_L2_UNITS = 4.0

#: relative-L2 bound of one row of such an output, in the same units
ROW_L2_UNITS = 8.0

#: the L2 bounds never go below this relative error (FP32 outputs of long FP32 reductions)
L2_FLOOR = 2.0**-16

#: a row whose golden norm is below this share of the typical row norm is measured against the
#: typical row norm (its own relative error is not meaningful)
ROW_NORM_FLOOR = 2.0**-4

#: the mantissa bits of the dtypes a row-ULP budget is counted in
_MANTISSA = {BF16: 7, np.dtype(np.float16): 10, np.dtype(np.float32): 23, FP8_E4M3: 3}


def nonfinite(a: np.ndarray) -> tuple[int, list]:
    """(count, first :data:`N_POSITIONS` ``(index, "nan"/"inf"/"-inf")``) of ``a``."""
    with np.errstate(invalid="ignore", over="ignore"):
        bad = ~np.isfinite(a.astype(np.float64))
    pos = np.argwhere(bad)[:N_POSITIONS]
    out = [(tuple(int(i) for i in p), str(float(a[tuple(p)]))) for p in pos]
    return int(bad.sum()), out


def max_ulp(a: np.ndarray, g: np.ndarray) -> tuple[int | None, int | None]:
    """(max ULP distance in actual's dtype, in the golden's dtype when actual is wider);
    ``-1`` when only NaN pairs exist, ``None`` when not a float pair."""
    if a.dtype not in ULP_DTYPES or g.dtype not in ULP_DTYPES or not a.size:
        return None, None
    with np.errstate(invalid="ignore", over="ignore"):
        g_as_a = (
            g.astype(np.float64).astype(np.float32).astype(a.dtype) if g.dtype != a.dtype else g
        )
        in_a = ulp_distance(a, g_as_a)
        in_g = None
        if a.dtype.itemsize > g.dtype.itemsize:  # round the dump once to the golden's dtype
            a32 = a if a.dtype == np.float32 else a.astype(np.float64).astype(np.float32)
            in_g = ulp_distance(a32.astype(g.dtype), g)
    top = int(in_a.max()) if (in_a >= 0).any() else -1
    return top, (None if in_g is None else (int(in_g.max()) if (in_g >= 0).any() else -1))


def _finite64(x: np.ndarray) -> np.ndarray:
    """``x`` in float64, C-ordered (every sum then runs in the one order of the logical
    layout, whatever the memory layout of ``x``), NaN and +-Inf taken as 0."""
    with np.errstate(invalid="ignore", over="ignore"):
        x = x.astype(np.float64, order="C")
    return np.where(np.isfinite(x), x, 0.0)


def l2_units(kind: str | None = None) -> tuple[float, float]:
    """(whole-tensor, per-row) relative-L2 bounds in units of ``u`` for the judge's ``kind``:
    the op's :data:`OP_L2_UNITS`, else the dtype's rule (:data:`TENSOR_L2_UNITS`,
    :data:`ROW_L2_UNITS`)."""
    return OP_L2_UNITS.get(kind, (TENSOR_L2_UNITS, ROW_L2_UNITS))


def l2_bounds(*dtypes, kind: str | None = None) -> tuple[float, float]:
    """(whole-tensor, per-row) relative-L2 bounds for an output of the coarsest of ``dtypes``
    (the pair judged: a BF16 golden and an FP32 dump, or a BF16 output and a float64 oracle, are
    both judged at BF16): ``max(c * u, L2_FLOOR)`` with ``c`` from :func:`l2_units` (``kind``:
    the judge's ``kind``, a calibrated op's multiples) and ``u`` the unit roundoff."""
    u = max(UNIT_ROUNDOFF.get(np.dtype(d), 2.0**-24) for d in dtypes)
    t_units, r_units = l2_units(kind)
    return max(t_units * u, L2_FLOOR), max(r_units * u, L2_FLOOR)


def cosine_bound(rel_l2_bound: float) -> float:
    """The cosine similarity an error of relative L2 ``r`` can cost at most: ``1 - r^2/2``
    (an error orthogonal to the golden, the worst case for the angle, to second order)."""
    return 1.0 - rel_l2_bound**2 / 2.0


def _norm_ratios(a64: np.ndarray, g64: np.ndarray):
    """Per row: (relative L2 with the row-norm floor, cosine, golden row norm)."""
    ar, gr = rows(a64), rows(g64)
    en = np.sqrt(np.sum((ar - gr) ** 2, axis=1))
    gn = np.sqrt(np.sum(gr**2, axis=1))
    an = np.sqrt(np.sum(ar**2, axis=1))
    typical = math.sqrt(float(np.sum(gn**2)) / max(len(gn), 1))
    den = np.maximum(gn, ROW_NORM_FLOOR * typical)
    rel = np.divide(en, den, out=np.where(en > 0, np.inf, 0.0), where=den > 0)
    both = an * gn
    cos = np.divide(
        np.sum(ar * gr, axis=1), both, out=np.where((an == 0) & (gn == 0), 1.0, 0.0),
        where=both > 0,
    )  # fmt: skip
    return rel, cos, gn, den


def _tensor_metrics(a64: np.ndarray, g64: np.ndarray) -> tuple[float, float]:
    """(relative L2, cosine) of the whole tensor (``1.0`` cosine when both are zero)."""
    en = math.sqrt(float(np.sum((a64 - g64) ** 2)))
    gn = math.sqrt(float(np.sum(g64**2)))
    an = math.sqrt(float(np.sum(a64**2)))
    rel = en / gn if gn > 0 else (0.0 if en == 0 else math.inf)
    if an > 0 and gn > 0:
        return rel, float(np.sum(a64 * g64)) / (an * gn)
    return rel, 1.0 if an == 0 and gn == 0 else 0.0


def _golden_aware(a: np.ndarray, g: np.ndarray, names: RowNames, precision,
                  kind: str | None = None) -> list[Check]:  # fmt: skip
    """The four checks of the golden-aware layer (whole tensor and worst row); ``kind``: the
    judge's ``kind`` (a calibrated op's bounds)."""
    a64, g64 = _finite64(a), _finite64(g)
    dtypes = (a.dtype, g.dtype, *([] if precision is None else [precision]))
    t_bound, r_bound = l2_bounds(*dtypes, kind=kind)
    rel, cos = _tensor_metrics(a64, g64)
    checks = [
        Check("relative L2 (tensor)", rel <= t_bound, rel, t_bound,
              text=_bound_basis(dtypes, kind)),
        Check("cosine (tensor)", cos >= cosine_bound(t_bound), cos, cosine_bound(t_bound),
              higher_is_better=True),
    ]  # fmt: skip
    if g.ndim <= 1 or a.size == 0:
        return checks
    r_rel, r_cos, gn, den = _norm_ratios(a64, g64)
    # the angle of a row is judged where its golden norm is not floored (a near-zero golden
    # row has no meaningful direction; its relative L2 against the floor judges it)
    angled = (gn > 0) & (gn >= den)
    wr, wc = int(np.argmax(r_rel)), int(np.argmin(np.where(angled, r_cos, 1.0)))
    n_bad = int((r_rel > r_bound).sum())
    checks.append(
        Check("relative L2 (worst row)", n_bad == 0, float(r_rel[wr]), r_bound,
              names(wr), f"{n_bad} of {len(r_rel)} rows beyond the bound"
              + _row_list(r_rel > r_bound, names))
    )  # fmt: skip
    cb = cosine_bound(r_bound)
    bad_cos = (r_cos < cb) & angled
    checks.append(
        Check("cosine (worst row)", not bad_cos.any(), float(r_cos[wc]) if angled.any() else 1.0,
              cb, names(wc),
              f"{int(bad_cos.sum())} rows below the bound" + _row_list(bad_cos, names),
              higher_is_better=True)
    )  # fmt: skip
    return checks


def _bound_basis(dtypes, kind) -> str:
    """Where the L2 bounds come from, in words: ``"bounds 1.4u (msa_decode's calibration),
    u = 2^-8 (bfloat16)"``, the dtype's rule, or the FP32 floor."""
    u, d = max((UNIT_ROUNDOFF.get(np.dtype(x), 2.0**-24), str(np.dtype(x))) for x in dtypes)
    t_units, r_units = l2_units(kind)
    if max(t_units, r_units) * u <= L2_FLOOR:
        return f"bounds at the floor 2^{int(math.log2(L2_FLOOR))} (u = 2^{int(math.log2(u))}, {d})"
    units = f"{t_units:g}u" if t_units == r_units else f"{t_units:g}u / {r_units:g}u per row"
    basis = f"{kind}'s calibration" if kind in OP_L2_UNITS else _uncalibrated(kind)
    return f"bounds {units} ({basis}), u = 2^{int(math.log2(u))} ({d})"


def _uncalibrated(kind) -> str:
    """Why the dtype's rule judges an output, in words."""
    if kind in (None, "float"):
        return "the dtype's rule: no op named, so no op's calibration applies"
    return f"the dtype's rule: {kind} has no calibrated bound"


def _row_list(mask: np.ndarray, names: RowNames) -> str:
    rows = np.flatnonzero(mask)[:N_POSITIONS]
    if not rows.size:
        return ""
    more = ", ..." if mask.sum() > rows.size else ""
    return ": " + ", ".join(str(names(int(r))) for r in rows) + more


def row_ulp_errors(actual, golden, dtype=BF16) -> np.ndarray:
    """Per row (last axis): max ``|actual - golden|`` in ULPs of ``dtype`` at the row's largest
    ``|golden|`` (a row whose golden is all zero counts in ULPs of the smallest normal), float64
    ``[rows]``. The row-ULP measure of the sim tests (a kernel that reorders a reduction moves
    an output by about one ULP of the row's scale, not of each element's)."""
    a64, g64 = (
        rows(np.asarray(actual).astype(np.float64)),
        rows(np.asarray(golden).astype(np.float64)),
    )
    d = np.dtype(dtype)
    mant, tiny = _MANTISSA.get(d, 23), float(_smallest_normal(d))
    top = np.maximum(np.abs(g64).max(axis=1), tiny)
    unit = np.ldexp(1.0, np.frexp(top)[1] - 1 - mant)
    with np.errstate(invalid="ignore"):
        return (np.abs(a64 - g64) / unit[:, None]).max(axis=1)


def _smallest_normal(d: np.dtype) -> float:
    try:
        import ml_dtypes

        return float(ml_dtypes.finfo(d).smallest_normal)
    except (TypeError, ValueError, ImportError):  # pragma: no cover - plain NumPy dtypes
        return float(np.finfo(d).tiny)


def _row_ulp_check(a: np.ndarray, g: np.ndarray, budget: float, names: RowNames) -> Check:
    d = g.dtype if g.dtype in _MANTISSA else BF16
    errs = row_ulp_errors(_finite64(a), _finite64(g), d)
    w = int(np.nanargmax(errs)) if errs.size else 0
    worst = float(errs[w]) if errs.size else 0.0
    return Check(
        "row ULP budget",
        worst <= budget,
        worst,
        budget,
        names(w) if g.ndim > 1 else None,
        f"ULPs of {d} at each row's largest |golden|; {int((errs > budget).sum())} rows beyond",
    )


def _loose_tolerance(tol: dict, g: np.ndarray) -> list[str]:
    """Warnings for a tolerance looser than the golden it judges."""
    if tol["mode"] != "compare" or not g.size:
        return []
    top = float(np.max(np.abs(_finite64(g))))
    if tol["atol"] >= top:
        return [
            f"loose tolerance: atol {tol['atol']:g} >= max |golden| {top:.4g}, so the seeds' "
            "element rule alone would pass an all-zero output (the golden-aware checks decide)"
        ]
    return []


def judge_floats(a, g, tol, rule, name, arithmetic, names, precision, kind=None) -> dict:
    """The :class:`~tilesim.reference.judging.report.Verdict` fields of a float pair ``a``,
    ``g`` (host arrays of one shape) under the checked tolerance ``tol``: ``checks`` (the
    seeds' element rule in mode ``"compare"``; with ``rule="default"`` also a finiteness check
    outside mode ``"compare"``, the golden-aware layer and the row-ULP budget), ``seeds`` (the
    seeds' report) and ``warnings`` (a loose tolerance)."""
    fields: dict = {"checks": []}
    if tol["mode"] == "compare":
        rep = compare(a, g, atol=tol["atol"], rtol=tol["rtol"], ratio=tol["ratio"], name=name,
                      check_dtype=False, arithmetic=arithmetic)  # fmt: skip
        fields["seeds"] = rep
        txt = (
            f"{rep.n_fail} failing elements, allowed {rep.threshold} "
            f"(atol {rep.atol:g}, rtol {rep.rtol:g}, ratio {rep.ratio:g})"
        )
        if rep.n_nonfinite:
            txt += f"; {rep.n_nonfinite} NaN/Inf in actual (hard failure)"
        fields["checks"].append(
            Check("seeds element rule", rep.passed, rep.n_fail, rep.threshold,
                  rep.worst[0][0] if rep.worst else None, txt)
        )  # fmt: skip
    if rule == "seeds":
        return fields
    n_bad, _ = nonfinite(a)
    if tol["mode"] != "compare" and n_bad:
        fields["checks"].append(Check("finite", False, n_bad, 0, None, "NaN/Inf in actual"))
    fields["checks"] += _golden_aware(a, g, names, precision, kind)
    if "row_ulp" in tol:
        fields["checks"].append(_row_ulp_check(a, g, tol["row_ulp"], names))
    fields["warnings"] = _loose_tolerance(tol, g)
    return fields


__all__ = ["L2_FLOOR", "OP_L2_UNITS", "ROW_L2_UNITS", "ROW_NORM_FLOOR", "TENSOR_L2_UNITS",
           "UNIT_ROUNDOFF", "cosine_bound", "judge_floats", "l2_bounds", "l2_units", "max_ulp",
           "nonfinite", "row_ulp_errors"]  # fmt: skip
