"""One verdict for every output kind: float tensors, index sets and row-ULP budgets.

:func:`judge` is the single entry point the CLI, the sim tests and the bench call. It takes the
case's tolerance dict explicitly (``{"atol", "rtol", "ratio", "mode"}``, ``mode`` one of
``"compare"``, ``"set"``, ``"ulp"``; an optional ``"row_ulp"`` adds a row-ULP budget: the dict
of :func:`tilesim.shared.case_schema.tolerance`) and returns
a :class:`Verdict` that says which rule failed, where and by how much (docs/numerics.md,
"Judging an output").

Two rules:

* ``rule="seeds"`` — the seeds' element rule alone, exactly :func:`tilesim.reference.compare`
  (ids: each row sorted, then the same rule with ``atol = rtol = 0``). This is what pypto-gym's
  ``compare`` says, including its blind spots (an all-zero output passes a loose ``atol``).
* ``rule="default"`` — the seeds' rule AND a golden-aware layer. Floats: the relative L2 error
  ``||a - g|| / ||g||`` and the cosine similarity, over the whole tensor and per row (one row =
  the last axis: one head of one token for attention outputs, one token for MoE), against
  bounds in units of the output's unit roundoff ``u`` (BF16 ``2^-8``): the op's calibrated
  multiple (:data:`OP_L2_UNITS`, set between the worst correct output and the smallest fault of
  the op's calibration) where ``kind`` names a calibrated op, else the dtype's rule
  (:data:`TENSOR_L2_UNITS`, :data:`ROW_L2_UNITS`); a tolerance looser than the golden itself
  (``atol >= max |golden|``) is flagged. Ids: each
  row's ids as a set, with ties accepted only where the golden's scores tie within the score
  dtype's rounding (:data:`TIE_ULPS`).

Shapes: an ``actual`` whose shape differs from the golden's but whose element count matches is
compared after a C-order reshape, which the verdict states; else ``ValueError`` names the
expected shape. ULPs are counted in the golden's dtype when ``actual`` is wider (the figure in
``actual``'s dtype is kept too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from tilesim.reference.compare import CompareReport, compare
from tilesim.reference.numerics import ULP_DTYPES, ulp_distance
from tilesim.shared.case_schema import TOLERANCE_MODES
from tilesim.shared.casts import BF16, FP8_E4M3
from tilesim.shared.ops import judge_l2_units, judge_layouts
from tilesim.shared.ranking import rank
from tilesim.shared.validate import check_choice, check_float, check_str, host_data

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
#: (:attr:`tilesim.shared.op_record.Call.l2_units`)
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
#: two golden scores this many ULPs (score dtype) apart or closer tie
TIE_ULPS = 1
#: positions listed for NaN/Inf and for rows that fail
N_POSITIONS = 10
#: the mantissa bits of the dtypes a row-ULP budget is counted in
_MANTISSA = {BF16: 7, np.dtype(np.float16): 10, np.dtype(np.float32): 23, FP8_E4M3: 3}
#: (output kind, names of the leading axes) of each op's judged output, by the judge's
#: ``kind``: the layouts the registry of ops names (:func:`tilesim.shared.ops.judge_layouts`),
#: then the two plain kinds
OP_LAYOUTS = {**judge_layouts(), "float": ("float", None), "ids": ("ids", None)}
RULES = ("default", "seeds")


@dataclass
class Check:
    """One rule of a verdict: ``value`` against ``bound`` (pass when ``value <= bound``, or
    ``>=`` for ``higher_is_better``), the worst coordinates and a sentence."""

    name: str
    passed: bool
    value: float
    bound: float
    where: tuple | str | None = None
    text: str = ""
    higher_is_better: bool = False

    def line(self) -> str:
        op = ">=" if self.higher_is_better else "<="
        mark = "ok  " if self.passed else "FAIL"
        at = f" at {self.where}" if self.where is not None else ""
        s = f"  [{mark}] {self.name}: {self.value:.6g} (bound {op} {self.bound:.6g}){at}"
        return s + (f"; {self.text}" if self.text else "")


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

    def _ids(self, what: str, label: str) -> str:
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
        parts = [self._ids(what, label) for what, label in _ID_LABELS if getattr(self, what)]
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


@dataclass
class Verdict:
    """Outcome of :func:`judge`; truthy when it passes. ``checks`` holds every rule applied
    (``failed`` their names where they fail); ``seeds`` the seeds' report (floats)."""

    passed: bool
    rule: str
    kind: str
    name: str
    shape: tuple
    dtype: str
    golden_dtype: str
    checks: list = field(default_factory=list)
    seeds: CompareReport | None = None
    ids: IdReport | None = None
    n_nonfinite: int = 0
    nonfinite: list = field(default_factory=list)  # [(index, value as text)]
    n_golden_nonfinite: int = 0
    reshape: str = ""
    warnings: list = field(default_factory=list)
    max_ulp: int | None = None  # in actual's dtype
    max_ulp_golden: int | None = None  # in the golden's dtype (when actual is wider)
    tolerance: dict = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.passed

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.checks if not c.passed]

    # the seeds' figures, for callers that print them (ids: the rows wrong; no seeds' rule: 0)
    @property
    def n_fail(self) -> int:
        if self.seeds is not None:
            return self.seeds.n_fail
        return len(self.ids.wrong) if self.ids is not None else 0

    @property
    def threshold(self) -> int:
        return self.seeds.threshold if self.seeds is not None else 0

    @property
    def max_abs_err(self) -> float:
        return self.seeds.max_abs_err if self.seeds is not None else 0.0

    def value(self, check: str) -> float:
        """The measured value of the check named ``check`` (KeyError naming the checks run)."""
        for c in self.checks:
            if c.name == check:
                return c.value
        raise KeyError(f"check: expected one of {[c.name for c in self.checks]}, got {check!r}")

    def summary(self) -> str:
        return _summary(self)

    def as_dict(self) -> dict:
        return _as_dict(self)


