"""The one tolerance validator: what a tolerance dict may hold, checked once with one set of
messages for every reader of one.

A tolerance is ``{"atol", "rtol", "ratio", "mode"}`` with an optional ``"row_ulp"``
(:data:`TOLERANCE_KEYS`, :data:`OPTIONAL_TOLERANCE_KEYS`; the modes and what they judge are in
:mod:`tilesim.shared.registry.case_schema` and docs/numerics.md, "Judging an output"). The rules:

* ``mode`` is one of :data:`TOLERANCE_MODES`;
* ``atol``, ``rtol`` and ``row_ulp`` are ``None`` or a real, finite number ``>= 0``; ``ratio``
  is ``None`` (read as 0) or a real, finite fraction in ``[0, 1]`` (:func:`check_bound`);
* no other key.

Three readers ask for more or for less (``form``):

* ``"case"`` — a named case's tolerance (:func:`tilesim.shared.registry.case_schema.tolerance`):
  every one of the four keys, ``atol``/``rtol`` numbers in mode ``"compare"`` and ``None`` in the
  modes that publish none;
* ``"judged"`` — what :func:`tilesim.reference.judging.judge` judges with: a ``mode``, and in mode
  ``"compare"`` numbers for ``atol`` and ``rtol``;
* ``"stated"`` — a golden's ``manifest.json`` (the CLI): any subset of the keys, ``mode``
  ``"compare"`` when absent; the command line's ``--atol/--rtol/--ratio`` complete it.

The seeds' :func:`tilesim.reference.compare` takes the numbers as separate arguments and checks
each with :func:`check_bound`.
"""

from __future__ import annotations

from tilesim.shared.validate import check_choice, check_float

TOLERANCE_MODES = ("compare", "set", "ulp")
#: the keys of a tolerance dict: the four every case states, then the optional ones
TOLERANCE_KEYS = ("atol", "rtol", "ratio", "mode")
OPTIONAL_TOLERANCE_KEYS = ("row_ulp",)
#: what each reader requires of a tolerance dict (module docstring)
FORMS = ("case", "judged", "stated")


def check_bound(value, name: str, *, fraction: bool = False) -> float:
    """One tolerance number as a ``float``: real and finite (``TypeError`` / ``ValueError`` of
    :func:`~tilesim.shared.validate.check_float`), ``>= 0``, and ``<= 1`` when ``fraction``
    (a ratio); ``ValueError`` naming ``name`` and the value otherwise."""
    f = check_float(value, name)
    if fraction and not 0 <= f <= 1:
        raise ValueError(f"{name}: expected a fraction in [0, 1], got {value!r}")
    if f < 0:
        raise ValueError(f"{name}: expected a number >= 0, got {value!r}")
    return f


def _check_keys(tol, name: str, form: str) -> None:
    """A dict, with the keys ``form`` requires and no other."""
    want = f"keys {', '.join(TOLERANCE_KEYS)} (optionally {', '.join(OPTIONAL_TOLERANCE_KEYS)})"
    if not isinstance(tol, dict):
        raise TypeError(f"{name}: expected a dict with {want}, got {tol!r}")
    unknown = [k for k in tol if k not in TOLERANCE_KEYS + OPTIONAL_TOLERANCE_KEYS]
    needed = TOLERANCE_KEYS if form == "case" else ("mode",) if form == "judged" else ()
    missing = [k for k in needed if k not in tol]
    if unknown or missing:
        raise ValueError(f"{name}: expected a dict with {want}, got {tol!r}")


def _check_mode_numbers(out: dict, name: str, form: str) -> None:
    """``atol`` / ``rtol`` as the mode asks: numbers for ``"compare"`` (not for a stated
    tolerance, whose numbers the command line may give); a case of another mode states
    none."""
    for k in ("atol", "rtol"):
        if out["mode"] == "compare" and out[k] is None and form != "stated":
            raise ValueError(f"{name}.{k}: expected a number for mode 'compare', got None")
        if out["mode"] != "compare" and out[k] is not None and form == "case":
            raise ValueError(
                f"{name}.{k}: mode {out['mode']!r} takes no atol/rtol (it publishes no "
                f"numbers), got {out[k]!r}"
            )


def check_tolerance(tol, name: str = "tolerance", *, form: str = "judged") -> dict:
    """``tol`` checked by the rules of the module docstring for the reader ``form`` (one of
    :data:`FORMS`), as a new dict ``{"atol", "rtol", "ratio", "mode"}`` of floats (``atol``
    / ``rtol`` ``None`` where not given, ``ratio`` 0 where not given), with ``"row_ulp"``
    when given. ``tol`` itself is not modified. ``TypeError`` / ``ValueError`` naming
    ``name.key``, the rule and the value."""
    check_choice(form, "form", FORMS)
    _check_keys(tol, name, form)
    mode = check_choice(tol.get("mode", "compare"), f"{name}.mode", TOLERANCE_MODES)
    out = {k: None if tol.get(k) is None else check_bound(tol[k], f"{name}.{k}")
           for k in ("atol", "rtol")}  # fmt: skip
    ratio = tol.get("ratio")
    if ratio is None and form != "case":  # a case states its ratio
        out["ratio"] = 0.0
    else:
        out["ratio"] = check_bound(ratio, f"{name}.ratio", fraction=True)
    out["mode"] = mode
    _check_mode_numbers(out, name, form)
    if tol.get("row_ulp") is not None:
        out["row_ulp"] = check_bound(tol["row_ulp"], f"{name}.row_ulp")
    return out


__all__ = ["FORMS", "OPTIONAL_TOLERANCE_KEYS", "TOLERANCE_KEYS", "TOLERANCE_MODES", "check_bound",
           "check_tolerance"]  # fmt: skip
