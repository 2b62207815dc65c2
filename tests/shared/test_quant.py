"""Latent quantizers: the seeds' FP8 rule, FlashMLA's power-of-two (UE8M0) rule, INT8, dequant.

Oracles: float64 NumPy written differently (a float32 quotient is the float64 quotient rounded
once to float32; products of two float32 values are exact in float64), an independent
log2/ceil formulation of the UE8M0 scale, and torch written the way the seeds / FlashMLA write
it (``@pytest.mark.torch``).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from tilesim.shared import (
    dequantize_latent,
    quantize_latent_fp8,
    quantize_latent_fp8_ue8m0,
    quantize_latent_int8,
    to_bf16,
)

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
QUANTIZERS = [quantize_latent_fp8, quantize_latent_fp8_ue8m0, quantize_latent_int8]


def latent(rows: int = 48, seed: int = 0) -> np.ndarray:
    """BF16 [rows, 512]: U[-1,1) rows as the seeds draw them, plus crafted rows (rows >= 5)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(max(rows, 5), 512)).astype(np.float32)
    x[0] = 0.0  # all-zero groups -> the 1e-8 / 1e-4 floors
    x[1, :128] *= 1e-6  # tiny group
    x[1, 128:256] *= 300.0  # values far above 448 / scale would be without a scale
    x[2, 256] = 1000.0  # one outlier dominates its group
    x[3, 384:] = -1.0  # a constant negative group
    x[4] *= np.float32(2.0) ** rng.integers(-20, 20, size=512).astype(np.float32)
    return to_bf16(x[:rows])


def groups64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64).reshape(x.shape[0], -1, 128)


# ---------------------------------------------------------------------------------------------
# FP8, seeds' rule: s = max(amax, 1e-8) / 448, q = e4m3(clamp(x / s))
# ---------------------------------------------------------------------------------------------


def test_fp8_seeds_rule_against_float64_formulation():
    x = latent()
    q, s = quantize_latent_fp8(x)
    assert q.dtype == FP8 and q.shape == (48, 512)
    assert s.dtype == np.float32 and s.shape == (48, 4)
    g = groups64(x)
    amax = np.abs(g).max(axis=2)
    floor = float(np.float32(1e-8))
    want_s = (np.maximum(amax, floor) / 448.0).astype(np.float32)  # one rounding, as in FP32
    assert np.array_equal(s, want_s)
    quotient = (g / s.astype(np.float64)[:, :, None]).astype(np.float32)  # == FP32 division
    want_q = np.clip(quotient, -448, 448).astype(FP8).reshape(q.shape)
    assert np.array_equal(q.view(np.uint8), want_q.view(np.uint8))


def test_fp8_seeds_rule_properties():
    x = latent(seed=3)
    q, s = quantize_latent_fp8(x)
    qv = groups64(q)
    g = groups64(x)
    amax = np.abs(g).max(axis=2)
    live = amax >= 1e-8
    # the largest element of every live group lands on +-448
    assert np.all(np.abs(qv).max(axis=2)[live] == 448.0)
    # error of q*s (exact in float64) vs x: half an e4m3 step (2^-4 relative for normals,
    # 2^-10 * s absolute in the subnormal range), plus the FP32 rounding of x/s
    err = np.abs(qv * s[:, :, None] - g)
    bound = np.maximum(np.abs(g) * 2.0**-4, s[:, :, None] * 2.0**-10) * (1 + 2.0**-20)
    assert np.all(err <= bound)
    assert np.all(qv[~live] == 0)


def test_fp8_all_zero_group_uses_the_floor():
    q, s = quantize_latent_fp8(np.zeros((1, 256), np.float32))
    assert np.all(s == np.float32(np.float32(1e-8) / np.float32(448)))
    assert np.all(q.view(np.uint8) == 0)


