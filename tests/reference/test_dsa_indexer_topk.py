"""The one top-k rule (``tilesim.shared.dsa_indexer.select_topk``) against ``sorted``.

Exhaustive on small rows: every score vector over a few levels (many ties, -0.0 next to 0.0,
-inf, huge values), every visible length and every ``topk``, against the oracle's plain
``sorted`` on ``(-score, position)`` (``tests/oracles/dsa_indexer.py``).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from oracles.dsa_indexer import oracle_topk
from tilesim.shared.dsa_indexer import select_topk

LEVELS = np.array([0.0, -0.0, 1.5, -2.0], dtype=np.float32)


def _check(rows: np.ndarray, visible, topk: int) -> None:
    got = select_topk(rows, np.asarray(visible), topk)
    assert got.dtype == np.int32 and got.shape == (rows.shape[0], topk)
    for i, v in enumerate(visible):
        assert got[i].tolist() == oracle_topk(rows[i], v, topk), (rows[i], v, topk)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_every_row_over_four_levels_every_length_and_k(n):
    rows = np.array(list(itertools.product(LEVELS, repeat=n)), dtype=np.float32)
    for topk in range(1, n + 2):
        for v in range(n + 1):
            _check(rows, [v] * rows.shape[0], topk)


def test_extreme_values_and_ragged_lengths(rng):
    vals = np.array([np.finfo(np.float32).max, -np.inf, 3.0, 3.0, 1e-45, -1e-45, 0.0],
                    dtype=np.float32)  # fmt: skip
    rows = vals[rng.integers(0, vals.size, size=(400, 9))]
    visible = rng.integers(0, 10, size=400)
    for topk in (1, 3, 8, 9, 12):
        _check(rows, visible.tolist(), topk)


def test_large_rows_with_a_tied_boundary(rng):
    # 5000 scores from 40 levels: the k-th value is tied many times, the rule picks the
    # lowest tied positions (argpartition alone would not)
    rows = rng.integers(0, 40, size=(6, 5000)).astype(np.float32)
    _check(rows, [5000, 4999, 2049, 2048, 2047, 100], 2048)


def test_columns_past_visible_are_never_read():
    rows = np.full((2, 6), np.nan, dtype=np.float32)
    rows[:, :3] = [[1.0, 2.0, 2.0], [0.0, -0.0, 0.0]]
    got = select_topk(rows, np.array([3, 3]), 4)
    assert got.tolist() == [[1, 2, 0, -1], [0, 1, 2, -1]]


def test_nan_among_visible_scores_is_refused():
    rows = np.array([[1.0, np.nan, 0.5]], dtype=np.float32)
    with pytest.raises(ValueError, match=r"scores\[0, 1\].*NaN"):
        select_topk(rows, np.array([3]), 2)
    assert select_topk(rows, np.array([1]), 2).tolist() == [[0, -1]]


def test_bad_arguments_are_named():
    s = np.zeros((2, 4), dtype=np.float32)
    with pytest.raises(ValueError, match="visible"):
        select_topk(s, np.array([5, 1]), 2)
    with pytest.raises(TypeError, match="scores"):
        select_topk(s.astype(np.float64), np.array([1, 1]), 2)
    with pytest.raises(ValueError, match="topk"):
        select_topk(s, np.array([1, 1]), 0)
