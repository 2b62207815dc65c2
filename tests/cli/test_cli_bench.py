"""The bench session's own pieces: FLOP formulas against the issues' published numbers, and
the seeds-style torch goldens agreeing with the references (so the timings compare like with
like)."""

from __future__ import annotations

import numpy as np
import pytest

from tilesim.bench import _check, flop_count, live_flop_count, torch_golden_for
from tilesim.cli.registry import get_case
from tilesim.cli.runner import build_case, run_reference


def test_moe_flop_count_matches_the_issue():
    from types import SimpleNamespace

    from tilesim.shared import MINIMAX_M27

    cs = np.concatenate([[0], np.cumsum([0, 1, 2, 4, 8, 16, 32, 0])]).astype(np.int32)
    args = {"dims": MINIMAX_M27.moe_dims(8), "expert_cumsum": cs}
    built = SimpleNamespace(op_name="moe_grouped_gemm", op_args=args)  # m27_case_001's shape
    # 63 tokens x (mm1 2*H*2I + mm2 2*I*H) = "about 1.8 GFLOP" (issue 3)
    assert flop_count(built) == 63 * (2 * 3072 * 3072 + 2 * 1536 * 3072)
    assert 1.7e9 < flop_count(built) < 1.9e9


def test_dsa_flop_count_matches_the_library_cost_model():
    from tilesim.reference.dsa import sparse_attention_cost

    built = build_case(get_case("sfa_bf16_b4_s2_seq64K_total_fp8_d"))
    a = built.op_args
    assert flop_count(built) == sparse_attention_cost(a["topk_indices"], a["kv_act_seqs"])["flop"]
    # cur_seq per token: [2048,2048],[2048,2048],[665,666],[14,15] (op-facts 5.9)
    attended = 4 * 2048 + 665 + 666 + 14 + 15
    assert flop_count(built) == 2 * 128 * attended * (576 + 512)


@pytest.mark.parametrize(
    "name, ids, n",
    [
        # the seeds' published block ids (op-facts 4.8)
        ("msa_main_aligned_1024", [6, 7, 4, 3, 1, 5, 2, 0], 1024),
        ("msa_main_unaligned_1500", [5, 3, 9, 8, 0, 10, 2, 1, 11, 7, 6, 4], 1500),
    ],
)
def test_msa_main_live_flop_count_from_the_block_ids(name, ids, n):
    """Live work = (query block, slot) pairs whose block is not in the future, each with the
    query block's real rows; padding slots and future blocks are dead."""
    built = build_case(get_case(name))
    rows = [min(128, n - qb * 128) for qb in range(-(-n // 128))]
    pairs_rows = sum(rows[qb] for qb in range(len(rows)) for kv in ids if kv <= qb)
    assert live_flop_count(built) == 2 * 64 * 2 * 128 * 128 * pairs_rows
    assert flop_count(built) == 2 * n * 64 * 16 * 128 * 2 * 128  # every slot, every row
    assert live_flop_count(built) < flop_count(built)
    other = build_case(get_case("sfa_bf16_b4_s2_seq64K_total_fp8_d"))
    assert live_flop_count(other) == flop_count(other)


@pytest.mark.torch
@pytest.mark.parametrize(
    "name",
    [
        "m3_case_smoke_edge",
        "sfa_bf16_b4_s2_seq64K_total_fp8_kv_split_d",
        "msa_indexer_nb17",
        "msa_decode_partial_nb17",
        "msa_main_unaligned_1",
    ],
)
def test_torch_goldens_agree_with_the_references(name):
    built = build_case(get_case(name))
    ref = run_reference(built)["out"]
    out = torch_golden_for(built)()
    verdict = _check(built, ref, out)
    assert verdict.startswith(("agrees", "same block set")), verdict
    assert np.asarray(ref).shape == tuple(out.shape)


@pytest.mark.torch
def test_torch_golden_disagreement_is_reported():
    built = build_case(get_case("m3_case_smoke_edge"))
    ref = run_reference(built)["out"]
    bad = torch_golden_for(built)()
    bad[0, 0] = 1e4
    assert _check(built, ref, bad).startswith("DISAGREES")