@pytest.mark.torch
def test_fp8_seeds_rule_matches_torch_written_the_seeds_way():
    import torch

    x = latent(64, seed=1)
    q, s = quantize_latent_fp8(x)
    kn = torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)
    g = kn.float().view(64, 4, 128)
    amax = g.abs().amax(dim=-1, keepdim=True)
    scale = amax.clamp(min=1e-8) / 448
    tq = (g / scale).to(torch.float8_e4m3fn).view(torch.uint8).view(64, 512).numpy()
    assert np.array_equal(q.view(np.uint8), tq)
    assert np.array_equal(s, scale.view(64, 4).numpy())


# ---------------------------------------------------------------------------------------------
# FP8, FlashMLA UE8M0 rule: s = 2^ceil(log2(max(amax/448, 1e-4)))
# ---------------------------------------------------------------------------------------------


def ue8m0_oracle(amax64: np.ndarray) -> np.ndarray:
    """Independent formulation: float64 log2 and ceil of the floored ratio."""
    ratio = np.maximum(amax64 / 448.0, 1e-4)
    return 2.0 ** np.ceil(np.log2(ratio))


def test_ue8m0_scale_is_the_power_of_two_from_log2_ceil():
    x = latent(seed=5)
    q, s = quantize_latent_fp8_ue8m0(x)
    assert s.dtype == np.float32 and s.shape == (48, 4)
    m, _ = np.frexp(s)
    assert np.all(m == 0.5)  # powers of two
    amax = np.abs(groups64(x)).max(axis=2)
    assert np.array_equal(s.astype(np.float64), ue8m0_oracle(amax))
    # minimal: half the scale would not cover max(amax/448, 1e-4)
    assert np.all(s / 2.0 < np.maximum(amax / 448.0, 1e-4))
    assert np.all(s >= np.maximum(amax / 448.0, 1e-4))


@pytest.mark.parametrize(
    ("amax", "scale"),
    [
        (448.0, 1.0),  # exactly a power of two: ceil(log2(1)) = 0, not 1
        (448.0 * 2.0**-3, 2.0**-3),
        (449.0, 2.0),
        (0.0, 2.0**-13),  # floor 1e-4: 2^-14 = 6.1e-5 < 1e-4 <= 2^-13
        (448.0 * 2.0**-10, 2.0**-10),
        (float(np.nextafter(np.float32(448 * 2.0**-10), np.float32(1))), 2.0**-9),
    ],
)
def test_ue8m0_crafted_scales(amax, scale):
    x = np.zeros((1, 128), np.float32)
    x[0, 7] = amax
    x[0, 8] = -amax / 3
    q, s = quantize_latent_fp8_ue8m0(x)
    assert s[0, 0] == scale
    assert ue8m0_oracle(np.array([float(np.float32(amax))]))[0] == scale


def test_ue8m0_never_needs_the_clamp_and_dequantizes_exactly():
    x = latent(seed=7)
    q, s = quantize_latent_fp8_ue8m0(x)
    g = groups64(x)
    assert np.all(np.abs(g / s[:, :, None]) <= 448.0)
    exact = groups64(q) * s[:, :, None]  # float64, exact
    deq = dequantize_latent(q, s)
    assert deq.dtype == BF16
    # q has 4 significant bits and s is a power of two: the BF16 result is exact
    assert np.array_equal(deq.astype(np.float64).reshape(exact.shape), exact)


@pytest.mark.torch
def test_ue8m0_matches_torch_written_the_flashmla_way_on_bf16_data():
    import torch

    x = latent(64, seed=2)
    q, s = quantize_latent_fp8_ue8m0(x)
    g = torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16).float().view(64, 4, 128)
    amax = g.abs().amax(dim=-1, keepdim=True)
    ts = torch.pow(2, (amax / 448.0).clamp_min(1e-4).log2().ceil())
    tq = (g / ts).to(torch.float8_e4m3fn).view(torch.uint8).view(64, 512).numpy()
    assert np.array_equal(s, ts.view(64, 4).numpy())
    assert np.array_equal(q.view(np.uint8), tq)


