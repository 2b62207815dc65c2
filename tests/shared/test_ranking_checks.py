"""shared/ranking.py under the argument policy of :mod:`tilesim.shared.validate`: masked arrays,
``np.matrix`` and Python lists are a ``TypeError`` naming the argument; torch tensors (BF16,
``requires_grad``) are read through the policy's helpers and ranked like their NumPy data; a
``k`` whose result would not fit is a ``ValueError`` naming ``k`` before any allocation."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from tilesim.shared.ranking import rank, top_k


def test_masked_scores_are_refused_not_ranked_without_their_mask():
    """A masked array's mask would be dropped (a masked position could rank first): both
    ``top_k`` and ``rank`` refuse it with a TypeError naming the argument."""
    s = np.ma.array([3.0, 1.0, 9.0, 5.0], mask=[0, 0, 1, 0])
    with pytest.raises(TypeError, match=r"^scores: expected a plain numpy array, got MaskedArray"):
        top_k(s, 2)
    with pytest.raises(TypeError, match=r"^block scores: expected a plain numpy array"):
        rank(s, name="block scores")


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_matrix_and_lists_are_refused_for_scores_and_visible():
    """``np.matrix`` and Python lists are TypeErrors naming ``scores`` / ``visible``."""
    with pytest.raises(TypeError, match=r"^scores: expected a plain numpy array, got matrix"):
        top_k(np.matrix([[3.0, 1.0, 2.0]]), 2)
    with pytest.raises(TypeError, match=r"^scores: expected a numpy array or a torch tensor"):
        top_k([[3, 1, 2]], 2)
    with pytest.raises(TypeError, match=r"^scores: expected a numpy array or a torch tensor"):
        rank([3, 1, 2])
    s = np.zeros((2, 4), dtype=np.float32)
    with pytest.raises(TypeError, match=r"^visible: expected a numpy array or a torch tensor"):
        top_k(s, 2, visible=[4, 3])
    with pytest.raises(TypeError, match=r"^visible: expected a plain numpy array, got Masked"):
        top_k(s, 2, visible=np.ma.array([4, 3], mask=[0, 1]))


def test_a_huge_k_is_a_value_error_naming_k_before_allocating():
    """``k = 10**12`` over two rows is a ValueError naming ``k`` (not a MemoryError)."""
    with pytest.raises(ValueError, match=r"^k: expected at most \d+ elements"):
        top_k(np.zeros((2, 4), dtype=np.float32), 10**12)


@pytest.mark.torch
def test_torch_bf16_and_requires_grad_scores_rank_like_their_numpy_data():
    """A BF16 tensor and a ``requires_grad`` tensor are read through the policy's helpers
    (no torch error leaks) and rank exactly as their NumPy values; they are not written."""
    torch = pytest.importorskip("torch")
    vals = np.array([[3.0, -1.0, 3.0, 0.5], [0.0, -0.0, 7.0, 7.0]], dtype=np.float32)
    want = top_k(vals.astype(ml_dtypes.bfloat16), 3)
    t = torch.tensor(vals, dtype=torch.bfloat16)
    before = t.clone()
    assert top_k(t, 3).tolist() == want.tolist()
    assert rank(t).tolist() == rank(vals).tolist()
    assert torch.equal(t, before)
    g = torch.tensor(vals, requires_grad=True)
    assert (
        top_k(g, 3, visible=torch.tensor([4, 2])).tolist()
        == top_k(vals, 3, visible=np.array([4, 2])).tolist()
    )
