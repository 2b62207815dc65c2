"""The one case-dict schema every case builder returns, and the named-case record.

A case dict (:func:`make_case`) has exactly the keys :data:`CASE_KEYS`::

    {"name":      the named case, or None for an ad-hoc one,
     "op":        the public reference op that computes the golden,
     "inputs":    {argument name: array (or a tuple of arrays, MoE's weights)},
     "params":    {argument name: value} — the op's other keyword arguments,
     "tolerance": {"atol", "rtol", "ratio", "mode"} and an optional "row_ulp" (:func:`tolerance`),
     "meta":      {what the case was built from: seed, builder parameters, ...}}

so that ``getattr(tilesim.reference, case["op"])(**case["inputs"], **case["params"])`` is the
golden. ``tolerance["mode"]`` says how a device result is judged against it:

* ``"compare"`` — :func:`tilesim.reference.compare` (the Ascend-house rule): at most
  ``round(ratio * numel)`` elements with ``|a - g| > atol + rtol * |g|``, no NaN/inf.
  ``ratio = 0`` means every element must pass (numpy ``assert_allclose``).
* ``"set"`` — index outputs: each row must hold the same set of ids as the golden's.
* ``"ulp"`` — no published tolerance exists (ad-hoc cases): the judge's golden-aware checks
  alone (relative L2 and cosine bounds derived from the output dtype, ``docs/numerics.md``).
  ``atol``/``rtol`` are ``None``.

``"row_ulp"`` (any mode, optional) adds a row-ULP budget: max ``|a - g|`` in ULPs of the
golden's dtype at each row's largest ``|golden|``. These are exactly the modes and keys
:func:`tilesim.reference.judge` takes (:data:`TOLERANCE_MODES`, :data:`TOLERANCE_KEYS`); the
one tolerance validator, :mod:`tilesim.shared.registry.tolerance`, checks them for both.

:class:`CaseInfo` describes one named case for the registry (``tilesim cases``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tilesim.shared.registry.ops import families
from tilesim.shared.registry.tolerance import (
    OPTIONAL_TOLERANCE_KEYS,
    TOLERANCE_KEYS,
    TOLERANCE_MODES,
    check_tolerance,
)
from tilesim.shared.validate import check_choice

CASE_KEYS = ("name", "op", "inputs", "params", "tolerance", "meta")
CASE_SIZES = ("small", "medium", "large")
#: the case families (one ``tilesim.reference.cases.<family>`` module each), in the order of
#: the registry of ops (:func:`tilesim.shared.registry.ops.families`)
CASE_FAMILIES = families()


def tolerance(atol=None, rtol=None, ratio: float = 0.0, mode: str = "compare",
              row_ulp=None) -> dict:  # fmt: skip
    """A checked ``{"atol", "rtol", "ratio", "mode"}`` dict of floats, with ``"row_ulp"`` when
    given (see the module docstring; the rules and messages of
    :func:`tilesim.shared.registry.tolerance.check_tolerance`, ``form="case"``)."""
    given = {"atol": atol, "rtol": rtol, "ratio": ratio, "mode": mode}
    if row_ulp is not None:
        given["row_ulp"] = row_ulp
    return check_tolerance(given, form="case")


def make_case(*, name, op: str, inputs: dict, params: dict, tolerance: dict, meta: dict) -> dict:
    """A case dict with the schema's keys, checked for their types."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name: expected a str or None, got {type(name).__name__}")
    if not isinstance(op, str):
        raise TypeError(f"op: expected a str, got {type(op).__name__}")
    for key, v in (("inputs", inputs), ("params", params), ("meta", meta)):
        if not isinstance(v, dict):
            raise TypeError(f"{key}: expected a dict, got {type(v).__name__}")
    check_tolerance(tolerance, form="case")  # one :func:`tolerance` could have made
    return {
        "name": name,
        "op": op,
        "inputs": inputs,
        "params": params,
        "tolerance": tolerance,
        "meta": meta,
    }


@dataclass(frozen=True)
class CaseInfo:
    """One named case of a family's table, as the registry lists it.

    ``family``: one of :data:`CASE_FAMILIES`; ``kind``: a sub-family (MSA: ``"indexer"``,
    ``"decode"``, ``"main_branch"``; DeepSeek indexer: ``"indexer"``, ``"decode_step"``; else
    ``""``); ``size``: ``"small"`` (seconds),
    ``"medium"``, ``"large"`` (minutes or GiB); ``soc``: the seeds' SoC marks (``()``: none);
    ``status``: what the seeds' test does with it (``"runs"``, ``"skip: ..."``, ``"tilesim
    extra"``); ``builder``: the builder's import path (``"module:function"``);
    ``builder_params``: extra builder arguments; ``notes``: free text by topic.
    """

    name: str
    family: str
    op: str
    model: str
    summary: str
    seed: int
    size: str
    tolerance: dict
    builder: str
    kind: str = ""
    soc: tuple[str, ...] = ()
    status: str = "runs"
    builder_params: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_choice(self.size, f"CaseInfo({self.name!r}).size", CASE_SIZES)
        check_choice(self.family, f"CaseInfo({self.name!r}).family", CASE_FAMILIES)


__all__ = [
    "CASE_FAMILIES",
    "CASE_KEYS",
    "CASE_SIZES",
    "OPTIONAL_TOLERANCE_KEYS",
    "TOLERANCE_KEYS",
    "TOLERANCE_MODES",
    "CaseInfo",
    "make_case",
    "tolerance",
]