@pytest.mark.torch
def test_ue8m0_float32_log2_can_pick_one_power_lower_than_the_exact_rule():
    # measured on torch 2.13: for amax/448 one FP32 ULP above 2^-10, FP32 log2 returns exactly
    # -10.0 (the true value -10 + 1.7e-7 is below half an FP32 ULP at 10), so a float32
    # ``log2().ceil()`` gives 2^-10 < amax/448; tilesim uses the exact ceil(log2) -> 2^-9
    import torch

    amax = np.nextafter(np.float32(448 * 2.0**-10), np.float32(1))
    t = torch.tensor([amax])
    ts = torch.pow(2, (t / 448.0).clamp_min(1e-4).log2().ceil()).item()
    x = np.zeros((1, 128), np.float32)
    x[0, 0] = amax
    _, s = quantize_latent_fp8_ue8m0(x)
    assert ts == 2.0**-10 and s[0, 0] == 2.0**-9


# ---------------------------------------------------------------------------------------------
# INT8: s = max(amax, 1e-8) / 127, q = clamp(round_half_even(x / s), -128, 127)
# ---------------------------------------------------------------------------------------------


def test_int8_half_to_even_by_hand():
    # amax 127 -> scale exactly 1.0, so x / s = x and the ties are visible
    row = np.zeros((1, 128), np.float32)
    vals = [127.0, 2.5, 3.5, -2.5, -0.5, 0.5, 1.5, -126.5, 125.5, -3.5]
    row[0, : len(vals)] = vals
    q, s = quantize_latent_int8(row)
    assert s.tolist() == [[1.0]]
    assert q[0, : len(vals)].tolist() == [127, 2, 4, -2, 0, 0, 2, -126, 126, -4]
    assert q.dtype == np.int8


def test_int8_against_python_round_of_the_fp32_quotient():
    x = latent(16, seed=9)
    q, s = quantize_latent_int8(x)
    g = groups64(x)
    amax = np.abs(g).max(axis=2)
    want_s = (np.maximum(amax, float(np.float32(1e-8))) / 127.0).astype(np.float32)
    assert np.array_equal(s, want_s)
    quotient = (g / s.astype(np.float64)[:, :, None]).astype(np.float32).reshape(-1)
    want = np.array([min(max(round(float(v)), -128), 127) for v in quotient], dtype=np.int8)
    assert np.array_equal(q.reshape(-1), want)  # Python round() is half to even
    assert q.min() >= -127 and q.max() <= 127  # |x / s| <= 127 (+ FP32 rounding)


@pytest.mark.torch
def test_int8_matches_torch_written_the_seeds_way():
    import torch

    x = latent(64, seed=4)
    q, s = quantize_latent_int8(x)
    g = torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16).float().view(64, 4, 128)
    scale = g.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / 127
    tq = torch.round(g / scale).clamp(-128, 127).to(torch.int8).view(64, 512).numpy()
    assert np.array_equal(q, tq) and np.array_equal(s, scale.view(64, 4).numpy())


