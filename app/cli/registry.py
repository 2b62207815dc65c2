"""The named-case registry: the ``CASE_INFO`` tables of the families' case modules.

Each family's cases module (``tilesim.reference.cases.<family>`` for every family of
:data:`tilesim.shared.registry.case_schema.CASE_FAMILIES`, the families of the registry of ops
:mod:`tilesim.shared.registry.ops`) exports ``CASE_INFO: dict[str,
tilesim.shared.registry.case_schema.CaseInfo]`` — family, op, model, summary, seed, size, tolerance,
builder (``"module:function"``), kind, SoC marks, the seeds' status and notes. The registry is
their union, in family order; there is no second copy of the table. The builder's own case
name is the entry's name unless ``builder_params`` holds ``"case"`` (``None`` = an ad-hoc
builder call, e.g. a tilesim extra case built from parameters).
"""

from __future__ import annotations

import difflib
import importlib
from functools import lru_cache

from tilesim.cli import CliError
from tilesim.shared.registry.case_schema import CASE_FAMILIES, CaseInfo

FAMILIES = CASE_FAMILIES
#: where each family's ``CASE_INFO`` lives
CASE_MODULES = {f: f"tilesim.reference.cases.{f}" for f in FAMILIES}


def _family_table(family: str) -> dict[str, CaseInfo]:
    mod = importlib.import_module(CASE_MODULES[family])
    table = getattr(mod, "CASE_INFO", None)
    if not isinstance(table, dict):
        raise RuntimeError(f"{CASE_MODULES[family]} exports no CASE_INFO dict")
    return table


def _merge(tables: dict[str, dict[str, CaseInfo]]) -> dict[str, CaseInfo]:
    out: dict[str, CaseInfo] = {}
    for family, table in tables.items():
        for key, info in table.items():
            if not isinstance(info, CaseInfo):
                raise TypeError(
                    f"{CASE_MODULES[family]}.CASE_INFO[{key!r}]: expected a CaseInfo, "
                    f"got {type(info).__name__}"
                )
            if key != info.name or info.family != family:
                raise ValueError(
                    f"{CASE_MODULES[family]}.CASE_INFO[{key!r}]: expected name {key!r} and "
                    f"family {family!r}, got {info.name!r} / {info.family!r}"
                )
            if key in out:
                raise ValueError(f"duplicate case name {key!r} in {CASE_MODULES[family]}")
            out[key] = info
    return out


@lru_cache(maxsize=1)
def load_registry() -> dict[str, CaseInfo]:
    """All named cases (``{name: CaseInfo}``): in :data:`FAMILIES` order, table order."""
    return _merge({f: _family_table(f) for f in FAMILIES})


def list_cases(family: str | None = None) -> list[CaseInfo]:
    """The cases of one family (:data:`FAMILIES`; also a kind such as ``decode`` or
    ``decode_step``) or all of them."""
    reg = load_registry()
    if family is None:
        return list(reg.values())
    kinds = {c.kind for c in reg.values() if c.kind}
    if family not in FAMILIES and family not in kinds:
        choices = ", ".join(FAMILIES + tuple(sorted(kinds)))
        raise CliError(f"unknown family {family!r}; expected one of {choices}")
    return [c for c in reg.values() if family in (c.family, c.kind)]


def get_case(name: str) -> CaseInfo:
    """The case called ``name``; an unknown name raises :class:`CliError` with suggestions."""
    reg = load_registry()
    if name in reg:
        return reg[name]
    close = difflib.get_close_matches(name, list(reg), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise CliError(f"unknown case {name!r}{hint} (run `tilesim cases` for the list)")


def soc_text(info: CaseInfo) -> str:
    """The SoC marks as one upper-case word list (``"950,910B"``; ``"-"`` for none)."""
    return ",".join(s.upper() for s in info.soc) if info.soc else "-"


#: (short text, rule in words) of the tolerance modes without atol/rtol
_NUMBERLESS = {
    "set": (
        "set equality",
        "each row holds the golden's ids as a set, in any order, up to score ties (DeepSeek "
        "indexer: among the row's first min(topk, visible) entries, the ones the attention reads)",
    ),
    "ulp": (
        "ulp budget",
        "no published tolerance: the judge's golden-aware checks alone (relative L2 and cosine "
        "bounds of the output dtype, docs/numerics.md)",
    ),
}


def tolerance_text(tol: dict) -> str:
    """``"set equality"``, ``"ulp budget"`` or ``"atol/rtol/ratio"`` of a tolerance dict."""
    if tol["mode"] in _NUMBERLESS:
        return _NUMBERLESS[tol["mode"]][0]
    return f"{tol['atol']:g}/{tol['rtol']:g}/{tol['ratio']:g}"


def tolerance_rule(tol: dict) -> str:
    """The tolerance's rule in words."""
    if tol["mode"] in _NUMBERLESS:
        return _NUMBERLESS[tol["mode"]][1]
    if not tol["ratio"]:
        return "every element |a-g| <= atol + rtol*|g| (numpy assert_allclose)"
    return "at most round(ratio*numel) elements with |a-g| > atol + rtol*|g|, no NaN/inf"
