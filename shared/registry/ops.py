"""The registry of ops: each op's :class:`~tilesim.shared.registry.op_record.OpRecord`, in order.

:data:`CONTRACTS` is the one list of ops: each contract module ``tilesim.shared.<op>``,
imported by name; :data:`RECORDS` the ``RECORD`` of each (:data:`OP_MODULES` their names), and
:func:`contract` the module of one op by name (the CLI's metadata checks and tiling rules).
Every other list of ops is derived here: the case families (:func:`families`), the public
calls (:func:`calls`), the public names of :mod:`tilesim.reference` (:func:`reference_names`)
and :mod:`tilesim.device` (:func:`device_names`), the ops of five files (:func:`kernel_ops`),
the calls the judge reads one way (:func:`calls_judged_by`). The judge, the CLI, the case
registry, the structural test and the digests read them. Adding an op is one record plus its
five files (``docs/index.md``, "Adding an op").
"""

from __future__ import annotations

from types import ModuleType

from tilesim.shared import (
    dsa,
    dsa_attention_step,
    dsa_indexer,
    dsa_indexer_prolog,
    mla_prolog,
    moe,
    msa_decode,
    msa_indexer,
    msa_main,
)
from tilesim.shared.registry.op_record import Call, OpRecord

#: every op's contract module ``tilesim.shared.<op>``, imported by name, in the registry's
#: order (also the order of the case families)
CONTRACTS: tuple[ModuleType, ...] = (
    moe,
    msa_indexer,
    msa_decode,
    msa_main,
    dsa,
    dsa_indexer,
    dsa_indexer_prolog,
    mla_prolog,
    dsa_attention_step,
)

#: every op's record: each contract module's ``RECORD``, in :data:`CONTRACTS` order
RECORDS: tuple[OpRecord, ...] = tuple(m.RECORD for m in CONTRACTS)

#: the ops, in the registry's order: the names of their contract modules ``tilesim.shared.<op>``
OP_MODULES = tuple(r.name for r in RECORDS)


def records() -> tuple[OpRecord, ...]:
    """Every op's record, in :data:`OP_MODULES` order (:data:`RECORDS`)."""
    return RECORDS


def record(op: str) -> OpRecord:
    """The record of ``op`` (a name of :data:`OP_MODULES`)."""
    for rec in records():
        if rec.name == op:
            return rec
    raise ValueError(f"op: expected one of {OP_MODULES}, got {op!r}")


def contract(op: str) -> ModuleType:
    """The contract module of ``op`` (a name of :data:`OP_MODULES`): ``check_meta``,
    ``check_values``, ``host_plan``, ``cost`` and, for an op with a tiling, ``resolve_tiling``."""
    record(op)  # the one message of an unknown op
    return CONTRACTS[OP_MODULES.index(op)]


def families() -> tuple[str, ...]:
    """The case families, in registry order (one ``tilesim.reference.cases.<family>`` each)."""
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


def calls_judged_by(how: str) -> tuple[str, ...]:
    """The calls the judge reads ``how`` (:data:`tilesim.shared.registry.op_record.JUDGED_BY`)."""
    return tuple(c.name for c in calls() if c.judged_by == how)


def kernel_ops() -> tuple[str, ...]:
    """The ops of five files: a contract, a golden, a device wrapper and its kernel, a page."""
    return tuple(r.name for r in records() if r.kernel)


def case_builder(family: str) -> tuple[str, str]:
    """``(module, function)`` of ``family``'s case builder."""
    if family not in families():
        raise ValueError(f"family: expected one of {families()}, got {family!r}")
    return f"tilesim.reference.cases.{family}", f"{family}_make_case"


def reference_names() -> dict[str, str]:
    """The public op names of :mod:`tilesim.reference` (``{name: module}``): each op's calls
    and other names, then each family's case builder."""
    out: dict[str, str] = {}
    for r in records():
        out.update({c.name: c.module for c in r.calls})
        out.update(r.names)
    for family in families():
        module, builder = case_builder(family)
        out[builder] = module.removeprefix("tilesim.reference.")
    return out


def device_names() -> dict[str, str]:
    """The public kernel names of :mod:`tilesim.device` (``{name: module}``)."""
    return {c.name: r.name for r in records() for c in r.calls if c.device}


def judge_kinds() -> dict[str, tuple[str, tuple[str, ...] | None]]:
    """``{kind: (output kind, axis names)}``: the judge's ``kind`` of each call that names
    one (:attr:`~tilesim.shared.registry.op_record.Call.judge_kind`), from its first output."""
    out: dict = {}
    for c in calls():
        if c.judge_kind is not None and c.judge_kind not in out:
            out[c.judge_kind] = (c.outputs[0].kind, c.outputs[0].axes)
    return out


def judge_l2_units() -> dict[str, tuple[float, float]]:
    """``{kind: (tensor, row) multiples of u}``: the judge's calibrated relative-L2 bounds of
    the calls that name a judge kind and carry
    :attr:`~tilesim.shared.registry.op_record.Call.l2_units` (one multiple, for the tensor and for
    each row)."""
    out: dict = {}
    for c in calls():
        if c.judge_kind is not None and c.l2_units is not None:
            if out.setdefault(c.judge_kind, (c.l2_units,) * 2) != (c.l2_units,) * 2:
                raise RuntimeError(f"judge kind {c.judge_kind!r}: calls disagree on l2_units")
    return out


def golden_kinds() -> dict[str, str]:
    """``{call: judge kind}`` of the calls a named case's golden may be that name a kind."""
    return {c.name: c.judge_kind for c in calls() if c.golden and c.judge_kind is not None}


def optional_outputs() -> dict[str, tuple[str, ...]]:
    """``{call: output names}`` a device dump may leave out, for the calls that have any."""
    return {c.name: c.optional_outputs for c in calls() if c.optional_outputs}


__all__ = ["CONTRACTS", "OP_MODULES", "calls", "calls_judged_by", "case_builder", "contract",
           "device_names", "families", "golden_calls", "golden_kinds", "judge_kinds",
           "judge_l2_units", "kernel_ops", "optional_outputs", "record", "record_of_call",
           "records", "reference_names"]  # fmt: skip
