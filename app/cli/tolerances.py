"""The one tolerance resolver of the command line: the tolerance a golden states (its manifest's,
or a named case's), with the ``--atol/--rtol/--ratio`` overrides, in the form
:func:`tilesim.reference.judge` takes.

* mode ``"compare"``: ``atol`` and ``rtol`` are required (a bare ``.npy`` golden states none:
  the flags give them);
* mode ``"set"`` (ids): ``atol``/``rtol`` do not apply and are refused; the ratio (stated or
  ``--ratio``) is the share of rows allowed to differ;
* mode ``"ulp"`` (no published numbers): without ``--atol/--rtol`` the judge's rule for it,
  the default rule's golden-aware checks alone; ``--rule seeds`` needs the numbers; with both
  flags the output is judged as mode ``"compare"``.

An optional ``row_ulp`` budget of the stated tolerance is kept.
"""

from __future__ import annotations

from tilesim.cli import CliError
from tilesim.cli.manifest import check_tolerance_fields

#: the flags that override a stated tolerance
FLAGS = ("atol", "rtol", "ratio")


def flags_of(args) -> dict:
    """``{"atol", "rtol", "ratio"}`` given on the command line (absent ones left out)."""
    return {k: getattr(args, k) for k in FLAGS if getattr(args, k, None) is not None}


def resolve_tolerance(stated: dict | None, given: dict | None = None, *,
                      rule: str = "default") -> dict:  # fmt: skip
    """The tolerance to judge with (module docstring): ``stated`` (``None``: none stated),
    overridden by ``given`` (:func:`flags_of`); ``rule``: the judge's rule."""
    tol = check_tolerance_fields(stated, "manifest")
    given = given or {}
    mode = tol.get("mode", "compare")
    extra = {"row_ulp": float(tol["row_ulp"])} if tol.get("row_ulp") is not None else {}
    if mode == "set":
        if "atol" in given or "rtol" in given:
            raise CliError(
                "the golden's ids are judged by set equality; --atol/--rtol do not apply"
            )
        ratio = given.get("ratio", tol.get("ratio") or 0.0)
        return {"atol": 0.0, "rtol": 0.0, "ratio": float(ratio), "mode": "set"}
    vals = {k: given.get(k, tol.get(k)) for k in FLAGS}
    vals["ratio"] = 0.0 if vals["ratio"] is None else vals["ratio"]
    if mode == "ulp" and vals["atol"] is None and vals["rtol"] is None and rule != "seeds":
        return {"atol": None, "rtol": None, "ratio": float(vals["ratio"]), "mode": "ulp", **extra}
    for k in ("atol", "rtol"):
        if vals[k] is None:
            why = " (no published tolerance: mode ulp)" if mode == "ulp" else ""
            raise CliError(
                f"no {k}{why}: pass --{k}, or compare against a golden directory / "
                "manifest.json that states the case's tolerance"
            )
    return {**{k: float(v) for k, v in vals.items()}, "mode": "compare", **extra}
