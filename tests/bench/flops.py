"""FLOP counts of a built case, from the op's record: its one counter ``cost``
(:attr:`tilesim.shared.registry.op_record.OpRecord.cost`, the sum of its trace records' ``flop``) on
the case's checked arguments: what the kernel computes, masked keys included, and the live work any
golden has to do.
"""

from __future__ import annotations

import numpy as np


def checked_cost(built, **kw) -> dict:
    """The record's ``cost`` of ``built``'s call: its contract's metadata check on the case's
    arguments (:func:`tilesim.cli.runner.check_meta_of`), then the record's integer value checks
    (the ones a wrapper runs by default; the counters read those integers), then ``cost``."""
    from tilesim.cli.runner import check_meta_of
    from tilesim.shared.registry.ops import record_of_call

    rec = record_of_call(built.op_name)
    args = rec.value_checks(check_meta_of(built.op_name, built.op_args), "ints")
    return rec.cost(args, **kw)


def flop_count(built) -> int:
    """The op's FLOPs as the kernel runs them (2 per multiply-add): the record's ``flop``."""
    return int(checked_cost(built)["flop"])


def live_flop_count(built) -> int:
    """FLOPs any golden has to do: the record's ``live_flop`` where it counts dead work apart
    (MSA main branch: future blocks and padding slots, which the seeds' golden and the
    reference both skip), the unpadded count of the lightning indexer (its 4 real index heads,
    not the kernel's 16 padded cube rows: ``cost(padded=False)``), else :func:`flop_count`."""
    cost = checked_cost(built)
    if "live_flop" in cost:
        return int(cost["live_flop"])
    if built.op_name in ("msa_indexer", "msa_indexer_scores"):
        return int(checked_cost(built, padded=False)["flop"])
    return int(cost["flop"])


# ---------------------------------------------------------------------------------------------
# the design floor's second term: operand elements a float64 golden has to widen at least once


def _moe_widen(built) -> int:
    a = built.op_args
    d = a["dims"]
    cs = np.asarray(a["expert_cumsum"]).astype(np.int64)
    live_experts = int((np.diff(cs) > 0).sum())
    return live_experts * 3 * d.hidden_size * d.intermediate_size + int(cs[-1]) * d.hidden_size


def _indexer_widen(built) -> int:
    a = built.op_args
    return int(np.asarray(a["idx_q"]).size + np.asarray(a["idx_k"]).size)


def _decode_widen(built) -> int:
    a = built.op_args
    bsz, hq, d = a["q"].shape
    hkv, by = a["k_blocks"].shape[1], a["k_blocks"].shape[3]
    nsel = np.asarray(a["block_ids"]).shape[1]
    return int(bsz * hq * d + 2 * bsz * hkv * nsel * by * d)  # q + the gathered K and V


def _main_widen(built) -> int:
    a = built.op_args
    return int(sum(np.asarray(a[k]).size for k in ("query", "key_blocks", "value_blocks")))


def _dsa_widen(built) -> int:
    from tilesim.shared.layouts.mla_cache import NOPE, ROPE

    return int(checked_cost(built)["attended"]) * (NOPE + ROPE)  # each attended row dequantised


_WIDEN = {
    "moe_grouped_gemm": _moe_widen,
    "msa_indexer": _indexer_widen,
    "msa_sparse_decode": _decode_widen,
    "msa_main_branch": _main_widen,
    "sparse_attention_antiquant": _dsa_widen,
}


def widen_count(built) -> int:
    """Operand elements the op widens to float64 at least once (MoE: the weights of the experts
    with tokens and the routed rows; MSA decode: q and the gathered K/V blocks; DeepSeek: the
    attended KV rows; indexer / main branch: the inputs)."""
    op = built.op_name
    key = "sparse_attention_antiquant" if op.startswith("sparse_attention_antiquant") else op
    return int(_WIDEN[key](built))
