"""FLOP counts of a built case, from the op modules' own counters (the ones their trace
records' ``flop`` fields add up to): what the kernel computes, masked keys included, and the
live work any golden has to do.
"""

from __future__ import annotations

import numpy as np


def _moe(a: dict) -> int:
    from tilesim.reference.moe import moe_flop_count

    return moe_flop_count(a["expert_cumsum"], a["dims"])


def _indexer(a: dict) -> int:
    from tilesim.reference.msa_indexer import msa_indexer_flop

    return msa_indexer_flop(int(a["nb"]))  # as the cube runs it: 16 (padded) rows per block


def _decode(a: dict) -> int:
    from tilesim.reference.msa_decode import msa_sparse_decode_flop

    bsz, hq, d = a["q"].shape
    keys = np.asarray(a["block_ids"]).shape[1] * a["k_blocks"].shape[3]
    return msa_sparse_decode_flop(bsz, hq, keys, d)


def _main(a: dict) -> int:
    from tilesim.reference.msa_main import msa_main_flop_count

    n, hq, d = a["query"].shape
    return msa_main_flop_count(n, hq, d, a["key_blocks"].shape[0])


def _dsa(a: dict) -> int:
    from tilesim.reference.dsa import sparse_attention_cost

    nq, topk = int(a["nq"]), int(a["topk"])
    return sparse_attention_cost(a["topk_indices"], a["kv_act_seqs"], nq=nq, topk=topk)["flop"]


_COUNTERS = {
    "moe_grouped_gemm": _moe,
    "msa_indexer": _indexer,
    "msa_sparse_decode": _decode,
    "msa_main_branch": _main,
    "sparse_attention_antiquant": _dsa,
}


def flop_count(built) -> int:
    """The op's FLOPs as the kernel runs them (2 per multiply-add)."""
    op = built.op_name
    key = "sparse_attention_antiquant" if op.startswith("sparse_attention_antiquant") else op
    if key not in _COUNTERS:
        raise ValueError(f"no FLOP counter for {op}")
    return int(_COUNTERS[key](built.op_args))


def live_flop_count(built) -> int:
    """FLOPs any golden has to do: the kernel's count minus the keys no query row of a block
    can see (MSA main branch: future blocks and padding slots, which the seeds' golden and the
    reference both skip; the lightning indexer: its 4 real index heads, not the kernel's 16
    padded cube rows). Equal to :func:`flop_count` for the other ops."""
    if built.op_name in ("msa_indexer", "msa_indexer_scores"):
        from tilesim.reference.msa_indexer import msa_indexer_flop

        return msa_indexer_flop(int(built.op_args["nb"]), padded=False)
    if built.op_name != "msa_main_branch":
        return flop_count(built)
    from tilesim.reference.msa_main import msa_main_live_flop_count

    a = built.op_args
    n, hq, d = a["query"].shape
    return int(msa_main_live_flop_count(n, hq, d, a["block_mask"]))


# ---------------------------------------------------------------------------------------------
# the design floor's second term: operand elements a float64 golden has to widen at least once


def _moe_widen(a: dict) -> int:
    d = a["dims"]
    cs = np.asarray(a["expert_cumsum"]).astype(np.int64)
    live_experts = int((np.diff(cs) > 0).sum())
    return live_experts * 3 * d.hidden_size * d.intermediate_size + int(cs[-1]) * d.hidden_size


def _indexer_widen(a: dict) -> int:
    return int(np.asarray(a["idx_q"]).size + np.asarray(a["idx_k"]).size)


def _decode_widen(a: dict) -> int:
    bsz, hq, d = a["q"].shape
    hkv, by = a["k_blocks"].shape[1], a["k_blocks"].shape[3]
    nsel = np.asarray(a["block_ids"]).shape[1]
    return int(bsz * hq * d + 2 * bsz * hkv * nsel * by * d)  # q + the gathered K and V


def _main_widen(a: dict) -> int:
    return int(sum(np.asarray(a[k]).size for k in ("query", "key_blocks", "value_blocks")))


def _dsa_widen(a: dict) -> int:
    from tilesim.reference.dsa import sparse_attention_cost
    from tilesim.shared.mla_cache import NOPE, ROPE

    nq, topk = int(a["nq"]), int(a["topk"])
    cost = sparse_attention_cost(a["topk_indices"], a["kv_act_seqs"], nq=nq, topk=topk)
    return int(cost["attended"]) * (NOPE + ROPE)  # each attended KV row dequantised once


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
    return int(_WIDEN[key](built.op_args))
