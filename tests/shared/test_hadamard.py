"""The Hadamard helpers of ``tilesim.shared.hadamard``: a true Sylvester matrix, the FP32 fast
Walsh-Hadamard transform equal to the matrix product wherever no partial sum rounds, and
DeepSeek's ``rotate_activation`` rounding points (FP32 butterflies, one FP32 scale multiply,
one BF16 rounding)."""

from __future__ import annotations

import numpy as np
import pytest
from tilesim.shared.casts import BF16
from tilesim.shared.hadamard import (
    MATRIX_DTYPES,
    fwht_fp32,
    hadamard_rotate,
    scaled_hadamard_bf16,
    sylvester_hadamard,
)


@pytest.mark.parametrize("n", [1, 2, 4, 8, 64, 128, 256])
def test_sylvester_matrix_is_a_true_hadamard_matrix(n):
    h = sylvester_hadamard(n, dtype=np.float64)
    assert h.shape == (n, n)
    assert set(np.unique(h).tolist()) <= {-1.0, 1.0}
    np.testing.assert_array_equal(h @ h.T, n * np.eye(n))  # H H^T = n I, exactly
    np.testing.assert_array_equal(h, h.T)  # Sylvester's construction is symmetric
    # the closed form of entry (i, j): (-1)^popcount(i & j), written independently
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    popc = np.vectorize(lambda v: bin(int(v)).count("1"))(i & j)
    np.testing.assert_array_equal(h, np.where(popc % 2, -1.0, 1.0))


@pytest.mark.parametrize("dtype", MATRIX_DTYPES, ids=str)
def test_every_matrix_dtype_holds_the_same_signs(dtype):
    h = sylvester_hadamard(16, dtype=dtype)
    assert h.dtype == dtype
    np.testing.assert_array_equal(h.astype(np.float64), sylvester_hadamard(16, dtype=np.float64))


def test_scaled_bf16_matrix_entries_are_the_rounded_scale():
    m = scaled_hadamard_bf16(128)
    assert m.dtype == BF16 and m.shape == (128, 128)
    mag = np.abs(m.astype(np.float64))
    assert (mag == 0.08837890625).all()  # BF16(128^-0.5), below 128^-0.5
    assert abs(0.08837890625 / 128**-0.5 - 1) < 1.1e-4
    np.testing.assert_array_equal(
        np.sign(m.astype(np.float64)), sylvester_hadamard(128, dtype=np.float64)
    )


@pytest.mark.parametrize("n", [2, 8, 128])
def test_fwht_equals_the_matrix_product_when_no_sum_rounds(n, rng):
    # integers with n * max|x| < 2^24: every partial sum is exact in FP32, whatever the order
    x = rng.integers(-(2**15), 2**15, size=(33, n)).astype(np.float32)
    want = x.astype(np.float64) @ sylvester_hadamard(n, dtype=np.float64)
    got = fwht_fp32(x)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    # BF16 inputs on a narrow exponent range: 8 + log2(128) + 2 bits < 24, again exact
    xb = (rng.integers(-255, 256, size=(17, n)) * 2.0**-6).astype(np.float32).astype(BF16)
    want_b = xb.astype(np.float64) @ sylvester_hadamard(n, dtype=np.float64)
    np.testing.assert_array_equal(fwht_fp32(xb), want_b)


def test_fwht_is_the_scaled_orthogonal_transform_within_the_fp32_bound(rng):
    x = rng.standard_normal((64, 128)).astype(np.float32)
    h = sylvester_hadamard(128, dtype=np.float64)
    exact = x.astype(np.float64) @ h
    got = fwht_fp32(x).astype(np.float64)
    # 7 stages, each one rounding of a partial sum bounded by sum|x|: 7 u sum|x| per element
    bound = 7 * 2.0**-24 * np.abs(x).astype(np.float64).sum(axis=1, keepdims=True)
    assert (np.abs(got - exact) <= bound).all()
    assert (got != exact).any()  # general data does round: the bound is not vacuous
    # applying it twice gives n times the input (H H = n I), again within the bound
    twice = fwht_fp32(fwht_fp32(x)).astype(np.float64)
    assert np.abs(twice / 128 - x).max() < 1e-5


