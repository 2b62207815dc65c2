"""MiniMax expert weights: checkpoint layout <-> grouped-GEMM kernel layout
(hicann/pypto-gym minimax grouped GEMM; docs/sources.md#moe-grouped-gemm)."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from tilesim.shared import convert_minimax_weights, unconvert_minimax_weights

BF16 = np.dtype(ml_dtypes.bfloat16)


def checkpoint(e=3, i=4, h=5, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    gu = rng.standard_normal((e, 2 * i, h)).astype(np.float32).astype(dtype)
    dn = rng.standard_normal((e, h, i)).astype(np.float32).astype(dtype)
    return gu, dn


def test_index_formula_elementwise():
    e, i, h = 3, 4, 5
    gu, dn = checkpoint(e, i, h)
    w13, w2 = convert_minimax_weights(gu, dn)
    assert w13.shape == (e * h, 2 * i) and w2.shape == (e * i, h)
    # the seeds' conversion: w13_flat[e*H + h, j] = gate_up_proj[e, j, h],
    #                w2_flat[e*I + i, h] = down_proj[e, h, i]
    for ee, hh, j in itertools.product(range(e), range(h), range(2 * i)):
        assert w13[ee * h + hh, j] == gu[ee, j, hh]
    for ee, ii, hh in itertools.product(range(e), range(i), range(h)):
        assert w2[ee * i + ii, hh] == dn[ee, hh, ii]
    # gate = rows 0..I-1 of gate_up_proj -> columns 0..I-1 of each expert's w13 block
    assert np.array_equal(w13[h : 2 * h, :i], gu[1, :i, :].T)
    assert np.array_equal(w13[h : 2 * h, i:], gu[1, i:, :].T)


def test_matmul_semantics_are_kept():
    # x @ W13_e equals F.linear(x, gate_up_proj[e]); A @ W2_e equals F.linear(A, down_proj[e])
    e, i, h = 2, 3, 4
    gu, dn = checkpoint(e, i, h, dtype=np.float64)
    w13, w2 = convert_minimax_weights(gu, dn)
    x = np.random.default_rng(1).standard_normal((5, h))
    a = np.random.default_rng(2).standard_normal((5, i))
    for ee in range(e):
        assert np.allclose(x @ w13[ee * h : (ee + 1) * h], x @ gu[ee].T, rtol=0, atol=1e-12)
        assert np.allclose(a @ w2[ee * i : (ee + 1) * i], a @ dn[ee].T, rtol=0, atol=1e-12)


@pytest.mark.parametrize("shape", [(3, 4, 5), (1, 1, 1), (2, 8, 1), (4, 1, 7)])
def test_inverse_round_trip_bit_exact_bf16(shape):
    gu, dn = checkpoint(*shape, dtype=BF16)
    w13, w2 = convert_minimax_weights(gu, dn)
    assert w13.dtype == BF16 and w2.dtype == BF16
    assert w13.flags.c_contiguous and w2.flags.c_contiguous
    # fresh arrays even when the transpose happens to be contiguous (H == 1 or I == 1)
    assert not np.shares_memory(w13, gu) and not np.shares_memory(w2, dn)
    gu2, dn2 = unconvert_minimax_weights(w13, w2, num_experts=shape[0])
    assert np.array_equal(gu2.view(np.uint16), gu.view(np.uint16))
    assert np.array_equal(dn2.view(np.uint16), dn.view(np.uint16))
    assert not np.shares_memory(gu2, w13) and not np.shares_memory(dn2, w2)


def test_inputs_not_modified():
    gu, dn = checkpoint(dtype=BF16)
    g0, d0 = gu.copy(), dn.copy()
    w13, w2 = convert_minimax_weights(gu, dn)
    w130, w20 = w13.copy(), w2.copy()
    unconvert_minimax_weights(w13, w2, 3)
    for now, before in ((gu, g0), (dn, d0), (w13, w130), (w2, w20)):
        assert np.array_equal(now.view(np.uint16), before.view(np.uint16))


def test_bad_inputs_name_the_argument():
    gu, dn = checkpoint(3, 4, 5)
    with pytest.raises(
        ValueError, match=r"gate_up_proj: expected shape \[E, 2I, H\], got \(8, 5\)"
    ):
        convert_minimax_weights(gu[0], dn)
    with pytest.raises(ValueError, match="gate_up_proj: dimension 1 must be even.*7"):
        convert_minimax_weights(gu[:, :7], dn)
    with pytest.raises(ValueError, match=r"down_proj: expected shape \[E, H, I\] = \(3, 5, 4\)"):
        convert_minimax_weights(gu, dn[:, :, :3])
    with pytest.raises(TypeError, match="down_proj: expected the dtype of gate_up_proj"):
        convert_minimax_weights(gu, dn.astype(np.float64))
    w13, w2 = convert_minimax_weights(gu, dn)
    with pytest.raises(ValueError, match=r"num_experts: expected an int in \[1, 1048576\], got 0"):
        unconvert_minimax_weights(w13, w2, 0)
    with pytest.raises(TypeError, match="num_experts"):
        unconvert_minimax_weights(w13, w2, 3.0)
    with pytest.raises(ValueError, match=r"num_experts: expected a divisor of w13_flat's 15 rows"):
        unconvert_minimax_weights(w13, w2, 4)
    with pytest.raises(ValueError, match=r"num_experts: expected an int in \[1, 1048576\]"):
        unconvert_minimax_weights(w13, w2, 2**40)  # a bound, not a shape error with E = 2**40
    with pytest.raises(ValueError, match=r"w2_flat: expected shape \[E\*I, H\] = \(12, 5\)"):
        unconvert_minimax_weights(w13, w2[:-1], 3)
    with pytest.raises(TypeError, match="w2_flat: expected the dtype of w13_flat"):
        unconvert_minimax_weights(w13, w2.astype(np.float16), 3)
    assert unconvert_minimax_weights(w13, w2, np.int64(3))[0].shape == gu.shape
