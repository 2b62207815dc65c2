"""The one trace-record schema: what every op's ``trace=`` hook receives, once per tile.

A record is a plain dict with exactly these keys (:data:`TRACE_KEYS`):

===============  ==========================================================================
``op``           the public op name (``"moe_grouped_gemm"``, ``"msa_sparse_decode"``, ...)
``lane``         the loop indices outside the tile loop, outer loop first, as a dict of
                 ints (MoE ``{"expert": e}``; MSA decode ``{"batch": b, "kv_head": h}``;
                 MSA main branch ``{"head": h, "kv_head": g}``; indexer ``{}``; DeepSeek
                 ``{"b": b, "s": s, "kv_head": k, "group": g}``; the prologs ``{"stage": j}``,
                 one lane per pipeline stage, :func:`emit_stage`). One lane = one row of a
                 swim-lane plot.
``step``         the tile's index within its lane (0, 1, ...), in loop order
``key_range``    ``[start, stop)`` of the tile on the lane's key axis: key positions (MSA),
                 top-k columns (DeepSeek), rows of ``sorted_tokens`` (MoE), key rows
                 (indexer)
``keys_used``    how many of those keys take part (masked / ``-1`` / past-``seq_len`` keys
                 excluded; MoE: the chunk's rows)
``row_max``      FP32 row maxima ``m`` of the tile's scores (attention), else ``None``
``row_sum``      FP32 row sums ``l`` of ``exp(S - m)`` (attention), else ``None``
``flop``         the tile's matmul FLOPs (2 per multiply-add) as the kernel runs them
``extra``        a dict of op-specific values (e.g. the indexer's ``head_max`` / ``slot``)
===============  ==========================================================================

Records are emitted in loop order, from the calling thread, whatever the worker count.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

TRACE_KEYS = (
    "op",
    "lane",
    "step",
    "key_range",
    "keys_used",
    "row_max",
    "row_sum",
    "flop",
    "extra",
)

Trace = Callable[[dict], None] | None


def _int(v, what: str) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"trace record {what}: expected an int, got {type(v).__name__} {v!r}")
    return int(v)


def trace_record(
    op: str,
    lane: Mapping[str, int],
    step: int,
    key_range: tuple[int, int],
    *,
    keys_used: int | None = None,
    row_max=None,
    row_sum=None,
    flop: int = 0,
    **extra,
) -> dict:
    """Build one record (see the module docstring). ``keys_used`` defaults to the range's
    width; ``extra`` keyword arguments go into ``record["extra"]``."""
    start, stop = (_int(v, "key_range") for v in key_range)
    rec = {
        "op": str(op),
        "lane": {str(k): _int(v, f"lane[{k!r}]") for k, v in lane.items()},
        "step": _int(step, "step"),
        "key_range": (start, stop),
        "keys_used": stop - start if keys_used is None else _int(keys_used, "keys_used"),
        "row_max": row_max,
        "row_sum": row_sum,
        "flop": _int(flop, "flop"),
        "extra": dict(extra),
    }
    return rec


def emit(trace: Trace, op: str, lane: Mapping[str, int], step: int, key_range, **kw) -> None:
    """``trace(trace_record(...))`` when a hook is set; nothing (and no work) otherwise."""
    if trace is not None:
        trace(trace_record(op, lane, step, key_range, **kw))


def emit_stage(
    trace: Trace, op: str, stage: int, name: str, value, *, flop: int = 0, what: str = ""
) -> None:
    """One pipeline stage of an op over all its ``T`` tokens (the prologs), when a hook is set:
    lane ``{"stage": stage}`` (the stage's index in the op's pipeline), step 0, ``key_range``
    ``(0, T)``, ``flop`` the stage's matmul FLOPs (0 for an element-wise stage); ``extra``:
    ``stage`` (``name``), ``what`` (the stage in words), the ``dtype`` and ``shape`` of
    ``value`` (the stage's result, tokens first) and ``token_amax``: FP32 ``[T]`` max ``|v|``
    over each token's row of ``value`` (NaN where the row holds a NaN). Reads ``value`` only
    when a hook is set."""
    if trace is None:
        return
    v = np.asarray(value)
    rows = v.reshape(v.shape[0], -1).astype(np.float32)
    amax = np.abs(rows).max(axis=1) if rows.shape[1] else np.zeros(rows.shape[0], np.float32)
    trace(trace_record(op, {"stage": stage}, 0, (0, v.shape[0]), flop=flop, stage=name,
                       what=what, dtype=str(v.dtype), shape=list(v.shape),
                       token_amax=amax))  # fmt: skip


def check_record(rec) -> dict:
    """``ValueError`` / ``TypeError`` unless ``rec`` follows the schema; returns ``rec``."""
    if not isinstance(rec, dict):
        raise TypeError(f"trace record: expected a dict, got {type(rec).__name__}")
    keys = tuple(rec)
    if set(keys) != set(TRACE_KEYS):
        missing = sorted(set(TRACE_KEYS) - set(keys))
        unknown = sorted(set(keys) - set(TRACE_KEYS))
        raise ValueError(
            f"trace record: expected keys {TRACE_KEYS}, got missing {missing}, unknown {unknown}"
        )
    if not isinstance(rec["op"], str):
        raise TypeError(f"trace record op: expected a str, got {rec['op']!r}")
    if not isinstance(rec["lane"], dict):
        raise TypeError(f"trace record lane: expected a dict, got {type(rec['lane']).__name__}")
    for k, v in rec["lane"].items():
        _int(v, f"lane[{k!r}]")
    _int(rec["step"], "step")
    start, stop = (_int(v, "key_range") for v in rec["key_range"])
    if stop < start:
        raise ValueError(f"trace record key_range: expected start <= stop, got {(start, stop)}")
    _int(rec["keys_used"], "keys_used")
    _int(rec["flop"], "flop")
    if not isinstance(rec["extra"], dict):
        raise TypeError(f"trace record extra: expected a dict, got {type(rec['extra']).__name__}")
    return rec


def lane_id(rec: dict) -> tuple[tuple[str, int], ...]:
    """A hashable id of the record's lane (for grouping records into swim lanes)."""
    return tuple(rec["lane"].items())


def lane_label(rec: dict) -> str:
    """``"b0 s1 kv_head0 group0"``-style text of the record's lane (``"-"`` when empty)."""
    return " ".join(f"{k}{v}" for k, v in rec["lane"].items()) or "-"


__all__ = [
    "TRACE_KEYS",
    "Trace",
    "check_record",
    "emit",
    "emit_stage",
    "lane_id",
    "lane_label",
    "trace_record",
]
