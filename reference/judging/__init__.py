"""One verdict for every output kind: float tensors, index sets and row-ULP budgets.

:func:`judge` is the single entry point the CLI, the sim tests and the bench call. It takes the
case's tolerance dict explicitly (``{"atol", "rtol", "ratio", "mode"}``, ``mode`` one of
``"compare"``, ``"set"``, ``"ulp"``; an optional ``"row_ulp"`` adds a row-ULP budget: the dict
of :func:`tilesim.shared.registry.case_schema.tolerance`) and returns
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

This module is the entry: the arguments, the output kinds and :func:`judge`. The float rules
are :mod:`tilesim.reference.judging.float_rules`, the id sets and their ties
:mod:`tilesim.reference.judging.ties`, the verdict's records and its text and JSON
:mod:`tilesim.reference.judging.report`; their public names are importable from here too.
"""

from __future__ import annotations

import numpy as np
from tilesim.reference.judging.float_rules import (
    L2_FLOOR,
    OP_L2_UNITS,
    ROW_L2_UNITS,
    ROW_NORM_FLOOR,
    TENSOR_L2_UNITS,
    UNIT_ROUNDOFF,
    cosine_bound,
    judge_floats,
    l2_bounds,
    l2_units,
    max_ulp,
    nonfinite,
    row_ulp_errors,
)
from tilesim.reference.judging.report import (
    N_POSITIONS,
    Check,
    RowNames,
    Verdict,
    relabel,
    row_names,
)
from tilesim.reference.judging.ties import TIE_ULPS, IdReport, IdRow, judge_id_rows
from tilesim.reference.util.numerics import ULP_DTYPES
from tilesim.shared.registry.ops import judge_kinds
from tilesim.shared.registry.tolerance import check_tolerance
from tilesim.shared.validate import (
    check_choice,
    check_dtype_choice,
    check_int_sequence,
    check_str,
    host_data,
)

#: (output kind, names of the leading axes) of each op's judged output, by the judge's
#: ``kind``: the kinds the registry of ops names (:func:`tilesim.shared.registry.ops.judge_kinds`),
#: then the two plain kinds
JUDGE_KINDS = {**judge_kinds(), "float": ("float", None), "ids": ("ids", None)}
RULES = ("default", "seeds")


# ---------------------------------------------------------------------------------------------
# arguments


def _check_tolerance(tol, rule: str, kind: str) -> dict:
    """The tolerance dict checked by the one validator
    (:func:`tilesim.shared.registry.tolerance.check_tolerance`), in the form the verdict records
    (``mode``, ``ratio``, ``atol`` and ``rtol`` in mode ``"compare"``, ``row_ulp`` when
    given), and a mode the rule can judge the kind with."""
    checked = check_tolerance(tol)
    mode = checked["mode"]
    out = {"mode": mode, "ratio": checked["ratio"]}
    if mode == "compare":
        out.update(atol=checked["atol"], rtol=checked["rtol"])
    if "row_ulp" in checked:
        out["row_ulp"] = checked["row_ulp"]
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
    check_choice(kind, "kind", tuple(JUDGE_KINDS))
    k, axes = JUDGE_KINDS[kind]
    if k == "ids" and g.dtype.kind not in "iu":
        raise TypeError(f"golden: expected an integer dtype for id outputs, got {g.dtype}")
    return k, axes


def _check_ids(a: np.ndarray, g: np.ndarray) -> None:
    """An id pair: ``actual`` of an integer dtype (the golden's was checked with the kind), and
    both within INT64: ids are read as INT64 (``-1`` = an empty slot), so an unsigned 64-bit id
    above its maximum would wrap to a negative id (``2**64 - 1`` to an empty slot)."""
    if a.dtype.kind not in "iu":
        raise TypeError(f"actual: expected an integer dtype for id outputs, got {a.dtype}")
    for ids, name in ((a, "actual"), (g, "golden")):
        top = int(ids.max()) if ids.dtype == np.uint64 and ids.size else 0
        if top > np.iinfo(np.int64).max:
            raise ValueError(f"{name}: expected ids within the INT64 range (they are read as "
                             f"INT64, -1 = an empty slot), got {top}")  # fmt: skip


def _check_options(rule, name, arithmetic, precision, row_shape) -> tuple | None:
    """Check the options; return ``row_shape`` as a tuple of ints (``None`` when not given)."""
    check_choice(rule, "rule", RULES)
    check_str(name, "name", nonempty=False)
    check_choice(arithmetic, "arithmetic", ("float64", "native"))
    if precision is not None:
        check_dtype_choice(precision, "precision", UNIT_ROUNDOFF)
    return None if row_shape is None else check_int_sequence(row_shape, "row_shape", lo=1)


# ---------------------------------------------------------------------------------------------
# the verdict


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
    float scores ``[..., candidates]`` (the golden ids' leading shape or their rows flattened,
    then candidates >= 1) make ties recognisable. ``tolerance``: ``{"mode", "atol", "rtol",
    "ratio"}`` as the case states it, optionally ``"row_ulp"`` (a row-ULP budget,
    :func:`row_ulp_errors`). ``kind``: ``"float"``, ``"ids"``
    or an op name of :data:`JUDGE_KINDS` (names the coordinates in the report; a calibrated
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
    flattened (``(T, nq)`` for a DeepSeek attention output ``[T*nq, 512]``), ints >= 1.

    Raises ValueError/TypeError naming the argument before any work.
    """
    row_shape = _check_options(rule, name, arithmetic, precision, row_shape)
    g = host_data(golden, "golden", scalars=True)
    a = host_data(actual, "actual", scalars=True)
    k, axes = _resolve_kind(kind, tolerance.get("mode") if isinstance(tolerance, dict) else None, g)
    names = row_names(g, axes, row_shape, row_labels)
    tol = _check_tolerance(tolerance, rule, k)
    if k == "ids":
        _check_ids(a, g)
    a, note = _fit_shape(a, g, name)
    if k == "ids":
        fields = judge_id_rows(a, g, tol, rule, name, scores, names, visible)
        ulps = (None, None)
    else:
        fields = judge_floats(a, g, tol, rule, name, arithmetic, names, precision, kind)
        ulps = max_ulp(a, g)
    n_bad, where = nonfinite(a) if a.dtype.kind == "f" or a.dtype in ULP_DTYPES else (0, [])
    n_gbad = nonfinite(g)[0] if g.dtype.kind == "f" or g.dtype in ULP_DTYPES else 0
    checks = fields.pop("checks")
    where = relabel(fields.get("seeds"), checks, where, names.labels)
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


__all__ = ["JUDGE_KINDS", "L2_FLOOR", "N_POSITIONS", "OP_L2_UNITS", "ROW_L2_UNITS",
           "ROW_NORM_FLOOR", "RULES", "TENSOR_L2_UNITS", "TIE_ULPS", "UNIT_ROUNDOFF", "Check",
           "IdReport", "IdRow", "RowNames", "Verdict", "cosine_bound", "judge", "l2_bounds",
           "l2_units", "row_ulp_errors"]  # fmt: skip
