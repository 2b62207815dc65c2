"""Split-KV (``tiling.kv_splits``) in the DeepSeek sparse-attention golden, and the default rule.

Oracles: the independent float64 oracle of ``tests/oracles/dsa.py`` (budget), an algebraic
identity (one tile per split: the combine is the same fold as the unsplit merge, so the bits
must be equal), a removal identity (a split whose entries are all ``-1`` changes nothing), and
the rule's values worked out by hand from the SoC core counts.
"""

from __future__ import annotations

import numpy as np
import pytest
import tilesim.reference as R
from oracles.dsa import check_budget, oracle
from tilesim.shared.layouts.dsa_split_rule import (
    default_kv_splits,
    kv_tiles,
    merge_chain,
    split_tiling,
    tiles_per_split,
)
from tilesim.shared.layouts.splitkv import effective_kv_splits
from tilesim.shared.tiling import SaTileShapeConfig

SMALL = dict(nq=16, topk=256, block_size=16)
ONLINE_64 = SaTileShapeConfig.decode().replace(s_kv_tile=64)  # 4 tiles per full token


def _case(**kw):
    kw.setdefault("actual_seq", [700, 90, 3, 256])
    return R.dsa_make_case(s1=2, quant="fp8", topk_rule="causal", seed=7, **{**SMALL, **kw})


def run(case, cfg, **kw):
    return R.sparse_attention_antiquant(**case["inputs"], **{**case["params"], "tiling": cfg}, **kw)


def _bits(x):
    return np.ascontiguousarray(x).view(np.uint16)


def test_one_tile_per_split_is_the_unsplit_fold_bit_for_bit():
    # 4 splits of 1 tile: split states are the tiles' (o_t, l, m) and the combine applies the
    # online-merge formulas in tile order -- the unsplit loop, step for step
    case = _case(invalid_frac=0.1)
    whole = run(case, ONLINE_64)
    split = run(case, ONLINE_64.replace(kv_splits=4))
    assert np.array_equal(_bits(whole), _bits(split))


@pytest.mark.parametrize("k", [2, 3])
def test_splits_stay_within_the_oracle_budget_and_change_rounding(k):
    case = _case(invalid_frac=0.1)
    cfg = ONLINE_64.replace(kv_splits=k)
    got = run(case, cfg)
    o, m1, m2 = oracle(case)
    check_budget(got, o, m1, m2)
    # 2 tiles per split: the combine re-associates the fold, so some bits move
    assert not np.array_equal(_bits(got), _bits(run(case, ONLINE_64)))


def test_an_all_minus_one_split_is_a_no_op():
    case = _case(actual_seq=[300, 300, 300, 300])
    ti = case["inputs"]["topk_indices"].copy()
    # token 0 (cur_seq 256 -> tiles 0..3; 2 per split): split 1 = tiles 2, 3 all -1
    ti[0, 128:256] = -1
    cut = {**case, "inputs": {**case["inputs"], "topk_indices": ti}}
    cfg = ONLINE_64.replace(kv_splits=2)
    got = run(cut, cfg)
    # the same token with those entries simply not used: cur_seq cannot express it, so compare
    # against the unsplit golden of the masked row (split 0 alone = the unsplit fold of tiles 0-1)
    want = run(cut, ONLINE_64)
    rows = slice(0, 16)
    assert np.array_equal(_bits(got[rows]), _bits(want[rows]))
    assert np.isfinite(got.astype(np.float32)).all()


def test_a_token_shorter_than_one_split():
    # acts 3 and 90: cur_seq 2..90 < 128 keys = one split of 2 tiles; only split 0 exists
    case = _case(actual_seq=[3, 90, 3, 90])
    cfg = ONLINE_64.replace(kv_splits=2)
    assert np.array_equal(_bits(run(case, cfg)), _bits(run(case, ONLINE_64)))
    o, m1, m2 = oracle(case)
    check_budget(run(case, cfg), o, m1, m2)


