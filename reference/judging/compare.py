"""Judge a device output against a golden: the Ascend-house rule plus a diagnostic report.

Rule (the seeds' ``common_utils.compare``,
``hicann/pypto-gym:src/pypto_gym/ops/pypto_tensor/common_utils/compare.py``;
docs/sources.md#compare-rule):

1. Any NaN or +-Inf in the tested tensor ``actual`` is a hard failure (``golden`` is not checked).
2. Shapes must be equal (and dtypes, unless ``check_dtype=False``).
3. An element fails when ``|actual - golden| > atol + rtol * |golden|`` (strict ``>``, in IEEE
   arithmetic exactly as the seeds' torch code: a NaN golden gives a NaN diff, an infinite
   golden an infinite (rtol > 0) or NaN (rtol = 0) tolerance, so a non-finite golden element
   never counts as failing; the report counts such elements in ``n_golden_nonfinite``).
4. Pass when the number of failing elements is ``<= round(ratio * numel)`` (Python ``round``
   of the float product, half to even); ``ratio=0`` demands every element pass.

``arithmetic="float64"`` (default) evaluates step 3 in float64 (exact for every input dtype up
to float32, and for integers of magnitude up to 2^53: a 64-bit integer input holding a larger
one is refused); ``arithmetic="native"`` reproduces torch on low-precision tensors: each of
``a-b``, ``rtol*|b|`` and ``atol + .`` is computed in float32 and rounded to the tensors' own
dtype (BF16/FP16; ``atol`` itself is first rounded to that dtype, as torch does), so a few
borderline elements can flip relative to float64. For other dtypes, or when the dtypes
differ, ``native`` falls back to float64.

The report adds max abs error, max ULP distance in the output dtype, cosine similarity (float64)
and the worst positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from tilesim.reference.util.numerics import ULP_DTYPES, ulp_distance
from tilesim.shared.casts import BF16, FP8_E4M3
from tilesim.shared.registry.tolerance import check_bound
from tilesim.shared.validate import (
    check_bool,
    check_choice,
    check_int,
    check_real,
    check_str,
    host_data,
)


@dataclass
class CompareReport:
    """Outcome of :func:`compare`. ``passed`` is the verdict; the rest explains it."""

    passed: bool
    name: str
    shape: tuple
    dtype: str
    numel: int
    n_fail: int
    threshold: int
    n_nonfinite: int
    max_abs_err: float
    max_abs_pos: tuple | None
    max_ulp: int
    bit_exact_fraction: float
    cosine: float
    atol: float
    rtol: float
    ratio: float
    reason: str = ""
    worst: list = field(default_factory=list)  # [(index, actual, golden, abs_err, tol)]
    n_golden_nonfinite: int = 0  # NaN/Inf in the golden (reported, not a failure by itself)

    def __bool__(self) -> bool:
        return self.passed

    def summary(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        lines = [
            f"{verdict} {self.name}: shape {self.shape} {self.dtype}, "
            f"{self.n_fail} failing elements (allowed {self.threshold}; "
            f"atol {self.atol:g}, rtol {self.rtol:g}, ratio {self.ratio:g})",
            f"  max |err| {self.max_abs_err:.6g} at {self.max_abs_pos}, max ULP {self.max_ulp}, "
            f"bit-exact {100 * self.bit_exact_fraction:.3f}%, cosine {self.cosine:.9f}",
        ]
        if self.n_nonfinite:
            lines.append(f"  {self.n_nonfinite} NaN/Inf elements in the tested tensor")
        if self.n_golden_nonfinite:
            lines.append(
                f"  warning: {self.n_golden_nonfinite} NaN/Inf elements in the golden "
                "(a non-finite golden element never counts as failing under the house rule)"
            )
        if self.reason:
            lines.append(f"  reason: {self.reason}")
        for idx, a, g, d, t in self.worst:
            lines.append(f"  at {idx}: actual {a:.8g} golden {g:.8g} |diff| {d:.4g} tol {t:.4g}")
        return "\n".join(lines)


_NATIVE_FLOATS = (BF16, FP8_E4M3, np.dtype(np.float16), np.dtype(np.float32))


def _round_to(x32: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Round float32 values to ``dtype`` (RNE) and widen back to float32 (identity for fp32)."""
    if dtype == np.float32:
        return x32
    return x32.astype(dtype).astype(np.float32)


def _ulp_stats(a: np.ndarray, g: np.ndarray, a64: np.ndarray, g64: np.ndarray):
    """(max ULP distance in the output dtype, fraction of bit-equal elements)."""
    if a.size == 0:
        return 0, 1.0
    if a.dtype in ULP_DTYPES:
        if g.dtype != a.dtype:
            # golden rounded once (RNE, via float32 unless the output is float64) to the
            # output dtype
            with np.errstate(invalid="ignore", over="ignore"):
                g = g64 if a.dtype == np.float64 else g64.astype(np.float32).astype(a.dtype)
        ulps = ulp_distance(a, g)
        return int(ulps.max()), float((ulps == 0).mean())
    # integer / bool outputs: one ULP is one unit
    ok = np.isfinite(g64)
    d = np.abs(a64 - g64)
    return (int(d[ok].max()) if ok.any() else -1), float((a64 == g64).mean())


