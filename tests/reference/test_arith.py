"""The arithmetic models of tilesim.reference.util.arith against independent oracles."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tilesim.reference.util.arith import (
    SoftmaxMerge,
    exp_fp32_correctly_rounded,
    exp_fp32_numpy,
    matmul_fp32,
    rowsum_fp32,
    tile_softmax,
)
from tilesim.shared.casts import to_bf16, widen_to_fp32


def _bf16(rng, shape, scale=1.0):
    return widen_to_fp32(to_bf16((rng.standard_normal(shape) * scale).astype(np.float32)))


def _oracle_matmul(a, b, k_tile):
    """Python-loop oracle: exact tile sums with math.fsum, one FP32 rounding, FP32 adds."""
    m, k = a.shape
    n = b.shape[1]
    out = np.zeros((m, n), dtype=np.float32)
    step = k if k_tile is None else k_tile
    for i in range(m):
        for j in range(n):
            acc = None
            for k0 in range(0, k, step):
                part = np.float32(
                    math.fsum(float(a[i, t]) * float(b[t, j]) for t in range(k0, min(k, k0 + step)))
                )
                acc = part if acc is None else np.float32(acc + part)
            out[i, j] = acc
    return out


@pytest.mark.parametrize("k_tile", [None, 1, 7, 32, 64, 100])
def test_matmul_fp32_matches_exact_tile_oracle(rng, k_tile):
    a = _bf16(rng, (5, 100))
    b = _bf16(rng, (100, 6))
    np.testing.assert_array_equal(matmul_fp32(a, b, k_tile=k_tile), _oracle_matmul(a, b, k_tile))


def test_matmul_fp32_batched_and_float64_inputs(rng):
    a = _bf16(rng, (3, 4, 64))
    b = _bf16(rng, (64, 5))
    got = matmul_fp32(a.astype(np.float64), b.astype(np.float64), k_tile=16)
    for i in range(3):
        np.testing.assert_array_equal(got[i], _oracle_matmul(a[i], b, 16))


def test_matmul_fp32_k_tile_changes_bits_somewhere(rng):
    a = _bf16(rng, (64, 512))
    b = _bf16(rng, (512, 64))
    assert not np.array_equal(matmul_fp32(a, b, k_tile=None), matmul_fp32(a, b, k_tile=128))


def test_matmul_fp32_empty_k_and_bad_k_tile():
    z = matmul_fp32(np.zeros((2, 0), np.float32), np.zeros((0, 3), np.float32), k_tile=4)
    assert z.dtype == np.float32 and z.shape == (2, 3) and not z.any()
    with pytest.raises(ValueError, match="k_tile"):
        matmul_fp32(np.zeros((2, 4)), np.zeros((4, 3)), k_tile=0)
    with pytest.raises(ValueError, match="matmul_fp32"):
        matmul_fp32(np.zeros((2, 4)), np.zeros((5, 3)), k_tile=2)


@pytest.mark.parametrize("k_tile", [None, 1, 7, 32, 100])
def test_matmul_fp32_out_and_bf16_storage_match_exact_tile_oracle(rng, k_tile):
    """BF16 ``b`` widened one K tile at a time, the result written into a view: the fsum
    oracle's bits, nothing outside the view touched."""
    a = _bf16(rng, (5, 100))
    b = to_bf16(_bf16(rng, (100, 6)))
    want = _oracle_matmul(a, widen_to_fp32(b), k_tile)
    np.testing.assert_array_equal(matmul_fp32(a, b, k_tile=k_tile), want)
    out = np.full((7, 6), np.nan, np.float32)  # a view of a bigger array as the accumulator
    got = matmul_fp32(a.astype(np.float64), b, k_tile=k_tile, out=out[1:6])
    assert np.shares_memory(got, out)
    np.testing.assert_array_equal(out[1:6], want)
    assert np.isnan(out[0]).all() and np.isnan(out[6]).all()


def test_matmul_fp32_errors_and_empty_k():
    z = matmul_fp32(np.zeros((2, 0), np.float32), np.zeros((0, 3), np.float32), k_tile=4)
    assert z.dtype == np.float32 and z.shape == (2, 3) and not z.any()
    out = np.full((2, 3), np.nan, np.float32)
    matmul_fp32(np.zeros((2, 0)), np.zeros((0, 3)), k_tile=4, out=out)
    assert not out.any()
    with pytest.raises(ValueError, match="k_tile"):
        matmul_fp32(np.zeros((2, 4)), np.zeros((4, 3)), k_tile=0)
    with pytest.raises(ValueError, match="rows"):
        matmul_fp32(np.zeros((2, 4)), np.zeros((5, 3)), k_tile=2)
    with pytest.raises(ValueError, match="out"):
        matmul_fp32(np.zeros((2, 4)), np.zeros((4, 3)), k_tile=2, out=np.zeros((2, 3)))


def test_exp_correctly_rounded_against_neighbours(rng):
    x = rng.uniform(-80, 80, 20000).astype(np.float32)
    y = exp_fp32_correctly_rounded(x)
    exact = np.exp(x.astype(np.longdouble))
    up = np.nextafter(y, np.float32(np.inf))
    down = np.nextafter(y, np.float32(-np.inf))
    err = np.abs(y.astype(np.longdouble) - exact)
    assert (err <= np.abs(up.astype(np.longdouble) - exact)).all()
    assert (err <= np.abs(down.astype(np.longdouble) - exact)).all()


