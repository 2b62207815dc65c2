"""The named-case registry: the ``CASE_INFO`` tables of the families' case modules.

Each family of the registry of ops (:func:`tilesim.shared.registry.ops.families`, also
:data:`tilesim.shared.registry.case_schema.CASE_FAMILIES`) has one case builder,
``<family>_make_case``, a public name of :mod:`tilesim.reference` imported there by name from
the family's cases module ``tilesim.reference.cases.<family>``; that module exports
``CASE_INFO: dict[str, tilesim.shared.registry.case_schema.CaseInfo]`` — family, op, model,
summary, seed, size, tolerance, builder (its ``"module:function"`` path, shown by
``tilesim cases -v`` and written into manifests; checked here to name the builder), kind, SoC
marks, the seeds' status and notes. The registry is their union, in family order; there is
no second copy of the table. The builder's own case name is the entry's name unless
``builder_params`` holds ``"case"`` (``None`` = an ad-hoc builder call, e.g. a tilesim extra
case built from parameters). Nothing is imported by name at run time: the builders are
objects of the imported :mod:`tilesim.reference`, each table the one beside its builder.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from functools import lru_cache
from types import ModuleType

import tilesim.reference as reference
from tilesim.cli import CliError
from tilesim.shared.registry import ops
from tilesim.shared.registry.case_schema import CASE_FAMILIES, CaseInfo

FAMILIES = CASE_FAMILIES


def family_builder(family: str) -> Callable[..., dict]:
    """``family``'s case builder: :mod:`tilesim.reference`'s ``<family>_make_case``
    (:func:`tilesim.shared.registry.ops.case_builder`)."""
    return getattr(reference, ops.case_builder(family)[1])


def case_module(family: str) -> ModuleType:
    """``family``'s cases module: the module defining its builder (and its ``CASE_INFO``)."""
    return inspect.getmodule(family_builder(family))


def builder_path(builder: Callable) -> str:
    """``"module:function"`` of a builder, as a :class:`CaseInfo` states it."""
    return f"{builder.__module__}:{builder.__name__}"


def _family_table(family: str) -> dict[str, CaseInfo]:
    mod = case_module(family)
    table = getattr(mod, "CASE_INFO", None)
    if not isinstance(table, dict):
        raise RuntimeError(f"{mod.__name__} exports no CASE_INFO dict")
    return table


def _merge(tables: dict[str, dict[str, CaseInfo]]) -> dict[str, CaseInfo]:
    out: dict[str, CaseInfo] = {}
    for family, table in tables.items():
        where, builder = f"{family} CASE_INFO", builder_path(family_builder(family))
        for key, info in table.items():
            if not isinstance(info, CaseInfo):
                raise TypeError(f"{where}[{key!r}]: expected a CaseInfo, got {type(info).__name__}")
            if key != info.name or info.family != family or info.builder != builder:
                raise ValueError(
                    f"{where}[{key!r}]: expected name {key!r}, family {family!r} and builder "
                    f"{builder!r}, got {info.name!r} / {info.family!r} / {info.builder!r}"
                )
            if key in out:
                raise ValueError(f"duplicate case name {key!r} in {where}")
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
