"""The MSA decode split layout and the default split rule (``tilesim.shared.msa_decode``)."""

from __future__ import annotations

import math

import pytest
from tilesim.shared.layouts.splitkv import effective_kv_splits, loop_merge_chain, split_ranges
from tilesim.shared.msa_decode import (
    SPLIT_MIN_CHUNKS,
    default_kv_splits,
    n_chunks,
    split_tiling,
)
from tilesim.shared.soc import get_soc
from tilesim.shared.tiling import MsaTiling


@pytest.mark.parametrize("chunks", range(1, 20))
@pytest.mark.parametrize("k", range(1, 9))
def test_ranges_cover_the_chunks_in_order(chunks, k):
    r = split_ranges(chunks, k)
    flat = [c for a, z in r for c in range(a, z)]
    assert flat == list(range(chunks))  # every chunk once, in order, no empty range
    per = math.ceil(chunks / k)
    assert all(z - a == per for a, z in r[:-1]) and 0 < r[-1][1] - r[-1][0] <= per
    assert len(r) <= k and effective_kv_splits(chunks, k) == len(r)
    # the longest dependent merge sequence, counted by walking the ranges
    assert loop_merge_chain(chunks, k) == (r[0][1] - r[0][0] - 1) + (len(r) - 1)


def test_chunk_count_keeps_the_tail():
    assert n_chunks(16, 512) == 4 and n_chunks(5, 512) == 2 and n_chunks(5, 128) == 5


def _brute_rule(batch, hkv, topk, ntile, soc):
    """The rule restated: no split below SPLIT_MIN_CHUNKS or when the pairs fill the cores;
    else the ranges of the smallest k with the shortest chain, by exhaustive search."""
    chunks = -(-topk * 128 // ntile)
    cores = get_soc(soc).aic_cores
    if batch * hkv >= cores or chunks < SPLIT_MIN_CHUNKS:
        return 1
    best = None
    for k in range(1, min(chunks, cores // (batch * hkv)) + 1):
        per = -(-chunks // k)
        ranges = -(-chunks // per)
        chain = per - 1 + ranges - 1
        if best is None or chain < best[0]:
            best = (chain, ranges)
    return best[1]


@pytest.mark.parametrize("soc", ["910b", "950"])
def test_default_rule(soc):
    for batch in (1, 2, 3, 4, 8):
        for topk in (2, 5, 16, 32, 64, 128):
            got = default_kv_splits(batch=batch, hkv=4, topk=topk, ntile=512, soc=soc)
            assert got == _brute_rule(batch, 4, topk, 512, soc), (batch, topk)
    # M3 decode (topk 16, NTILE 512: 4 chunks) is never split (measured: no split pays)
    assert {
        default_kv_splits(batch=b, hkv=4, topk=16, ntile=512, soc=soc) for b in range(1, 65)
    } == {1}
    # a long pair at B 1: 16 chunks -> 4 ranges of 4 (chain 6 instead of 15)
    assert default_kv_splits(batch=1, hkv=4, topk=64, ntile=512, soc=soc) == 4


def test_split_tiling_keeps_the_other_fields():
    t = MsaTiling(ntile=256, dtype="bf16")
    s = split_tiling(t, batch=1, hkv=4, topk=32, soc="910b")  # 16 chunks of 256
    assert s.kv_splits == 4 and s.replace(kv_splits=1) == t
    with pytest.raises(TypeError, match="tiling"):
        split_tiling(256, batch=1, hkv=4, topk=32, soc="910b")
    with pytest.raises(ValueError, match="batch"):
        default_kv_splits(batch=0, hkv=4, topk=16, ntile=512, soc="910b")