def test_trace_records_name_their_split():
    case = _case(actual_seq=[256, 256, 256, 256])
    recs: list[dict] = []
    run(case, ONLINE_64.replace(kv_splits=2), trace=recs.append)
    first = [r for r in recs if r["lane"] == {"b": 0, "s": 0, "kv_head": 0, "group": 0}]
    assert [r["step"] for r in first] == [0, 1, 2, 3]
    assert [r["extra"]["kv_split"] for r in first] == [0, 0, 1, 1]
    assert [r["extra"]["branch"] for r in first] == ["first", "last", "first", "last"]
    plain: list[dict] = []
    run(case, ONLINE_64, trace=plain.append)
    assert all("kv_split" not in r["extra"] for r in plain)


def test_per_tile_mode_refuses_splits():
    case = _case()
    with pytest.raises(ValueError, match="tiling.kv_splits: expected 1 with softmax 'per_tile'"):
        run(case, SaTileShapeConfig.prefill().replace(kv_splits=2))


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_kv_splits_is_a_positive_int(bad):
    with pytest.raises((TypeError, ValueError), match="kv_splits"):
        SaTileShapeConfig(kv_splits=bad)


def test_merge_chain():
    # unsplit: one fold stage up to 8 tiles, else n - 1 loop merges; split: (ceil(n/k) - 1)
    # merges in a split + the fold over the splits
    assert [merge_chain(n, 1) for n in (1, 2, 4, 8, 9, 16)] == [0, 1, 1, 1, 8, 15]
    assert [merge_chain(4, k) for k in (1, 2, 3, 4)] == [1, 2, 2, 1]
    assert [merge_chain(16, k) for k in (1, 2, 4, 8, 16)] == [15, 8, 4, 2, 1]


def test_split_layout_counts():
    # 2048 keys in 512-key tiles = 4 tiles
    assert tiles_per_split(2048, 512, 1) == 4
    assert [tiles_per_split(2048, 512, k) for k in (2, 3, 4, 8)] == [2, 2, 1, 1]
    assert [effective_kv_splits(kv_tiles(2048, 512), k) for k in (2, 3, 4, 8)] == [2, 2, 4, 4]
    assert effective_kv_splits(kv_tiles(1000, 512), 4) == 2  # 2 tiles (the last one partial)


@pytest.mark.parametrize(
    "topk,tokens,soc,want",
    [
        # 512-key tiles; ranges allowed = min(cube cores // items, 8) (950: 28, 910B: 24)
        (2048, 1, "950", 1),  # 4 tiles: chains 1 (k 1), 2 (k 2, 3), 1 (k 4) -> 1
        (4096, 1, "950", 1),  # 8 tiles: the unsplit fold is one stage
        (4096, 14, "950", 1),
        (8192, 1, "950", 8),  # 16 tiles: 15 / 8 (k 2) / 4 (k 4) / 2 (k 8); at most 8 splits
        (8192, 7, "950", 4),  # 28 // 7 = 4
        (8192, 8, "950", 3),  # 28 // 8 = 3: tps 6, 3 splits, chain 6 (k 2: 8)
        (8192, 28, "950", 1),  # the items fill the cores
        (8192, 1, "910b", 8),
        (8192, 12, "910b", 2),  # 24 // 12 = 2
        (8192, 13, "910b", 1),
    ],
)
def test_default_rule(topk, tokens, soc, want):
    cfg = SaTileShapeConfig.decode()
    assert default_kv_splits(tokens=tokens, nq=128, topk=topk, tiling=cfg, soc=soc) == want
    assert split_tiling(cfg, tokens=tokens, nq=128, topk=topk, soc=soc).kv_splits == want


def test_default_rule_keeps_one_split_where_it_cannot_help():
    dec = SaTileShapeConfig.decode()
    # one tile per token, the prefill (per-tile) preset, two group tiles of 64 per token
    assert default_kv_splits(tokens=1, nq=128, topk=512, tiling=dec, soc="950") == 1
    pre = SaTileShapeConfig.prefill()
    assert default_kv_splits(tokens=1, nq=128, topk=4096, tiling=pre, soc="950") == 1
    g64 = dec.replace(g_tile=64)
    assert default_kv_splits(tokens=8, nq=128, topk=8192, tiling=g64, soc="950") == 1  # 16 items
    assert default_kv_splits(tokens=4, nq=128, topk=8192, tiling=g64, soc="950") == 3  # 8 items
    assert default_kv_splits(tokens=14, nq=128, topk=8192, tiling=g64, soc="950") == 1  # 28