# ---------------------------------------------------------------------------------------------
# arguments


def _check_tolerance(tol, rule: str, kind: str) -> dict:
    """The tolerance dict, checked: ``mode`` and the numbers the rule needs."""
    if not isinstance(tol, dict) or "mode" not in tol:
        raise TypeError(
            f"tolerance: expected a dict with a 'mode' key (the case's tolerance), got {tol!r}"
        )
    mode = check_choice(tol["mode"], "tolerance.mode", TOLERANCE_MODES)
    out = {"mode": mode, "ratio": check_float(tol.get("ratio", 0.0) or 0.0, "tolerance.ratio")}
    if not 0 <= out["ratio"] <= 1:
        raise ValueError(f"tolerance.ratio: expected a fraction in [0, 1], got {out['ratio']}")
    if mode == "compare":
        for k in ("atol", "rtol"):
            if tol.get(k) is None:
                raise ValueError(f"tolerance.{k}: expected a number for mode 'compare', got None")
            out[k] = check_float(tol[k], f"tolerance.{k}")
            if out[k] < 0:
                raise ValueError(f"tolerance.{k}: expected a number >= 0, got {tol[k]!r}")
    if tol.get("row_ulp") is not None:
        out["row_ulp"] = check_float(tol["row_ulp"], "tolerance.row_ulp")
        if out["row_ulp"] < 0:
            raise ValueError(f"tolerance.row_ulp: expected a number >= 0, got {tol['row_ulp']}")
    if mode == "ulp" and rule == "seeds" and kind == "float":
        raise ValueError(
            "tolerance.mode: 'ulp' has no published atol/rtol, so the seeds' rule cannot judge "
            "it (use rule 'default')"
        )
    if mode == "set" and kind != "ids":
        raise ValueError("tolerance.mode: 'set' judges id outputs; kind must be 'ids'")
    return out


def _fit_shape(a: np.ndarray, g: np.ndarray, name: str) -> tuple[np.ndarray, str]:
    """``actual`` in the golden's shape: as is, or reshaped (C order) when only the element
    count matches (the note says so); else ValueError naming the expected shape."""
    if a.shape == g.shape:
        return a, ""
    if a.size == g.size:
        note = f"actual {list(a.shape)} reshaped to the golden's {list(g.shape)} (C order)"
        return a.reshape(g.shape), note
    raise ValueError(
        f"actual: expected the golden's shape {list(g.shape)} ({g.size} elements) or any shape "
        f"with {g.size} elements, got {list(a.shape)} ({a.size} elements) ({name})"
    )