def test_fwht_stage_order_is_ascending_strides():
    # out[0] = x0 + x1 + x2 + x3: strides 1 then 2 add (x0 + x1) + (x2 + x3); the other order
    # adds (x0 + x2) + (x1 + x3). With x = [1, 2^-24, 0, 2^-24] the first rounds 1 + 2^-24
    # to 1 (tie to even) twice, the second forms 2^-23 first and keeps the exact 1 + 2^-23.
    x = np.array([[1.0, 2.0**-24, 0.0, 2.0**-24]], dtype=np.float32)
    assert fwht_fp32(x)[0, 0] == np.float32(1.0)
    assert np.float32(1.0) + np.float32(2.0**-23) != np.float32(1.0)  # the other order's value


def test_scale_is_one_fp32_multiply_after_the_transform(rng):
    x = rng.standard_normal((8, 128)).astype(np.float32)
    got = fwht_fp32(x, scale=128**-0.5)
    np.testing.assert_array_equal(got, fwht_fp32(x) * np.float32(128**-0.5))


def test_hadamard_rotate_rounding_points(rng):
    x = rng.standard_normal((5, 64, 128)).astype(np.float32).astype(BF16)
    got = hadamard_rotate(x)
    assert got.dtype == BF16 and got.shape == x.shape
    want = (fwht_fp32(x) * np.float32(128**-0.5)).astype(BF16)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    # the result is an orthonormal rotation of x up to BF16 rounding: norms are kept
    n_in = np.linalg.norm(x.astype(np.float64), axis=-1)
    n_out = np.linalg.norm(got.astype(np.float64), axis=-1)
    assert np.abs(n_out / n_in - 1).max() < 2**-8


def test_inputs_are_never_written(rng):
    x = rng.standard_normal((4, 128)).astype(np.float32)
    before = x.copy()
    fwht_fp32(x, scale=0.5)
    np.testing.assert_array_equal(x, before)


@pytest.mark.parametrize(
    "call, exc, words",
    [
        (lambda: sylvester_hadamard(12), ValueError, ["n", "power of two", "12"]),
        (lambda: sylvester_hadamard(0), ValueError, ["n", "0"]),
        (lambda: sylvester_hadamard(8, dtype=np.int32), TypeError, ["dtype", "int32"]),
        (lambda: fwht_fp32(np.zeros((2, 96), np.float32)), ValueError, ["x.shape[-1]", "96"]),
        (lambda: fwht_fp32(np.zeros((2, 8))), TypeError, ["x", "float64"]),
        (lambda: fwht_fp32([1.0, 2.0]), TypeError, ["x", "list"]),
        (lambda: fwht_fp32(np.zeros(8, np.float32), scale=float("nan")), ValueError, ["scale"]),
        (lambda: hadamard_rotate(np.zeros((2, 8), np.float32)), TypeError, ["x", "bfloat16"]),
    ],
    ids=[f"bad{i}" for i in range(8)],
)
def test_bad_arguments_are_named(call, exc, words):
    with pytest.raises(exc) as e:
        call()
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("dtype", [None, "bogus", 3])
def test_sylvester_dtype_is_named(dtype):
    """``dtype=None`` (NumPy would read float64) and names NumPy does not know are a
    ``TypeError`` naming ``dtype``."""
    from tilesim.shared.hadamard import sylvester_hadamard

    with pytest.raises(TypeError, match="^dtype: expected one of"):
        sylvester_hadamard(4, dtype=dtype)


def test_rotate_overflow_is_ieee_without_warnings():
    """Partial sums beyond FP32's range follow IEEE FP32 (``+inf``, then ``inf - inf`` =
    NaN), checked against float32 NumPy butterflies written here, with no warning raised."""
    import warnings

    from tilesim.shared.casts import BF16
    from tilesim.shared.hadamard import fwht_fp32

    x = np.full((1, 8), 3e38, np.float32).astype(BF16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = fwht_fp32(x)
    v = x.astype(np.float32)[0]
    with np.errstate(over="ignore", invalid="ignore"):
        for h in (1, 2, 4):
            v = v.reshape(-1, 2, h)
            v = np.concatenate([v[:, 0] + v[:, 1], v[:, 0] - v[:, 1]], axis=1).reshape(-1)
    assert np.array_equal(got[0], v, equal_nan=True)
    assert np.isinf(got[0, 0]) and np.isnan(got).any()