# ---------------------------------------------------------------------------------------------
# dequantization and argument checking
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("quantize", QUANTIZERS)
def test_dequantize_is_bf16_of_the_fp32_product(quantize):
    x = latent(seed=11)
    q, s = quantize(x)
    deq = dequantize_latent(q, s)
    assert deq.dtype == BF16 and deq.shape == x.shape
    prod32 = (groups64(q) * s[:, :, None]).astype(np.float32)  # exact product, one rounding
    want = prod32.reshape(x.shape).astype(BF16)
    assert np.array_equal(deq.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("quantize", QUANTIZERS)
def test_quantizers_accept_float32_and_keep_inputs(quantize):
    x32 = latent(seed=12).astype(np.float32)
    keep = x32.copy()
    q32, s32 = quantize(x32)
    qb, sb = quantize(to_bf16(x32))
    assert np.array_equal(x32, keep)
    assert np.array_equal(q32.view(np.uint8), qb.view(np.uint8)) and np.array_equal(s32, sb)
    xb = to_bf16(x32)
    kb = xb.copy()
    quantize(xb)
    assert np.array_equal(xb.view(np.uint16), kb.view(np.uint16))
    qk, sk = q32.copy(), s32.copy()
    dequantize_latent(q32, s32)
    assert np.array_equal(q32.view(np.uint8), qk.view(np.uint8)) and np.array_equal(s32, sk)


@pytest.mark.parametrize("quantize", QUANTIZERS)
def test_quantizer_bad_inputs_name_the_argument(quantize):
    name = quantize.__name__
    with pytest.raises(TypeError, match=rf"{name}\(x\).*float64"):
        quantize(np.zeros((2, 512)))
    with pytest.raises(ValueError, match=rf"{name}\(x\).*\(2, 500\)"):
        quantize(np.zeros((2, 500), np.float32))
    with pytest.raises(ValueError, match=rf"{name}\(x\).*\(512,\)"):
        quantize(np.zeros(512, np.float32))
    bad = np.zeros((2, 512), np.float32)
    bad[1, 3] = np.nan
    with pytest.raises(
        ValueError, match=rf"{name}\(x\): expected finite values, got nan at index \[1, 3\]"
    ):
        quantize(bad)


def test_dequantize_bad_inputs_name_the_argument():
    q, s = quantize_latent_fp8(latent(4))
    with pytest.raises(TypeError, match=r"dequantize_latent\(q\).*float32"):
        dequantize_latent(q.astype(np.float32), s)
    with pytest.raises(TypeError, match=r"dequantize_latent\(scales\).*float64"):
        dequantize_latent(q, s.astype(np.float64))
    with pytest.raises(ValueError, match=r"dequantize_latent\(scales\).*\(4, 4\).*\(4, 3\)"):
        dequantize_latent(q, s[:, :3])
    with pytest.raises(ValueError, match=r"dequantize_latent\(q\)"):
        dequantize_latent(q[:, :100], s)


def test_group_size_constant():
    assert math.prod(quantize_latent_fp8(latent(2))[1].shape) == 2 * 512 // 128


def test_dequantize_every_fp8_byte_against_a_bit_formula():
    """All 256 E4M3FN bytes (zeros, subnormals, normals, NaNs) in every group and column, four
    scales: finite bytes give BF16(FP32(value * s)) with the value decoded from the bits by hand;
    NaN bytes give a NaN of the byte's sign."""
    byte = np.arange(256, dtype=np.uint8)
    q = np.tile(byte.reshape(2, 128), (2, 4)).view(FP8)  # [4, 512]
    s = np.array([[1.0, 2.0**-9, 0.37, 3.1e-3]] * 4, np.float32)
    s[2:] = s[2:, ::-1]
    with np.errstate(invalid="ignore"):
        deq = dequantize_latent(q, s).astype(np.float32).reshape(4, 4, 128)
    b = q.view(np.uint8).astype(np.int64).reshape(4, 4, 128)
    sign = np.where(b & 0x80, -1.0, 1.0)
    e, m = (b >> 3) & 0xF, b & 0x7
    mag = np.where(e == 0, m * 2.0**-9, (1 + m / 8.0) * 2.0 ** (e - 7))
    want = (sign * mag * s[:, :, None].astype(np.float64)).astype(np.float32)  # exact, 1 round
    want = want.astype(BF16).astype(np.float32)
    nan = (b & 0x7F) == 0x7F
    assert np.array_equal(deq[~nan], want[~nan])
    assert np.array_equal(np.signbit(deq[~nan]), np.signbit(want[~nan]))  # -0 stays -0
    assert np.isnan(deq[nan]).all()
    assert np.array_equal(np.signbit(deq[nan]), (b[nan] & 0x80) != 0)
