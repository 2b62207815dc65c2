"""The one ranking rule (``tilesim.shared.ranking``) against independent sorts.

The oracle is Python's ``sorted`` on ``(is NaN, -score, position)`` over Python numbers (ints
stay ints, floats are Python floats): written without NumPy's sort, so it checks both paths of
the helper (the vectorised stable sort when every position is visible, the per-row partition
+ sort with ``visible``). Exhaustive over every row of up to five scores from levels with
ties, ``-0.0`` next to ``0.0``, ``+-inf`` and NaN, every ``k`` up to ``n + 1``; random larger
rows with many ties and NaNs; integer, float and ml_dtypes inputs; the NaN policy (last, lower
position first); the drop-in equality with the DeepSeek indexer's ``select_topk`` on its valid
input; the callers' use of the rule.
"""

from __future__ import annotations

import itertools
import math

import ml_dtypes
import numpy as np
import pytest
from oracles.dsa_indexer import oracle_topk
from oracles.msa import oracle_select
from tilesim.shared.ranking import NO_ID, rank, top_k

INF = math.inf
LEVELS = (-INF, -1.5, -0.0, 0.0, 2.0, INF, math.nan)


def _sorted_top(row, visible: int, k: int) -> list[int]:
    """Independent: Python ``sorted`` on ``(is NaN, -score, position)``, then ``-1`` padding."""
    vals = [v.item() if hasattr(v, "item") else v for v in row[:visible]]

    def key(p):
        v = vals[p]
        nan = isinstance(v, float) and math.isnan(v)
        return (nan, 0 if nan else -v, p)

    best = sorted(range(visible), key=key)[: min(k, visible)]
    return best + [-1] * (k - len(best))


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5])
def test_every_row_over_seven_levels_every_k_both_paths(n):
    combos = list(itertools.product(LEVELS, repeat=n))
    rows = np.array(combos, dtype=np.float32).reshape(len(combos), n)
    for k in range(n + 2):  # k = n + 1: more slots than positions
        full = top_k(rows, k)
        assert full.dtype == np.int64 and full.shape == (rows.shape[0], k)
        vis = np.arange(rows.shape[0]) % (n + 1)  # every visible length, row by row
        part = top_k(rows, k, visible=vis)
        for i, row in enumerate(rows):
            assert full[i].tolist() == _sorted_top(row, n, k), (row, k)
            assert part[i].tolist() == _sorted_top(row, int(vis[i]), k), (row, vis[i], k)


def test_the_oracles_sorts_agree_with_the_helper():
    """The test oracles' own sorts (DeepSeek indexer, MSA indexer) against the helper."""
    rng = np.random.default_rng(7)
    s = rng.integers(-3, 4, size=(40, 37)).astype(np.float32)  # many ties
    s[::5, 3] = -np.inf
    vis = rng.integers(0, 38, size=40)
    got = top_k(s, 9, visible=vis)
    for i in range(40):
        assert got[i].tolist() == oracle_topk(s[i], int(vis[i]), 9)
    nb = 23  # the MSA selection: the 15 best of blocks 0 .. nb-2, then the local block
    scores = np.repeat(rng.integers(0, 5, size=(4, nb)).astype(np.float32), 128, axis=1)
    block = scores[:, ::128].max(axis=0)
    want = oracle_select(scores, nb)[0]
    assert top_k(block[: nb - 1], 15).tolist() + [nb - 1] == want


@pytest.mark.parametrize("shape", [(1, 3000), (7, 129), (2, 3, 50)])
@pytest.mark.parametrize("levels", [2, 5, 1000])
def test_random_rows_with_ties_partition_path(shape, levels):
    rng = np.random.default_rng(levels)
    s = rng.integers(0, levels, size=shape).astype(np.float32)
    s[s == 1] = np.nan  # NaN among the candidates, often inside the top k
    vis = rng.integers(0, shape[-1] + 1, size=shape[:-1])
    for k in (1, 8, shape[-1] // 2, shape[-1]):
        got = top_k(s, k, visible=vis)
        full = top_k(s, k)
        for row in np.ndindex(*shape[:-1]):
            assert got[row].tolist() == _sorted_top(s[row], int(vis[row]), k)
            assert full[row].tolist() == _sorted_top(s[row], shape[-1], k)


def test_rank_is_top_k_of_every_position_and_a_permutation():
    rng = np.random.default_rng(3)
    s = rng.integers(-2, 3, size=(5, 31)).astype(np.float64)
    r = rank(s)
    assert r.tolist() == top_k(s, 31).tolist()
    assert (np.sort(r, axis=1) == np.arange(31)).all()
    assert rank(np.array([0.0, -0.0, 0.0])).tolist() == [0, 1, 2]  # -0.0 == 0.0: a tie
    assert rank(np.array([], dtype=np.float32)).tolist() == []


@pytest.mark.parametrize(
    "dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint64, np.float16, np.float64]
)
def test_integer_and_float_dtypes(dtype):
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else np.finfo(dtype)
    vals = [info.min, info.max, 0, 1, 1, info.max, info.min, 0]
    s = np.array(vals, dtype=dtype)
    for k in range(10):
        assert top_k(s, k).tolist() == _sorted_top(s, 8, k)
        assert top_k(s, k, visible=5).tolist() == _sorted_top(s, 5, k)


def test_integers_are_compared_exactly_not_through_float64():
    big = 2**62
    s = np.array([big, big + 1, big + 1, big - 1], dtype=np.int64)  # equal as float64
    assert rank(s).tolist() == [1, 2, 0, 3]
    assert top_k(s, 2, visible=4).tolist() == [1, 2]
    u = np.array([2**64 - 2, 2**64 - 1], dtype=np.uint64)
    assert rank(u).tolist() == [1, 0]


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn])
def test_ml_dtypes_floats(dtype):
    s = np.array([1.0, -2.0, 1.0, 0.0, -0.0, 448.0], dtype=np.float32).astype(dtype)
    assert rank(s).tolist() == [5, 0, 2, 3, 4, 1]
    nan_first = np.array([np.nan, -1.0, 0.0], dtype=np.float32).astype(dtype)
    assert rank(nan_first).tolist() == [2, 1, 0]


