"""The named-case registry shipped with the package (``tilesim/cases.json``).

Each entry names a case of the seeds' test matrices: family, op, the builder that makes its
inputs (module, function, builder case name, extra parameters), seed, declared input/output
shapes and dtypes, tolerance (atol, rtol, ratio + the rule in words), SoC marks and the seeds'
status ("runs", "skip: ..."). The file is the single source the CLI and the bench session
read; ``tests/cli`` checks the declared shapes against the builders for the small cases.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

from tilesim.cli import CliError

FAMILIES = ("moe", "msa", "dsa")


@dataclass(frozen=True)
class CaseSpec:
    """One named case of ``cases.json`` (see the module docstring for the fields)."""

    name: str
    family: str
    op: str
    model: str
    builder: dict
    seed: int
    size: str
    inputs: dict
    output: dict
    summary: str
    tolerance: dict
    soc: tuple
    status: str
    kind: str = ""
    soc_note: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def atol(self) -> float:
        return float(self.tolerance["atol"])

    @property
    def rtol(self) -> float:
        return float(self.tolerance["rtol"])

    @property
    def ratio(self) -> float:
        return float(self.tolerance["ratio"])

    def soc_text(self) -> str:
        return ",".join(self.soc) if self.soc else "-"


_KNOWN = {f for f in CaseSpec.__dataclass_fields__ if f != "extra"}


def _parse(doc: dict) -> dict[str, CaseSpec]:
    out: dict[str, CaseSpec] = {}
    for raw in doc["cases"]:
        known = {k: v for k, v in raw.items() if k in _KNOWN}
        extra = {k: v for k, v in raw.items() if k not in _KNOWN}
        known["soc"] = tuple(known.get("soc", ()))
        spec = CaseSpec(**known, extra=extra)
        if spec.family not in FAMILIES:
            raise ValueError(f"cases.json: case {spec.name!r} has unknown family {spec.family!r}")
        if spec.name in out:
            raise ValueError(f"cases.json: duplicate case name {spec.name!r}")
        out[spec.name] = spec
    return out


@lru_cache(maxsize=1)
def load_registry() -> dict[str, CaseSpec]:
    """All named cases, in file order (``{name: CaseSpec}``)."""
    text = resources.files("tilesim").joinpath("cases.json").read_text(encoding="utf-8")
    return _parse(json.loads(text))


def list_cases(family: str | None = None) -> list[CaseSpec]:
    """The cases of one family (``moe``, ``msa``, ``dsa``; also an MSA kind such as
    ``decode``) or all of them."""
    reg = load_registry()
    if family is None:
        return list(reg.values())
    kinds = {c.kind for c in reg.values() if c.kind}
    if family not in FAMILIES and family not in kinds:
        choices = ", ".join(FAMILIES + tuple(sorted(kinds)))
        raise CliError(f"unknown family {family!r}; expected one of {choices}")
    return [c for c in reg.values() if family in (c.family, c.kind)]


def get_case(name: str) -> CaseSpec:
    """The case called ``name``; an unknown name raises :class:`CliError` with suggestions."""
    reg = load_registry()
    if name in reg:
        return reg[name]
    close = difflib.get_close_matches(name, list(reg), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise CliError(f"unknown case {name!r}{hint} (run `tilesim cases` for the list)")