def _resolve_kind(kind, tol_mode: str, g: np.ndarray):
    """(kind, axis names) from ``kind`` (an op name or ``"float"``/``"ids"``) or the mode."""
    if kind is None:
        kind = "ids" if tol_mode == "set" else "float"
    check_choice(kind, "kind", tuple(OP_LAYOUTS))
    k, axes = OP_LAYOUTS[kind]
    if k == "ids" and g.dtype.kind not in "iu":
        raise TypeError(f"golden: expected an integer dtype for id outputs, got {g.dtype}")
    return k, axes


# ---------------------------------------------------------------------------------------------
# float outputs: positions, ULPs, the golden-aware layer


def _nonfinite(a: np.ndarray) -> tuple[int, list]:
    """(count, first :data:`N_POSITIONS` ``(index, "nan"/"inf"/"-inf")``) of ``a``."""
    with np.errstate(invalid="ignore", over="ignore"):
        bad = ~np.isfinite(a.astype(np.float64))
    pos = np.argwhere(bad)[:N_POSITIONS]
    out = [(tuple(int(i) for i in p), str(float(a[tuple(p)]))) for p in pos]
    return int(bad.sum()), out


def _relabel(seeds: CompareReport | None, checks: list, nonfinite: list, labels) -> list:
    """Element coordinates ``(row, ...)`` of the seeds' report and of the checks (in place)
    and of ``nonfinite`` (returned) with the rows' ``labels`` (``None``: unchanged) in place of
    the row index."""
    if labels is None:
        return nonfinite

    def lab(p):
        return (labels[p[0]], *p[1:]) if isinstance(p, tuple) and len(p) > 1 else p

    if seeds is not None:
        seeds.max_abs_pos = lab(seeds.max_abs_pos)
        seeds.worst = [(lab(p), *rest) for p, *rest in seeds.worst]
    for c in checks:
        c.where = lab(c.where)
    return [(lab(p), x) for p, x in nonfinite]


def _max_ulp(a: np.ndarray, g: np.ndarray) -> tuple[int | None, int | None]:
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
    with np.errstate(invalid="ignore", over="ignore"):
        x = x.astype(np.float64)
    return np.where(np.isfinite(x), x, 0.0)


def _rows(x: np.ndarray) -> np.ndarray:
    """``x`` as ``[rows, last axis]`` (a 0-d or 1-d tensor is one row)."""
    return x.reshape(1, -1) if x.ndim <= 1 else x.reshape(-1, x.shape[-1])


@dataclass(frozen=True)
class RowNames:
    """How a report names a row (a flat index over the leading axes): ``lead`` the leading
    shape the index unravels over, ``axes`` their names (``None``: plain indices). One name
    per leading axis gives ``"token 3, head 5"``; names for an axis the golden stores
    flattened (a DeepSeek attention output ``[T*nq, 512]`` whose heads are not given) give
    ``"token*head 389"``."""

    lead: tuple
    axes: tuple | None = None
    labels: tuple | None = None  # each row's index in a larger tensor (a cache's slots)

    def __call__(self, flat_row: int) -> tuple | str:
        if self.labels is not None:
            return (self.labels[flat_row],)
        idx = tuple(int(i) for i in np.unravel_index(flat_row, self.lead)) if self.lead else ()
        if self.axes is not None and len(self.axes) == len(idx):
            return ", ".join(f"{n} {i}" for n, i in zip(self.axes, idx, strict=True))
        if self.axes is not None and len(idx) == 1:
            return f"{'*'.join(self.axes)} {idx[0]}"
        return idx


def _row_names(g: np.ndarray, axes, row_shape, row_labels=None) -> RowNames:
    """The :class:`RowNames` of the golden ``g``: its leading shape, or ``row_shape`` (the
    leading axes of a golden stored with them flattened; their product must be the rows), or
    ``row_labels`` (one index per row of a 2-D golden)."""
    lead = tuple(g.shape[:-1]) if g.ndim > 1 else ()
    if row_labels is not None:
        labels = np.asarray(row_labels).reshape(-1)
        if g.ndim != 2 or labels.dtype.kind not in "iu" or labels.size != g.shape[0]:
            raise ValueError(f"row_labels: expected one integer label per row of a 2-D "
                             f"golden {list(g.shape)}, got {labels.dtype}"
                             f"{list(labels.shape)}")  # fmt: skip
        return RowNames(lead, None, tuple(int(x) for x in labels))
    if row_shape is None:
        return RowNames(lead, axes)
    shape = tuple(int(n) for n in row_shape)
    if (
        int(np.prod(shape, dtype=np.int64)) != int(np.prod(lead, dtype=np.int64))
        or min(shape, default=1) < 1
    ):
        raise ValueError(
            f"row_shape: expected leading axes of {int(np.prod(lead, dtype=np.int64))} rows "
            f"(the golden {list(g.shape)}), got {list(shape)}"
        )
    return RowNames(shape, axes)


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
    ar, gr = _rows(a64), _rows(g64)
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
        _rows(np.asarray(actual).astype(np.float64)),
        _rows(np.asarray(golden).astype(np.float64)),
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