def test_exp_numpy_within_two_ulp_on_softmax_domain(rng):
    x = -rng.exponential(8.0, 50000).astype(np.float32)
    a = exp_fp32_numpy(x).view(np.int32).astype(np.int64)
    b = exp_fp32_correctly_rounded(x).view(np.int32).astype(np.int64)
    assert np.abs(a - b).max() <= 2
    with pytest.raises(TypeError, match="float32"):
        exp_fp32_numpy(np.zeros(3))


def test_rowsum_and_tile_softmax_against_float64(rng):
    s = rng.standard_normal((4, 3, 50)).astype(np.float32) * 5
    m, p, l = tile_softmax(s.copy(), exp=exp_fp32_correctly_rounded)
    np.testing.assert_array_equal(m, s.max(axis=-1, keepdims=True))
    np.testing.assert_array_equal(p, exp_fp32_correctly_rounded(s - m))
    ref = np.array([[math.fsum(map(float, row))] for row in p.reshape(-1, 50)], np.float32)
    np.testing.assert_array_equal(l.reshape(-1, 1), ref)
    np.testing.assert_array_equal(rowsum_fp32(p), l)
    s2 = s.copy()
    m2, p2, l2 = tile_softmax(s2, exp=exp_fp32_numpy, inplace=True)
    assert p2 is s2 and np.array_equal(m2, m)
    with pytest.raises(ValueError, match="inplace"):
        tile_softmax(s.copy(), exp=exp_fp32_correctly_rounded, inplace=True)


def _attention_f64(q, k, v):
    s = q.astype(np.float64) @ k.astype(np.float64).T
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p @ v) / p.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("mode", ["online", "per_tile"])
def test_softmax_merge_over_tiles_matches_float64_attention(rng, mode):
    q, k, v = _bf16(rng, (8, 32)), _bf16(rng, (96, 32)), _bf16(rng, (96, 16))
    merge = SoftmaxMerge(mode, exp=exp_fp32_correctly_rounded)
    for k0 in range(0, 96, 32):
        s = matmul_fp32(q, k[k0 : k0 + 32].T, k_tile=None)
        m_t, p, l_t = tile_softmax(s, exp=exp_fp32_correctly_rounded)
        o_t = matmul_fp32(p, v[k0 : k0 + 32], k_tile=None)
        merge.update(o_t / l_t if mode == "per_tile" else o_t, l_t, m_t)
    assert merge.tiles == 3
    np.testing.assert_allclose(merge.normalized(), _attention_f64(q, k, v), rtol=1e-5, atol=1e-6)


def test_softmax_merge_formulas_step_by_step():
    f = np.float32
    m1, l1, o1 = f([[1.0]]), f([[2.0]]), f([[3.0]])
    m2, l2, o2 = f([[2.5]]), f([[1.5]]), f([[-1.0]])
    e = exp_fp32_correctly_rounded
    on = SoftmaxMerge("online", exp=e)
    on.update(o1, l1, m1)
    on.update(o2, l2, m2)
    a, c = e(m1 - m2), e(m2 - m2)
    assert on.l == a * l1 + c * l2 and on.o == o1 * a + o2 * c and on.m == m2
    pt = SoftmaxMerge("per_tile", exp=e)
    pt.update(o1, l1, m1)
    pt.update(o2, l2, m2)
    big_a, big_c = a * l1, c * l2
    assert pt.l == big_a + big_c and pt.o == (o1 * big_a + o2 * big_c) / (big_a + big_c)
    with pytest.raises(ValueError, match="mode"):
        SoftmaxMerge("lazy")
    with pytest.raises(ValueError, match="no tile"):
        SoftmaxMerge().normalized()


def _pairwise_python(vals):
    """FP32 halving tree, element by element in Python with NumPy FP32 scalars."""
    vals = [np.float32(v) for v in vals]
    while len(vals) > 1:
        h = len(vals) // 2
        vals = [np.float32(vals[i] + vals[i + h]) for i in range(h)]
    return vals[0]


@pytest.mark.parametrize("n", [1, 2, 4, 64])
def test_halving_sum_fp32_is_the_halving_tree(n):
    from tilesim.reference.util.arith import halving_sum_fp32

    rng = np.random.default_rng(n)
    x = (rng.standard_normal((n, 5, 3)) * 10.0 ** rng.integers(-3, 4, (n, 5, 3))).astype(np.float32)
    got = halving_sum_fp32(x, axis=0)
    want = np.array([[_pairwise_python(x[:, i, j]) for j in range(3)] for i in range(5)])
    assert got.dtype == np.float32 and got.shape == (5, 3)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # and within the tree's bound of the exact sum: log2(n) roundings of partial sums
    exact = x.astype(np.float64).sum(axis=0)
    bound = max(1, int(np.log2(n))) * 2.0**-24 * np.abs(x.astype(np.float64)).sum(axis=0)
    assert (np.abs(got - exact) <= bound).all()


def test_halving_sum_fp32_refuses_a_length_that_is_not_a_power_of_two():
    from tilesim.reference.util.arith import halving_sum_fp32

    with pytest.raises(ValueError, match="power-of-two length on axis 1, got 3"):
        halving_sum_fp32(np.zeros((2, 3), np.float32), axis=1)