#: the largest integer magnitude float64 holds exactly together with every integer below it
_EXACT_INT = 2**53


def _check_exact_ints(x: np.ndarray, name: str) -> None:
    """``ValueError`` when the 64-bit integer array ``x`` holds a magnitude above 2^53: such
    values are compared in float64, which is exact only up to 2^53 (2^53 + 1 would equal
    2^53). Narrower integers are always exact."""
    if x.dtype.kind not in "iu" or x.dtype.itemsize < 8 or not x.size:
        return
    big = x > _EXACT_INT
    if x.dtype.kind == "i":
        big |= x < -_EXACT_INT
    if big.any():
        idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(big)), x.shape))
        raise ValueError(
            f"{name}: expected {x.dtype} values of magnitude at most 2^53 (exact in float64 "
            f"only up to 2^53), got {int(x[idx])} at {idx}"
        )


def _check_arguments(actual, golden, atol, rtol, ratio, name, check_dtype, arithmetic, n_worst):
    """Validate the options and the pair; return ``(a, g, atol, rtol, ratio)``: the pair as
    host NumPy arrays, the tolerances as floats."""
    atol = check_bound(atol, "atol")
    rtol = check_bound(rtol, "rtol")
    ratio = check_bound(ratio, "ratio", fraction=True)
    check_str(name, "name", nonempty=False)
    check_bool(check_dtype, "check_dtype")
    check_choice(arithmetic, "arithmetic", ("float64", "native"))
    check_int(n_worst, "n_worst", lo=0)
    a = host_data(actual, "actual", scalars=True)
    g = host_data(golden, "golden", scalars=True)
    check_real(a, "actual")  # complex would lose its imaginary part in float64
    check_real(g, "golden")
    if a.shape != g.shape:
        raise ValueError(f"golden: expected the shape of actual {a.shape}, got {g.shape} ({name})")
    if check_dtype and a.dtype != g.dtype:
        raise TypeError(f"golden: expected the dtype of actual {a.dtype}, got {g.dtype} ({name})")
    _check_exact_ints(a, "actual")
    _check_exact_ints(g, "golden")
    return a, g, atol, rtol, ratio


def _element_rule(a, g, a64, g64, atol: float, rtol: float, arithmetic: str):
    """Step 3 of the rule: ``(diff, tol, fail)`` as float64 / bool arrays of the input shape."""
    with np.errstate(invalid="ignore", over="ignore"):
        if arithmetic == "native" and a.dtype in _NATIVE_FLOATS and g.dtype == a.dtype:
            # what torch 2.13 CPU does for a low-precision tensor (measured): each op
            # computes in float32 and rounds its result to the tensor dtype; the scalar of
            # ``rtol * t`` enters as float32, the scalar of ``atol + t`` is first rounded to
            # the tensor dtype
            a32, g32 = a64.astype(np.float32), g64.astype(np.float32)
            diff = np.abs(_round_to(a32 - g32, a.dtype))
            rel = _round_to(np.float32(rtol) * np.abs(g32), a.dtype)
            atol_t = _round_to(np.array(atol, dtype=np.float32), a.dtype)
            tol = _round_to(atol_t + rel, a.dtype)
            diff, tol = diff.astype(np.float64), tol.astype(np.float64)
        else:
            diff = np.abs(a64 - g64)
            tol = atol + rtol * np.abs(g64)
        # strict '>' in IEEE arithmetic, as the seeds: NaN diff or NaN/inf tol is not counted
        fail = diff > tol
    return diff, tol, fail


def _max_abs_error(diff: np.ndarray, finite: np.ndarray):
    """``(max finite |diff|, its index)``; ``(0.0, None)`` when empty, ``(nan, None)`` when no
    difference is finite."""
    if diff.size and finite.any():
        flat = int(np.argmax(np.where(finite, diff, -1.0)))
        pos = tuple(int(i) for i in np.unravel_index(flat, diff.shape))
        return float(diff.reshape(-1)[flat]), pos
    return (0.0 if not diff.size else math.nan), None


def _cosine(a64: np.ndarray, g64: np.ndarray) -> float:
    """Cosine similarity in float64 with non-finite entries taken as 0 (1.0 when both are 0)."""
    fa = np.where(np.isfinite(a64), a64, 0.0).reshape(-1)
    fg = np.where(np.isfinite(g64), g64, 0.0).reshape(-1)
    denom = math.sqrt(float(np.dot(fa, fa))) * math.sqrt(float(np.dot(fg, fg)))
    if denom > 0:
        return float(np.dot(fa, fg)) / denom
    return 1.0 if not fa.any() and not fg.any() else 0.0


