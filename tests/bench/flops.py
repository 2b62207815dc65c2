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
    from tilesim.reference.msa_lightning_indexer import msa_indexer_flop

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
    reference both skip). Equal to :func:`flop_count` for the other ops."""
    if built.op_name != "msa_main_branch":
        return flop_count(built)
    from tilesim.reference.msa_main import msa_main_live_flop_count

    a = built.op_args
    n, hq, d = a["query"].shape
    return int(msa_main_live_flop_count(n, hq, d, a["block_mask"]))
