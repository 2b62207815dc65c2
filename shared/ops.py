"""The registry of ops: each op's :class:`~tilesim.shared.op_record.OpRecord`, in order.

:data:`OP_MODULES` is the one list of ops: the contract modules ``tilesim.shared.<op>``, each
exporting its record as ``RECORD``. Every other list of ops is derived here: the case
families (:func:`families`), the public calls (:func:`calls`), the public names of
:mod:`tilesim.reference` (:func:`reference_names`) and :mod:`tilesim.device`
(:func:`device_names`), the ops of five files (:func:`kernel_ops`), the calls of a judging plan
(:func:`plan_calls`). The judge, the CLI, the case registry, the structural test and the
digests read them. Adding an op is one record plus its five files (``docs/index.md``, "Adding
an op").

The contract modules are imported on the first call of a function here, not at import.
"""

from __future__ import annotations

import importlib
from functools import lru_cache

from tilesim.shared.op_record import Call, OpRecord

#: the ops, in the registry's order (also the order of the case families)
OP_MODULES = (
    "moe",
    "msa_indexer",
    "msa_decode",
    "msa_main",
    "dsa",
    "dsa_indexer",
    "dsa_indexer_prolog",
    "mla_prolog",
    "dsa_attention_step",
)


def _record(op: str) -> OpRecord:
    mod = importlib.import_module(f"tilesim.shared.{op}")
    rec = getattr(mod, "RECORD", None)
    if not isinstance(rec, OpRecord) or rec.name != op:
        raise RuntimeError(f"tilesim.shared.{op} exports no OpRecord RECORD named {op!r}")
    return rec


@lru_cache(maxsize=1)
def records() -> tuple[OpRecord, ...]:
    """Every op's record, in :data:`OP_MODULES` order."""
    return tuple(_record(op) for op in OP_MODULES)


def record(op: str) -> OpRecord:
    """The record of ``op`` (a name of :data:`OP_MODULES`)."""
    for rec in records():
        if rec.name == op:
            return rec
    raise ValueError(f"op: expected one of {OP_MODULES}, got {op!r}")


def families() -> tuple[str, ...]:
    """The case families, in registry order (one ``tilesim.reference.<family>_cases`` each)."""
    return tuple(dict.fromkeys(r.family for r in records()))


def calls() -> tuple[Call, ...]:
    """Every public call of every op, in registry order."""
    return tuple(c for r in records() for c in r.calls)


def record_of_call(name: str) -> OpRecord:
    """The record of the op whose public call is ``name``."""
    for r in records():
        if name in r.call_names:
            return r
    raise ValueError(f"call: expected one of {tuple(c.name for c in calls())}, got {name!r}")


def golden_calls(family: str | None = None) -> tuple[str, ...]:
    """The calls a named case's golden may be (of ``family``, or of every family)."""
    return tuple(c.name for r in records() if family in (None, r.family)
                 for c in r.calls if c.golden)  # fmt: skip


def plan_calls(plan: str) -> tuple[str, ...]:
    """The calls judged by ``plan`` (:data:`tilesim.shared.op_record.PLANS`)."""
    return tuple(c.name for c in calls() if c.plan == plan)


def kernel_ops() -> tuple[str, ...]:
    """The ops of five files: a contract, a golden, a device wrapper and its kernel, a page."""
    return tuple(r.name for r in records() if r.kernel)


def case_builder(family: str) -> tuple[str, str]:
    """``(module, function)`` of ``family``'s case builder."""
    if family not in families():
        raise ValueError(f"family: expected one of {families()}, got {family!r}")
    return f"tilesim.reference.{family}_cases", f"{family}_make_case"


def reference_names() -> dict[str, str]:
    """The public op names of :mod:`tilesim.reference` (``{name: module}``): each op's calls
    and other names, then each family's case builder."""
    out: dict[str, str] = {}
    for r in records():
        out.update({c.name: c.module for c in r.calls})
        out.update(r.names)
    for family in families():
        module, builder = case_builder(family)
        out[builder] = module.rsplit(".", 1)[-1]
    return out


def device_names() -> dict[str, str]:
    """The public kernel names of :mod:`tilesim.device` (``{name: module}``)."""
    return {c.name: r.name for r in records() for c in r.calls if c.device}


def judge_layouts() -> dict[str, tuple[str, tuple[str, ...] | None]]:
    """``{layout: (output kind, axis names)}``: the judge's ``kind`` of each call that names
    one (:attr:`~tilesim.shared.op_record.Call.layout`), from its first output."""
    out: dict = {}
    for c in calls():
        if c.layout is not None and c.layout not in out:
            out[c.layout] = (c.outputs[0].kind, c.outputs[0].axes)
    return out


def judge_l2_units() -> dict[str, tuple[float, float]]:
    """``{layout: (tensor, row) multiples of u}``: the judge's calibrated relative-L2 bounds of
    the calls that name a layout and carry :attr:`~tilesim.shared.op_record.Call.l2_units`
    (one multiple, for the tensor and for each row)."""
    out: dict = {}
    for c in calls():
        if c.layout is not None and c.l2_units is not None:
            if out.setdefault(c.layout, (c.l2_units,) * 2) != (c.l2_units,) * 2:
                raise RuntimeError(f"layout {c.layout!r}: calls disagree on l2_units")
    return out


def golden_layouts() -> dict[str, str]:
    """``{call: layout}`` of the calls a named case's golden may be that name a layout."""
    return {c.name: c.layout for c in calls() if c.golden and c.layout is not None}


def optional_outputs() -> dict[str, tuple[str, ...]]:
    """``{call: output names}`` a device dump may leave out, for the calls that have any."""
    return {c.name: c.optional_outputs for c in calls() if c.optional_outputs}


__all__ = ["OP_MODULES", "calls", "case_builder", "device_names", "families", "golden_calls",
           "golden_layouts", "judge_l2_units", "judge_layouts", "optional_outputs",
           "kernel_ops", "plan_calls", "record", "record_of_call", "records",
           "reference_names"]  # fmt: skip