def _worst_failures(fail, finite, diff, tol, a64, g64, n_worst: int) -> list:
    """Up to ``n_worst`` failing positions, largest ``|diff|`` first (non-finite ones first of
    all), as ``(index, actual, golden, |diff|, tol)``."""
    n_fail = int(fail.sum())
    if not n_fail or not n_worst:
        return []
    score = np.where(fail, np.where(finite, diff, np.inf), -1.0).reshape(-1)
    order = np.argsort(-score, kind="stable")[: min(n_worst, n_fail)]
    worst = []
    for f in order:
        idx = tuple(int(i) for i in np.unravel_index(int(f), diff.shape))
        worst.append((idx, float(a64[idx]), float(g64[idx]), float(diff[idx]), float(tol[idx])))
    return worst


def _verdict_reasons(n_nonfinite: int, n_fail: int, threshold: int) -> list[str]:
    """Steps 1 and 4 of the rule: why the comparison fails (empty = pass)."""
    reasons = []
    if n_nonfinite:
        reasons.append(f"{n_nonfinite} NaN/Inf in the tested tensor (hard failure)")
    if n_fail > threshold:
        reasons.append(f"{n_fail} failing elements > allowed {threshold}")
    return reasons


def _diagnostics(a, g, a64, g64, diff, tol, fail, n_worst: int) -> dict:
    """The report fields that explain a verdict: largest error and where, ULP distance and
    bit-exact share, cosine, the worst failing positions, NaN/Inf count of the golden."""
    finite = np.isfinite(diff)
    max_abs, max_pos = _max_abs_error(diff, finite)
    max_ulp, exact = _ulp_stats(a, g, a64, g64)
    return {
        "max_abs_err": max_abs,
        "max_abs_pos": max_pos,
        "max_ulp": max_ulp,
        "bit_exact_fraction": exact,
        "cosine": _cosine(a64, g64),
        "worst": _worst_failures(fail, finite, diff, tol, a64, g64, n_worst),
        "n_golden_nonfinite": int((~np.isfinite(g64)).sum()),
    }


def compare(
    actual,
    golden,
    *,
    atol: float,
    rtol: float,
    ratio: float = 0.005,
    name: str = "output",
    check_dtype: bool = True,
    arithmetic: str = "float64",
    n_worst: int = 10,
) -> CompareReport:
    """Compare ``actual`` (device output) with ``golden`` under the Ascend-house rule.

    ``actual`` and ``golden``: NumPy/ml_dtypes arrays (or NumPy scalars) or torch tensors
    (``requires_grad`` and BF16/FP8 included; tensors on another device are copied to the
    host) of a real dtype (float, integer or bool; complex is refused) and equal shape (and
    dtype unless ``check_dtype=False``). Neither is modified; lists are refused. Returns a
    :class:`CompareReport` (truthy when it passes); raises ``ValueError``/``TypeError``
    naming the bad argument.

    ``max_ulp`` / ``bit_exact_fraction`` are measured in the dtype of ``actual``; a golden of
    another dtype is first rounded to it (RNE). NaN in either tensor counts as not bit-exact
    and has no ULP distance (``max_ulp`` is -1 when no position has one).

    Integers are compared in float64, which holds every integer up to 2^53 exactly: an int64
    or uint64 ``actual`` / ``golden`` holding a magnitude above 2^53 raises ``ValueError``
    naming it (a lossy conversion would let ``2**53 + 1`` equal ``2**53``).
    """
    a, g, atol, rtol, ratio = _check_arguments(
        actual, golden, atol, rtol, ratio, name, check_dtype, arithmetic, n_worst
    )
    numel = int(a.size)
    threshold = int(round(ratio * numel))  # Python round: half to even, as the seeds
    with np.errstate(invalid="ignore", over="ignore"):
        a64 = a.astype(np.float64)
        g64 = g.astype(np.float64)
    n_nonfinite = int((~np.isfinite(a64)).sum())
    diff, tol, fail = _element_rule(a, g, a64, g64, atol, rtol, arithmetic)
    n_fail = int(fail.sum())
    reasons = _verdict_reasons(n_nonfinite, n_fail, threshold)
    return CompareReport(
        passed=not reasons, name=name, shape=tuple(a.shape), dtype=str(a.dtype), numel=numel,
        n_fail=n_fail, threshold=threshold, n_nonfinite=n_nonfinite, atol=atol, rtol=rtol,
        ratio=ratio, reason="; ".join(reasons),
        **_diagnostics(a, g, a64, g64, diff, tol, fail, n_worst),
    )  # fmt: skip
