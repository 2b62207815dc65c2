"""reference.arith.block_scaled_matmul_fp32: DeepSeek's fp8_gemm K-block accumulation."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from tilesim.reference.util.arith import block_scaled_matmul_fp32, fma_fp32, matmul_fp32
from tilesim.shared.casts import to_fp8_e4m3
from tilesim.shared.quant import e4m3_to_fp32

F32 = np.float32


def _fp8_values(rng, shape) -> np.ndarray:
    return e4m3_to_fp32(to_fp8_e4m3(rng.standard_normal(shape).astype(F32)))


def test_one_block_with_unit_scales_is_one_matmul():
    rng = np.random.default_rng(0)
    a, b = _fp8_values(rng, (3, 128)), _fp8_values(rng, (128, 5))
    got = block_scaled_matmul_fp32(a, np.ones((3, 1), F32), b, np.ones((1, 1), F32), block=128)
    assert got.dtype == F32
    assert np.array_equal(got, matmul_fp32(a, b, k_tile=None))


def test_blocks_add_in_fp32_in_k_order_with_both_scales():
    """Per K block: the block's one-tile partial times FP32(row scale * column tile's scale),
    added to the FP32 accumulator in K order; the N tail narrower than a block reads the
    scale of its own tile."""
    rng = np.random.default_rng(1)
    m, k, n, blk = 4, 384, 130, 128
    a, b = _fp8_values(rng, (m, k)), _fp8_values(rng, (k, n))
    sa = np.ldexp(F32(1), rng.integers(-8, 8, (m, k // blk))).astype(F32)
    sb = np.ldexp(F32(1), rng.integers(-8, 8, (k // blk, 2))).astype(F32)
    got = block_scaled_matmul_fp32(a, sa, b, sb, block=blk, promotion="two_roundings")
    want = np.zeros((m, n), F32)
    for kb in range(k // blk):
        ks = slice(kb * blk, (kb + 1) * blk)
        part = matmul_fp32(a[:, ks], b[ks], k_tile=None)
        col_scale = np.concatenate([np.full(blk, sb[kb, 0]), np.full(n - blk, sb[kb, 1])])
        want = (want + part * (sa[:, kb : kb + 1] * col_scale.astype(F32))).astype(F32)
    assert np.array_equal(got.view(np.int32), want.view(np.int32))


# ----------------------------------------------------------------------------- the FMA
def _round_fp32_exact(v: Fraction) -> float:
    """The FP32 value nearest the rational ``v`` (ties to even, overflow to inf), by integer
    arithmetic only: the oracle of :func:`fma_fp32`. Zero is returned as +0."""
    if v == 0:
        return 0.0
    sign, mag = (-1.0 if v < 0 else 1.0), abs(v)
    n, d = mag.numerator, mag.denominator
    e = n.bit_length() - d.bit_length()  # floor(log2 mag) is e or e - 1
    if Fraction(2) ** e > mag:
        e -= 1
    e = max(e, -126)  # subnormals share the least exponent
    scaled = mag / Fraction(2) ** (e - 23)  # significand with 23 fraction bits
    m, rem = divmod(scaled.numerator, scaled.denominator)
    twice = 2 * rem
    if twice > scaled.denominator or (twice == scaled.denominator and m % 2 == 1):
        m += 1
    value = m * 2.0 ** (e - 23)  # exact in float64
    return sign * (math.inf if value > float(np.finfo(F32).max) else value)


def _fma_oracle(a, b, c) -> np.ndarray:
    out = [_round_fp32_exact(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
           for x, y, z in zip(a.ravel(), b.ravel(), c.ravel(), strict=True)]  # fmt: skip
    return np.array(out, dtype=F32)


def _random_fp32(rng, n: int, lo: int, hi: int) -> np.ndarray:
    """Random FP32 with full 24-bit significands and exponents in ``[lo, hi)``, random signs."""
    m = (rng.integers(1 << 23, 1 << 24, n) | 1).astype(np.float64)  # odd: every bit used
    v = np.ldexp(m, rng.integers(lo, hi, n) - 23) * rng.choice([-1.0, 1.0], n)
    return v.astype(F32)


def _same_bits(got, want) -> bool:
    """Bit equality, zeros compared by value (the oracle's zero is unsigned)."""
    got, want = np.asarray(got, F32), np.asarray(want, F32)
    zero = (got == 0) & (want == 0)
    return bool(np.all(zero | (got.view(np.int32) == want.view(np.int32))))


def test_fma_matches_exact_rounding_on_random_operands():
    """Random operands over near and far exponents (cancellation, c dominating, the product
    dominating, results in the subnormal range): every result is the exact a*b + c rounded
    once to FP32."""
    rng = np.random.default_rng(7)
    n = 4000
    for lo, hi, clo, chi in ((-10, 10, -20, 20), (-70, -55, -140, -120), (0, 3, 20, 40),
                             (-3, 3, -30, -20), (55, 64, 120, 128)):  # fmt: skip
        a, b, c = _random_fp32(rng, n, lo, hi), _random_fp32(rng, n, lo, hi), _random_fp32(
            rng, n, clo, chi)  # fmt: skip
        assert _same_bits(fma_fp32(a, b, c), _fma_oracle(a, b, c)), (lo, hi, clo, chi)


def _midpoint_traps(rng, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Operands whose float64 sum ``a*b + c`` is an FP32 midpoint (or within 2^-53 of one):
    ``c`` in [1, 2), ``a * b`` close to half an FP32 ulp of ``c`` with a tail below float64's
    last bit -- the double-rounding traps."""
    a = _random_fp32(rng, 40 * n, 0, 1)
    b = (2.0**-24 / a.astype(np.float64)).astype(F32)  # a * b = 2^-24 * (1 + eps)
    prod = a.astype(np.float64) * b.astype(np.float64)
    keep = np.abs(prod - 2.0**-24) <= 2.0**-53  # the tail lies below 1's float64 ulp
    a, b = a[keep][:n], b[keep][:n]
    c = (1.0 + rng.integers(0, 1 << 23, a.size) * 2.0**-23).astype(F32)
    return a, b, c


def test_fma_rounds_double_rounding_traps_correctly():
    """Where the float64 sum lands on an FP32 midpoint the exact sum lies off it: the FMA
    follows the exact value; rounding the float64 sum again (the naive method) gets a share
    of these wrong, so the traps are real."""
    a, b, c = _midpoint_traps(np.random.default_rng(11), 600)
    assert a.size >= 300
    want = _fma_oracle(a, b, c)
    assert _same_bits(fma_fp32(a, b, c), want)
    naive = (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(F32)
    assert (naive != want).sum() >= a.size // 10


def test_fma_special_values_and_signed_zeros():
    """inf / NaN propagate as in IEEE fusedMultiplyAdd; overflow rounds to inf; an exact zero
    sum of opposite signs is +0, of two -0 is -0."""
    big, inf = np.finfo(F32).max, np.float32(np.inf)
    a = np.array([inf, 1, big, big, 0, -1, 0, 1], F32)
    b = np.array([1, 1, 2, 1, -1, 1, 5, np.nan], F32)
    c = np.array([1, -inf, 0, 0, 0, 1, -0.0, 0], F32)
    got = fma_fp32(a, b, c)
    assert got[0] == inf and got[1] == -inf and got[2] == inf and got[3] == big
    assert got[4] == 0 and not np.signbit(got[4])  # -0 + 0
    assert got[5] == 0 and not np.signbit(got[5])  # -1 + 1
    assert got[6] == 0 and not np.signbit(got[6])  # +0 + -0
    assert np.isnan(got[7])
    assert np.signbit(fma_fp32(np.float32(-0.0), np.float32(1), np.float32(-0.0)))


def _amax448(rng, shape) -> np.ndarray:
    """``amax / 448`` style weight block scales: FP32 values with full significands."""
    return (rng.uniform(0.5, 2.0, shape) / 448.0).astype(F32)


def test_fma_promotion_is_one_fma_per_block():
    """``promotion="fma"``: per K block ``acc = fma(partial, FP32(sa * sb), acc)``; with
    ``amax/448`` weight scales it differs from ``"two_roundings"`` in some elements, and
    with power-of-two scales the two agree bit for bit."""
    rng = np.random.default_rng(3)
    m, k, n, blk = 16, 512, 256, 128
    a, b = _fp8_values(rng, (m, k)), _fp8_values(rng, (k, n))
    sa = np.ldexp(F32(1), rng.integers(-8, 0, (m, k // blk))).astype(F32)
    sb = _amax448(rng, (k // blk, n // blk))
    want = np.zeros((m, n), F32)
    for kb in range(k // blk):
        ks = slice(kb * blk, (kb + 1) * blk)
        part = matmul_fp32(a[:, ks], b[ks], k_tile=None)
        scale = sa[:, kb : kb + 1] * np.repeat(sb[kb], blk)[None, :]
        want = np.array(_fma_oracle(part, np.broadcast_to(scale, part.shape),
                                    want)).reshape(m, n)  # fmt: skip
    fma = block_scaled_matmul_fp32(a, sa, b, sb, block=blk, promotion="fma")
    two = block_scaled_matmul_fp32(a, sa, b, sb, block=blk, promotion="two_roundings")
    assert _same_bits(fma, want)
    assert (fma != two).sum() > 0
    pow2 = np.ldexp(F32(1), rng.integers(-12, -6, sb.shape)).astype(F32)
    assert np.array_equal(
        block_scaled_matmul_fp32(a, sa, b, pow2, block=blk).view(np.int32),
        block_scaled_matmul_fp32(a, sa, b, pow2, block=blk, promotion="two_roundings").view(
            np.int32),
    )  # fmt: skip


def test_promotion_switch_is_checked():
    a = np.zeros((1, 128), F32)
    with pytest.raises(ValueError, match=r"promotion: expected one of \('fma', 'two_roundings'\)"
                       r", got 'fused'"):  # fmt: skip
        block_scaled_matmul_fp32(a, np.ones((1, 1), F32), a.T.copy(), np.ones((1, 1), F32),
                                 block=128, promotion="fused")  # fmt: skip
