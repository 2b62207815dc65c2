"""Argument checks of the MoE host glue and the FLOP counter: the fields of a ``MoeDispatch``
given to ``moe_combine``, ``moe_dispatch(normalize=True)`` on tokens whose chosen weights sum
to 0, and the ``expert_cumsum`` metadata rule of ``moe_flop_count``."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from tilesim.reference import moe_combine, moe_dispatch, moe_flop_count
from tilesim.shared import MoeDims, to_bf16

N, H, E, K = 5, 16, 4, 2


def _dispatch(seed=0):
    """A dispatch of N tokens over E experts, top-K, and an expert output of N*K rows."""
    rng = np.random.default_rng(seed)
    x = to_bf16(rng.standard_normal((N, H), dtype=np.float32))
    logits = rng.standard_normal((N, E), dtype=np.float32)
    d = moe_dispatch(x, logits, K)
    y = to_bf16(rng.standard_normal((N * K, H), dtype=np.float32))
    return d, y


# --------------------------------------------------------------------------- moe_combine


def _swap_two(a):
    b = a.copy()
    b[[0, 1]] = b[[1, 0]]
    return b


def _first_repeated(a):
    b = a.copy()
    b[3] = b[1]
    return b


def _nan_at_1_0(a):
    b = a.copy()
    b[1, 0] = np.nan
    return b


BAD_FIELDS = [
    # (field, corruption, exception, message pattern)
    ("topk_weights", lambda a: a[:, :1], ValueError,
     r"dispatch\.topk_weights: expected shape \(5, 2\)"),
    ("topk_weights", lambda a: a.astype(np.float64), TypeError,
     "dispatch.topk_weights: expected dtype float32, got float64"),
    ("topk_weights", _nan_at_1_0, ValueError,
     r"dispatch\.topk_weights: expected finite values, got nan at index \[1, 0\]"),
    ("topk_weights", lambda a: a.tolist(), TypeError,
     "dispatch.topk_weights: expected a numpy array or a torch tensor, got list"),
    ("inv_perm", np.zeros_like, ValueError,
     r"dispatch\.inv_perm: expected a permutation of range\(N\*k\) = range\(10\)"),
    ("inv_perm", _first_repeated, ValueError,
     r"dispatch\.inv_perm: expected a permutation .* at index 3"),
    ("inv_perm", lambda a: a + 100, ValueError,
     r"dispatch\.inv_perm\[0\]: expected a value in \[0, 9\], got 1\d\d"),
    ("inv_perm", lambda a: a - 10, ValueError,
     r"dispatch\.inv_perm\[0\]: expected a value in \[0, 9\], got -\d+"),
    ("inv_perm", lambda a: a[:-1], ValueError,
     r"dispatch\.inv_perm: expected shape \(10,?\) \[N\*k\], got \(9,\)"),
    ("inv_perm", lambda a: a.astype(np.int32), TypeError,
     "dispatch.inv_perm: expected dtype int64, got int32"),
    ("inv_perm", lambda a: a.astype(np.float64), TypeError,
     "dispatch.inv_perm: expected dtype int64, got float64"),
    ("inv_perm", lambda a: a.reshape(N, K), ValueError, "dispatch.inv_perm: expected shape"),
    ("perm", lambda a: a[:-1], ValueError,
     r"dispatch\.perm: expected shape \(10,?\) \[N\*k\], got \(9,\)"),
    ("topk_ids", lambda a: a.reshape(-1), ValueError,
     "dispatch.topk_ids: expected a 2-D array"),
    ("topk_ids", lambda a: a.astype(np.int32), TypeError,
     "dispatch.topk_ids: expected dtype int64, got int32"),
    ("counts", lambda a: a[:, None], ValueError, "dispatch.counts: expected a 1-D array"),
    ("expert_cumsum", lambda a: a[:-1], ValueError,
     r"dispatch\.expert_cumsum: expected shape \(5,?\) \[E\+1\], got \(4,\)"),
    ("expert_cumsum", lambda a: a.astype(np.int64), TypeError,
     "dispatch.expert_cumsum: expected dtype int32, got int64"),
    ("sorted_tokens", lambda a: a[:-1], ValueError,
     r"dispatch\.sorted_tokens: expected at least N\*k = 10 rows"),
    ("sorted_tokens", lambda a: a.astype(np.float32), TypeError,
     "dispatch.sorted_tokens: expected dtype bfloat16"),
]  # fmt: skip


@pytest.mark.parametrize("field, corrupt, exc, match", BAD_FIELDS)
def test_combine_refuses_a_bad_dispatch_field_before_any_work(field, corrupt, exc, match):
    """Each field of a MoeDispatch that is inconsistent with the others (wrong shape, dtype,
    non-permutation or out-of-range inv_perm, NaN weight) raises an error naming
    ``dispatch.<field>``; the trace is not called, so the check runs before any work, and
    neither the dispatch nor expert_out is written."""
    d, y = _dispatch()
    bad = dataclasses.replace(d, **{field: corrupt(getattr(d, field))})
    snapshot = {f.name: np.array(getattr(bad, f.name)).tobytes() for f in dataclasses.fields(bad)}
    y_before = y.tobytes()
    seen = []
    with pytest.raises(exc, match=match):
        moe_combine(y, bad, trace=seen.append)
    assert seen == []
    assert y.tobytes() == y_before
    after = {f.name: np.array(getattr(bad, f.name)).tobytes() for f in dataclasses.fields(bad)}
    assert after == snapshot


def test_combine_checks_fields_mutated_in_place():
    """A field written in place after moe_dispatch (the frozen dataclass does not stop it) is
    caught at the call: a duplicated inv_perm entry names dispatch.inv_perm."""
    d, y = _dispatch(seed=1)
    d.inv_perm[2] = d.inv_perm[0]
    with pytest.raises(ValueError, match=r"dispatch\.inv_perm: expected a permutation"):
        moe_combine(y, d)


def test_combine_accepts_any_consistent_row_order_and_gives_the_gather_it_names():
    """A hand-built dispatch whose inv_perm is another permutation of range(N*k) passes the
    checks, and row t of the result uses the expert_out rows inv_perm[t*k:(t+1)*k]: with
    unit weights and expert_out rows equal to their row index, y[t] is the sum of those
    indices (small integers, exact in BF16)."""
    d, _ = _dispatch(seed=2)
    inv = np.random.default_rng(3).permutation(N * K).astype(np.int64)
    perm = np.empty_like(inv)
    perm[inv] = np.arange(N * K, dtype=np.int64)
    hand = dataclasses.replace(d, inv_perm=inv, perm=perm,
                               topk_weights=np.ones((N, K), np.float32))  # fmt: skip
    y = to_bf16(np.repeat(np.arange(N * K, dtype=np.float32)[:, None], H, axis=1))
    got = moe_combine(y, hand).astype(np.float32)
    want = inv.reshape(N, K).sum(axis=1).astype(np.float32)
    np.testing.assert_array_equal(got, np.repeat(want[:, None], H, axis=1))


def test_combine_with_pad_rows_still_passes():
    """expert_out and sorted_tokens may hold rows past N*k (pad_rows): the checks accept the
    dispatch moe_dispatch builds with padding, and the padding rows do not change y."""
    rng = np.random.default_rng(4)
    x = to_bf16(rng.standard_normal((N, H), dtype=np.float32))
    logits = rng.standard_normal((N, E), dtype=np.float32)
    d = moe_dispatch(x, logits, K, pad_rows=64)
    y = to_bf16(rng.standard_normal((N * K + 64, H), dtype=np.float32))
    y_other_pad = y.copy()
    y_other_pad[N * K :] = to_bf16(np.full((64, H), 7.0, np.float32))
    assert moe_combine(y, d).tobytes() == moe_combine(y_other_pad, d).tobytes()


# --------------------------------------------------------------------------- moe_dispatch


def test_dispatch_normalize_refuses_probabilities_whose_chosen_weights_sum_to_0():
    """scores='probabilities' with a token whose top-k values are all 0: normalize=True is a
    0/0, so a ValueError names router_logits and the first such token (row 1 here: row 0
    has a non-zero weight), before the trace is called."""
    x = to_bf16(np.ones((3, 8), np.float32))
    probs = np.zeros((3, 4), np.float32)
    probs[0, 2] = 0.25
    seen = []
    with pytest.raises(ValueError, match=r"router_logits: .*token 1\b.*sum to 0.*normalize=True"):
        moe_dispatch(x, probs, 2, normalize=True, scores="probabilities", trace=seen.append)
    assert seen == []


def test_dispatch_normalize_refuses_logits_whose_sigmoid_underflows():
    """Logits of -200 give an FP32 sigmoid of 0 for every expert: normalize=True raises a
    ValueError naming router_logits and token 0, instead of returning NaN weights."""
    x = to_bf16(np.ones((2, 8), np.float32))
    logits = np.full((2, 4), -200.0, np.float32)
    with pytest.raises(ValueError, match=r"router_logits: .*token 0\b.*sum to 0"):
        moe_dispatch(x, logits, 2, normalize=True)


def test_dispatch_zero_weights_stay_valid_without_normalize_and_tiny_sums_normalise():
    """The rule is about a sum of exactly 0 under normalize=True: without normalize the zero
    weights are returned as they are, and logits of -103 (sigmoid = the smallest FP32
    subnormal, not 0) normalise to equal finite weights 1/k."""
    x = to_bf16(np.ones((2, 8), np.float32))
    d = moe_dispatch(x, np.full((2, 4), -200.0, np.float32), 2)
    np.testing.assert_array_equal(d.topk_weights, np.zeros((2, 2), np.float32))
    dn = moe_dispatch(x, np.full((2, 4), -103.0, np.float32), 2, normalize=True)
    np.testing.assert_array_equal(dn.topk_weights, np.full((2, 2), 0.5, np.float32))


# --------------------------------------------------------------------------- moe_flop_count


@pytest.mark.parametrize(
    "cs, exc, match",
    [
        (np.array([0, 16], np.int32), ValueError,
         r"expert_cumsum: expected length E\+1 = 5, got shape \(2,\)"),
        (np.array([0, 3, 3, 8, 16, 20, 30], np.int32), ValueError,
         r"expert_cumsum: expected length E\+1 = 5, got shape \(7,\)"),
        (np.array([0, 3, 3, 8, 16], np.int64), TypeError,
         "expert_cumsum: expected dtype int32, got int64"),
        (np.array([[0, 3, 3, 8, 16]], np.int32), ValueError,
         "expert_cumsum: expected a 1-D array"),
    ],
)  # fmt: skip
def test_flop_count_applies_the_grouped_gemm_cumsum_metadata_rule(cs, exc, match):
    """moe_flop_count refuses an expert_cumsum that moe_grouped_gemm refuses: the wrong
    length for dims.num_experts = 4, a dtype other than int32, not 1-D."""
    with pytest.raises(exc, match=match):
        moe_flop_count(cs, MoeDims(E, 64, 32))


def test_flop_count_of_a_valid_cumsum():
    """A valid INT32 [E+1] cumsum is counted: 6*H*I FLOPs per routed row (c[E] rows)."""
    cs = np.array([0, 3, 3, 8, 16], np.int32)
    assert moe_flop_count(cs, MoeDims(E, 64, 32)) == 16 * (2 * 64 * 2 * 32 + 2 * 32 * 64)