def test_nan_ranks_last_lower_position_first():
    s = np.array([np.nan, -np.inf, 1.0, -np.nan, 0.0, np.nan], dtype=np.float32)
    assert rank(s).tolist() == [2, 4, 1, 0, 3, 5]
    assert top_k(s, 4).tolist() == [2, 4, 1, 0]
    assert top_k(s, 4, visible=6).tolist() == [2, 4, 1, 0]  # the partition path
    assert top_k(s, 3, visible=4).tolist() == [2, 1, 0]
    rows = np.full((2, 5), np.nan, dtype=np.float64)
    assert top_k(rows, 2, visible=np.array([5, 1])).tolist() == [[0, 1], [0, -1]]


def test_bad_arguments():
    s = np.arange(4.0)
    with pytest.raises(ValueError, match=r"^k: expected an int in \[0, "):
        top_k(s, -1)
    for k in (True, 2.0, None):  # not an int: a type error (the argument policy)
        with pytest.raises(TypeError, match=r"^k: expected an int"):
            top_k(s, k)
    for bad in (np.array([True, False]), np.array([1j]), np.array([object()])):
        with pytest.raises(TypeError, match=r"^x: expected integer or float scores"):
            top_k(bad, 1, name="x")
    with pytest.raises(ValueError, match="at least one axis"):
        top_k(np.float32(1.0), 1)
    with pytest.raises(ValueError, match=r"^visible\[1\]: expected a length in \[0, 4\], got 5"):
        top_k(np.zeros((2, 4)), 1, visible=np.array([4, 5]))
    with pytest.raises(ValueError, match=r"^visible: expected integers of shape \[2\]"):
        top_k(np.zeros((2, 4)), 1, visible=np.array([4]))
    with pytest.raises(TypeError, match=r"^visible: expected integers"):
        top_k(np.zeros((2, 4)), 1, visible=np.array([1.0, 2.0]))
    assert NO_ID == -1


def test_drop_in_for_the_deepseek_indexer_select_topk():
    """On its valid input (no NaN among the visible scores: ``select_topk`` refuses that, a
    check of its op), ``select_topk(s, vis, k)`` is ``top_k(s, k, visible=vis)`` as INT32."""
    from tilesim.shared.dsa_indexer import select_topk

    rng = np.random.default_rng(11)
    s = rng.integers(-4, 4, size=(30, 300)).astype(np.float32)
    s[::4] = -np.inf
    vis = rng.integers(0, 301, size=30)
    for k in (1, 7, 300, 400):
        want = select_topk(s, vis, k)
        assert top_k(s, k, visible=vis).astype(np.int32).tolist() == want.tolist()
    s[:, 299] = np.nan  # past every visible length but one: never read
    vis[vis == 300] = 299
    assert top_k(s, 5, visible=vis).astype(np.int32).tolist() == select_topk(s, vis, 5).tolist()


def test_the_callers_rank_by_the_rule():
    from tilesim.reference.util.moe_routing import moe_dispatch
    from tilesim.shared.casts import to_bf16
    from tilesim.shared.msa_indexer import select_from_head_max

    logits = np.zeros((3, 6), dtype=np.float32)
    logits[1, [5, 2]] = 1.0  # token 1: experts 2 and 5 tie first, then the tied zeros
    x = to_bf16(np.ones((3, 8), dtype=np.float32))
    d = moe_dispatch(x, logits, 4)
    want = [[0, 1, 2, 3], [2, 5, 0, 1], [0, 1, 2, 3]]
    assert d.topk_ids.tolist() == top_k(logits, 4).tolist() == want
    hm = np.zeros((4, 20), dtype=np.float32)
    hm[2, [3, 17]] = 5.0
    assert select_from_head_max(hm, 20).tolist() == [[3, 17, *range(3), *range(4, 14), 19]]
    # validate=False lets NaN reach the rank: 14 numbers, then the lowest of 3 NaN blocks
    hm = np.full((4, 18), -np.inf, dtype=np.float32)
    hm[2, 4] = 1.0
    hm[0, 2] = hm[1, 9] = hm[3, 11] = np.nan
    want = [4, 0, 1, 3, 5, 6, 7, 8, 10, 12, 13, 14, 15, 16, 2, 17]
    assert select_from_head_max(hm, 18).tolist() == [want]


def test_the_judge_pairs_ties_best_first_and_never_pairs_a_nan_score():
    from tilesim.reference.judging.ties import pair_ties

    s = np.array([1.0, 5.0, np.nan, 5.0, 3.0], dtype=np.float32)
    ties, left, rest = pair_ties(s, [1], [2, 3, 4])
    assert ties == [(3, 1, 5.0, 5.0)] and left == [] and rest == [4, 2]
