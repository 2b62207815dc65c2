"""Judge a device output against a golden: the Ascend-house rule plus a diagnostic report.

Rule (pypto-gym ``common_utils.compare``, ``op-facts`` §6):

1. Any NaN or +-Inf in the tested tensor ``actual`` is a hard failure (``golden`` is not checked).
2. Shapes must be equal (and dtypes, unless ``check_dtype=False``).
3. An element fails when ``|actual - golden| > atol + rtol * |golden|`` (strict ``>``).
4. Pass when the number of failing elements is ``<= round(ratio * numel)`` (Python ``round``,
   half to even); ``ratio=0`` demands every element pass.

``arithmetic="float64"`` (default) evaluates step 3 exactly; ``arithmetic="native"`` rounds
``|a-b|``, ``rtol*|b|`` and the sum to the tensors' own dtype as the seeds' torch code does for
BF16 tensors (a few borderline elements can flip).

The report adds max abs error, max ULP distance in the output dtype, cosine similarity (float64)
and the worst positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tilesim.reference.numerics import ulp_distance
from tilesim.shared.casts import BF16, FP8_E4M3


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
        if self.reason:
            lines.append(f"  reason: {self.reason}")
        for idx, a, g, d, t in self.worst:
            lines.append(f"  at {idx}: actual {a:.8g} golden {g:.8g} |diff| {d:.4g} tol {t:.4g}")
        return "\n".join(lines)


def _as_array(x) -> np.ndarray:
    from tilesim.reference.interop import is_torch_tensor, to_numpy

    return to_numpy(x) if is_torch_tensor(x) else np.asarray(x)


def _native_round(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if dtype in (BF16, FP8_E4M3, np.dtype(np.float16), np.dtype(np.float32)):
        return x.astype(np.float32).astype(dtype).astype(np.float64)
    return x


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

    Accepts NumPy/ml_dtypes arrays or CPU torch tensors. Returns a :class:`CompareReport`
    (truthy when it passes); raises ``ValueError``/``TypeError`` on bad arguments.
    """
    a = _as_array(actual)
    g = _as_array(golden)
    for nm, v in (("atol", atol), ("rtol", rtol), ("ratio", ratio)):
        if not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
            raise ValueError(f"{nm}: expected a finite number >= 0, got {v!r}")
    if ratio > 1:
        raise ValueError(f"ratio: expected a fraction in [0, 1], got {ratio!r}")
    if arithmetic not in ("float64", "native"):
        raise ValueError(f"arithmetic: expected 'float64' or 'native', got {arithmetic!r}")
    if a.shape != g.shape:
        raise ValueError(f"{name}: shape mismatch, actual {a.shape} vs golden {g.shape}")
    if check_dtype and a.dtype != g.dtype:
        raise TypeError(f"{name}: dtype mismatch, actual {a.dtype} vs golden {g.dtype}")

    numel = int(a.size)
    threshold = int(round(ratio * numel))
    a64 = a.astype(np.float64)
    g64 = g.astype(np.float64)
    nonfinite = ~np.isfinite(a64)
    n_nonfinite = int(nonfinite.sum())

    with np.errstate(invalid="ignore", over="ignore"):
        if arithmetic == "native":
            diff = np.abs(_native_round(a64 - g64, a.dtype))
            tol = _native_round(atol + _native_round(rtol * np.abs(g64), a.dtype), a.dtype)
        else:
            diff = np.abs(a64 - g64)
            tol = atol + rtol * np.abs(g64)
        fail = ~(diff <= tol)  # NaN diffs fail
    n_fail = int(fail.sum())

    finite_diff = np.where(np.isfinite(diff), diff, -1.0)
    if numel:
        flat = int(np.argmax(finite_diff))
        max_abs = float(finite_diff.reshape(-1)[flat])
        max_pos = tuple(int(i) for i in np.unravel_index(flat, a.shape))
    else:
        max_abs, max_pos = 0.0, None
    if a.dtype == g.dtype and a.dtype.kind == "f" or a.dtype in (BF16, FP8_E4M3):
        ulps = ulp_distance(a, g) if a.dtype == g.dtype else np.zeros(a.shape, np.int64)
        max_ulp = int(ulps.max()) if numel else 0
        exact = float((ulps == 0).mean()) if numel else 1.0
    else:
        max_ulp = 0
        exact = float((a64 == g64).mean()) if numel else 1.0
    fa = np.where(np.isfinite(a64), a64, 0.0).reshape(-1)
    fg = np.where(np.isfinite(g64), g64, 0.0).reshape(-1)
    denom = np.sqrt(np.dot(fa, fa) * np.dot(fg, fg))
    cosine = (
        float(np.dot(fa, fg) / denom)
        if denom > 0
        else (1.0 if not fa.any() and not fg.any() else 0.0)
    )

    worst = []
    if n_fail and n_worst:
        score = np.where(fail, np.where(np.isfinite(diff), diff, np.inf), -1.0).reshape(-1)
        order = np.argsort(-score, kind="stable")[: min(n_worst, n_fail)]
        for f in order:
            idx = tuple(int(i) for i in np.unravel_index(int(f), a.shape))
            worst.append((idx, float(a64[idx]), float(g64[idx]), float(diff[idx]), float(tol[idx])))

    reasons = []
    if n_nonfinite:
        reasons.append(f"{n_nonfinite} NaN/Inf in the tested tensor (hard failure)")
    if n_fail > threshold:
        reasons.append(f"{n_fail} failing elements > allowed {threshold}")
    passed = not reasons
    return CompareReport(
        passed=passed,
        name=name,
        shape=tuple(a.shape),
        dtype=str(a.dtype),
        numel=numel,
        n_fail=n_fail,
        threshold=threshold,
        n_nonfinite=n_nonfinite,
        max_abs_err=max_abs,
        max_abs_pos=max_pos,
        max_ulp=max_ulp,
        bit_exact_fraction=exact,
        cosine=cosine,
        atol=float(atol),
        rtol=float(rtol),
        ratio=float(ratio),
        reason="; ".join(reasons),
        worst=worst,
    )
