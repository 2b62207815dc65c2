"""What a verdict of :func:`tilesim.reference.judging.judge` says and how it says it.

:class:`Check` is one rule's outcome (a value against a bound, where, why); :class:`Verdict`
holds every check of one output with its text (:meth:`Verdict.summary`) and JSON
(:meth:`Verdict.as_dict`) forms. A row is the last axis of an output (:func:`rows`: one head
of one token for attention outputs, one token for MoE); :class:`RowNames` names a row in the
report by its leading axes (``"token 3, head 5"``) or by its index in a larger tensor (a
cache's slots). The float rules (:mod:`tilesim.reference.judging.float_rules`) and the id-set rules
(:mod:`tilesim.reference.judging.ties`) build these records; docs/numerics.md, "Judging an
output", states the rules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from tilesim.reference.judging.compare import CompareReport

if TYPE_CHECKING:
    from tilesim.reference.judging.ties import IdReport

#: positions listed for NaN/Inf and for rows that fail
N_POSITIONS = 10


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


def rows(x: np.ndarray) -> np.ndarray:
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


def row_names(g: np.ndarray, axes, row_shape, row_labels=None) -> RowNames:
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


def relabel(seeds: CompareReport | None, checks: list, nonfinite: list, labels) -> list:
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
        lines += v.ids.lines()
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


__all__ = ["N_POSITIONS", "Check", "RowNames", "Verdict", "relabel", "row_names", "rows"]