def _judge_float(a, g, tol, rule, name, arithmetic, names, precision, kind=None) -> dict:
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
    n_bad, _ = _nonfinite(a)
    if tol["mode"] != "compare" and n_bad:
        fields["checks"].append(Check("finite", False, n_bad, 0, None, "NaN/Inf in actual"))
    fields["checks"] += _golden_aware(a, g, names, precision, kind)
    if "row_ulp" in tol:
        fields["checks"].append(_row_ulp_check(a, g, tol["row_ulp"], names))
    fields["warnings"] = _loose_tolerance(tol, g)
    return fields


# ---------------------------------------------------------------------------------------------
# id outputs


def _check_scores(scores, n_rows: int, name: str) -> np.ndarray | None:
    """The golden's scores as ``[rows, candidates]`` (any float dtype), or None."""
    if scores is None:
        return None
    s = host_data(scores, "scores")
    if s.dtype not in ULP_DTYPES:
        raise TypeError(f"scores: expected a float dtype, got {s.dtype} ({name})")
    if s.ndim < 1 or s.size == 0 or s.size % n_rows or (s.size // n_rows) < 1:
        raise ValueError(
            f"scores: expected [{n_rows} rows, candidates] (one row per id row), got "
            f"{list(s.shape)} ({name})"
        )
    return s.reshape(n_rows, -1)


def _ties(s_row: np.ndarray, x: int, y: int, finite: bool = False) -> bool:
    """Do candidates ``x`` and ``y`` tie: scores within :data:`TIE_ULPS` of the score dtype
    (``finite``: and both finite)."""
    pair = s_row[[x, y]]
    if finite and not np.all(np.isfinite(pair.astype(np.float64))):
        return False
    d = int(ulp_distance(pair[:1], pair[1:])[0])
    return 0 <= d <= TIE_ULPS


def _pair_ties(s_row, missing: list, extra: list, finite: bool = False):
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
        ties, missing, extra = _pair_ties(s_row, missing, extra, finite=visible is None)
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


def _check_visible(visible, n_rows: int, name: str) -> np.ndarray | None:
    """The rows' visible lengths as int64 ``[rows]`` (each >= 0), or None."""
    if visible is None:
        return None
    v = np.asarray(host_data(visible, "visible", scalars=True))
    if v.dtype.kind not in "iu" or v.size != n_rows or (v.size and v.min() < 0):
        raise ValueError(
            f"visible: expected {n_rows} integer lengths >= 0 (one per id row), got "
            f"{v.dtype}{list(v.shape)} ({name})"
        )
    return v.reshape(-1).astype(np.int64)


def _judge_ids(a, g, tol, rule, name, scores, names, visible) -> dict:
    if rule == "seeds":  # the seeds' view: rows sorted, then exact element equality
        sa, sg = np.sort(a.astype(np.int64), axis=-1), np.sort(g.astype(np.int64), axis=-1)
        rep = compare(sa, sg, atol=0.0, rtol=0.0, ratio=tol["ratio"], name=name, check_dtype=False)
        return {"seeds": rep, "checks": [Check("seeds element rule (sorted rows)", rep.passed,
                rep.n_fail, rep.threshold, rep.max_abs_pos)]}  # fmt: skip
    ar, gr = _rows(a.astype(np.int64)), _rows(g.astype(np.int64))
    s = _check_scores(scores, gr.shape[0], name)
    vis = _check_visible(visible, gr.shape[0], name)
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


# ---------------------------------------------------------------------------------------------
# the verdict


def _check_options(rule, name, arithmetic, precision) -> None:
    check_choice(rule, "rule", RULES)
    check_str(name, "name", nonempty=False)
    check_choice(arithmetic, "arithmetic", ("float64", "native"))
    if precision is not None and np.dtype(precision) not in UNIT_ROUNDOFF:
        raise TypeError(
            f"precision: expected one of {[str(d) for d in UNIT_ROUNDOFF]}, got {precision!r}"
        )


def judge(
    actual,
    golden,
    tolerance: dict,
    *,
    scores=None,
    kind: str | None = None,
    rule: str = "default",
    name: str = "output",
    arithmetic: str = "float64",
    precision=None,
    visible=None,
    row_shape=None,
    row_labels=None,
) -> Verdict:
    """Judge ``actual`` (a device output) against ``golden`` under the case's ``tolerance``.

    ``actual``, ``golden``: NumPy/ml_dtypes arrays or torch tensors, not modified. Floats: any
    float dtypes (a wider dump, e.g. FP32 against a BF16 golden, is judged as is; ULPs are
    reported in both dtypes). Ids (``kind`` ``"ids"``, an id op, or ``tolerance["mode"] ==
    "set"``): int32 or int64 ``[..., k]``, ``-1`` = an empty slot; ``scores`` = the golden's
    float scores ``[..., candidates]`` (one row per id row) make ties recognisable.
    ``tolerance``: ``{"mode", "atol", "rtol", "ratio"}`` as the case states it, optionally
    ``"row_ulp"`` (a row-ULP budget, :func:`row_ulp_errors`). ``kind``: ``"float"``, ``"ids"``
    or an op name of :data:`OP_LAYOUTS` (names the coordinates in the report; a calibrated
    op of :data:`OP_L2_UNITS` sets the L2 bounds). ``rule``:
    ``"default"`` or ``"seeds"`` (the module docstring). ``arithmetic``: of the seeds' rule.
    ``precision``: a dtype whose rounding the output carries although it is stored wider (the
    MSA main branch's BF16 / FP16 modes write FP32); the L2 bounds use the coarsest of it and
    the pair's dtypes, in the multiples of ``kind``'s calibration (:func:`l2_units`).
    ``visible`` (ids): each id row's visible length, ints ``[rows]``: a
    row's selection is then its first ``min(k, visible)`` entries (the entries a reader of the
    ids uses; ``-1`` among them is a missing id, an id after them is ``unread``), an id at or
    past the visible length is ``invisible`` and never a tie, whatever its score; without
    ``visible`` a ``-inf`` golden score ties nothing. ``row_labels`` (floats, 2-D): each row's
    index in a larger tensor (a cache's slots): the report names rows and elements by it.
    ``row_shape``: the leading axes the report names rows by when the golden stores them
    flattened (``(T, nq)`` for a DeepSeek attention output ``[T*nq, 512]``).

    Raises ValueError/TypeError naming the argument before any work.
    """
    _check_options(rule, name, arithmetic, precision)
    g = host_data(golden, "golden", scalars=True)
    a = host_data(actual, "actual", scalars=True)
    k, axes = _resolve_kind(kind, tolerance.get("mode") if isinstance(tolerance, dict) else None, g)
    names = _row_names(g, axes, row_shape, row_labels)
    tol = _check_tolerance(tolerance, rule, k)
    if k == "ids" and a.dtype.kind not in "iu":
        raise TypeError(f"actual: expected an integer dtype for id outputs, got {a.dtype}")
    a, note = _fit_shape(a, g, name)
    if k == "ids":
        fields = _judge_ids(a, g, tol, rule, name, scores, names, visible)
        ulps = (None, None)
    else:
        fields = _judge_float(a, g, tol, rule, name, arithmetic, names, precision, kind)
        ulps = _max_ulp(a, g)
    n_bad, where = _nonfinite(a) if a.dtype.kind == "f" or a.dtype in ULP_DTYPES else (0, [])
    n_gbad = _nonfinite(g)[0] if g.dtype.kind == "f" or g.dtype in ULP_DTYPES else 0
    checks = fields.pop("checks")
    where = _relabel(fields.get("seeds"), checks, where, names.labels)
    return Verdict(
        passed=all(c.passed for c in checks),
        rule=rule,
        kind=k,
        name=name,
        shape=tuple(g.shape),
        dtype=str(a.dtype),
        golden_dtype=str(g.dtype),
        checks=checks,
        n_nonfinite=n_bad,
        nonfinite=where,
        n_golden_nonfinite=n_gbad,
        reshape=note,
        max_ulp=ulps[0],
        max_ulp_golden=ulps[1],
        tolerance=dict(tol),
        warnings=fields.pop("warnings", []),
        **fields,
    )


# ---------------------------------------------------------------------------------------------
# text and JSON


def _summary(v: Verdict) -> str:
    head = "PASS" if v.passed else "FAIL"
    why = f" ({', '.join(v.failed)} failed)" if v.failed else ""
    lines = [
        f"{head} {v.name}: shape {v.shape} {v.dtype}"
        + (f" vs golden {v.golden_dtype}" if v.dtype != v.golden_dtype else "")
        + f", rule {v.rule}{why}"
    ]
    if v.reshape:
        lines.append(f"  note: {v.reshape}")
    if v.seeds is not None:
        lines += ["  " + s.strip() for s in v.seeds.summary().splitlines()[1:2]]
    if v.max_ulp_golden is not None and v.max_ulp_golden != v.max_ulp:
        lines.append(
            f"  max ULP {v.max_ulp_golden} in the golden's {v.golden_dtype} "
            f"({v.max_ulp} in the dump's {v.dtype})"
        )
    lines += [c.line() for c in v.checks]
    if v.n_nonfinite:
        pos = ", ".join(f"{i} = {x}" for i, x in v.nonfinite)
        more = ", ..." if v.n_nonfinite > len(v.nonfinite) else ""
        lines.append(f"  {v.n_nonfinite} NaN/Inf in actual at {pos}{more}")
    if v.n_golden_nonfinite:
        lines.append(f"  warning: {v.n_golden_nonfinite} NaN/Inf elements in the golden")
    if v.ids is not None:
        lines += [r.text() for r in (v.ids.wrong + v.ids.tied)[:N_POSITIONS]]
        if v.ids.boundary_ties:
            lines.append(
                f"  {v.ids.boundary_ties} unselected candidate(s) tie with a row's lowest "
                f"selected score (within {TIE_ULPS} ULP)"
            )
    if v.seeds is not None:
        for idx, x, y, d, t in v.seeds.worst[:N_POSITIONS]:
            lines.append(f"  at {idx}: actual {x:.8g} golden {y:.8g} |diff| {d:.4g} tol {t:.4g}")
    lines += [f"  warning: {w}" for w in v.warnings]
    return "\n".join(lines)


def _plain(x):
    """JSON-able copy: tuples to lists, NumPy scalars to Python, non-finite floats to text."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, (np.integer, np.bool_)):
        return x.item()
    if isinstance(x, (float, np.floating)):
        f = float(x)
        return f if math.isfinite(f) else str(f)
    return x


def _as_dict(v: Verdict) -> dict:
    d = {
        "passed": v.passed,
        "rule": v.rule,
        "kind": v.kind,
        "name": v.name,
        "shape": v.shape,
        "dtype": v.dtype,
        "golden_dtype": v.golden_dtype,
        "failed": v.failed,
        "checks": [vars(c) for c in v.checks],
        "n_nonfinite": v.n_nonfinite,
        "nonfinite": [{"index": i, "value": x} for i, x in v.nonfinite],
        "n_golden_nonfinite": v.n_golden_nonfinite,
        "reshape": v.reshape,
        "warnings": v.warnings,
        "max_ulp": v.max_ulp,
        "max_ulp_golden": v.max_ulp_golden,
        "tolerance": v.tolerance,
    }
    if v.seeds is not None:
        d["seeds"] = vars(v.seeds)
    if v.ids is not None:
        d["ids"] = {
            "n_rows": v.ids.n_rows,
            "k": v.ids.k,
            "scores_used": v.ids.scores_used,
            "boundary_ties": v.ids.boundary_ties,
            "wrong_rows": [vars(r) for r in v.ids.wrong],
            "tied_rows": [vars(r) for r in v.ids.tied],
        }
    return _plain(d)


__all__ = ["Check", "IdReport", "IdRow", "RowNames", "Verdict", "judge", "l2_bounds",
           "l2_units", "row_ulp_errors"]  # fmt: skip
