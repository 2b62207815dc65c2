"""FP32 -> BF16 / FP8 E4M3FN rounding and the widening casts, bit for bit.

Oracles (independent of the code under test, which wraps ml_dtypes):

* an integer RNE oracle for BF16 written in NumPy uint arithmetic on the FP32 bit pattern;
* an FP8 E4M3FN oracle that decodes all 256 codes to float64 from the format definition and
  picks the nearest one (ties to the even code) by search;
* ml_dtypes itself and torch (``@pytest.mark.torch``), over every BF16 and every FP8 pattern
  and over ~1.45M FP32 inputs (every BF16 tie and its neighbours, FP8 ties and neighbours,
  subnormals, +-0, +-inf, NaNs with payloads and both signs, FP8 overflow around
  448/464/480, random bit patterns).
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest
from tilesim.reference import bf16_round_trip, to_bf16, to_fp8_e4m3, ulp_distance, widen_to_fp32
from tilesim.shared import casts

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)


def f32(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def bits16(a) -> np.ndarray:
    return np.asarray(a).view(np.uint16)


def bits8(a) -> np.ndarray:
    return np.asarray(a).view(np.uint8)


# ---------------------------------------------------------------------------------------------
# independent oracles
# ---------------------------------------------------------------------------------------------


def bf16_rne_oracle(x32: np.ndarray) -> np.ndarray:
    """FP32 -> BF16 bits by integer arithmetic: keep the top 16 bits, add one when the dropped
    low half is above 0x8000, or exactly 0x8000 with an odd kept half. NaN -> sign | 0x7FC0."""
    u = x32.view(np.uint32).astype(np.uint64)
    hi = u >> np.uint64(16)
    lo = u & np.uint64(0xFFFF)
    up = (lo > 0x8000) | ((lo == 0x8000) & ((hi & np.uint64(1)) == 1))
    rounded = hi + up.astype(np.uint64)  # a carry walks into the exponent (max finite -> inf)
    is_nan = ((u & np.uint64(0x7F800000)) == 0x7F800000) & ((u & np.uint64(0x7FFFFF)) != 0)
    nan_bits = (hi & np.uint64(0x8000)) | np.uint64(0x7FC0)
    return np.where(is_nan, nan_bits, rounded).astype(np.uint16)


def fp8_table() -> tuple[np.ndarray, np.ndarray]:
    """float64 value of every E4M3FN code (sign, 4-bit exponent with bias 7, 3-bit mantissa;
    exponent 0 = subnormal; S.1111.111 = NaN, no infinities) and the NaN mask."""
    c = np.arange(256)
    sign = np.where(c >> 7, -1.0, 1.0)
    e = (c >> 3) & 0xF
    m = c & 7
    mag = np.where(e == 0, m / 8.0 * 2.0**-6, (1.0 + m / 8.0) * 2.0 ** (e - 7.0))
    nan = (c & 0x7F) == 0x7F
    return np.where(nan, np.nan, sign * mag), nan


def fp8_rne_oracle(x32: np.ndarray, *, saturate: bool) -> np.ndarray:
    """Nearest E4M3FN code to each FP32 input (ties to the even code) by search over the 127
    non-negative finite values. Overflow: saturate -> +-448; otherwise |x| > 464 (the midpoint
    to the missing next value 480, a tie at 464 going to the even 448) and +-inf -> NaN."""
    vals, _ = fp8_table()
    mags = vals[:127]  # codes 0x00..0x7E, ascending
    with np.errstate(invalid="ignore"):
        x = x32.astype(np.float64)
    nan_in = np.isnan(x)
    ax = np.abs(np.where(nan_in, 0.0, x))
    if saturate:
        ax = np.minimum(ax, 448.0)
    idx = np.searchsorted(mags, ax)  # first code whose value >= |x|
    hi = np.minimum(idx, 126)
    lo = np.maximum(idx - 1, 0)
    d_hi = mags[hi] - ax
    d_lo = ax - mags[lo]
    take_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    code = np.where(take_hi, hi, lo)
    code = np.where(ax > 448.0, np.where(ax <= 464.0, 126, 127), code)
    sign = np.where(np.signbit(x), 0x80, 0)
    code = np.where(nan_in, 0x7F, code)
    return (code | sign).astype(np.uint8)


# ---------------------------------------------------------------------------------------------
# the FP32 probe set
# ---------------------------------------------------------------------------------------------

NAN_BITS = [
    0x7FC00000,
    0xFFC00000,
    0x7F800001,  # signalling, smallest payload
    0xFF800001,
    0x7FA00000,
    0x7FC12345,
    0xFFC12345,
    0x7FFFFFFF,
    0xFFFFFFFF,
    0x7F808000,  # payload only in the bits BF16 drops, plus the tie bit
]


@functools.lru_cache(maxsize=1)
def probe_set() -> np.ndarray:
    """~1.45M FP32 inputs (as float32) covering every case of docs/numerics.md's rounding rules."""
    rng = np.random.default_rng(2)
    parts = []
    # every BF16 pattern, its exact tie, one ULP either side of the tie, and the extremes of the
    # dropped half: exact values, ties, near ties, subnormals, inf, NaN payloads, both signs
    hi = np.arange(65536, dtype=np.uint32) << 16
    for low in (0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF):
        parts.append(hi | np.uint32(low))
    specials = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x00000001, 0x80000001]
    specials += [0x007FFFFF, 0x807FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF] + NAN_BITS
    parts.append(np.array(specials, dtype=np.uint32))
    parts.append(rng.integers(0, 2**32, 1_000_000, dtype=np.uint32))
    parts.append(rng.integers(0, 0x00800000, 20_000, dtype=np.uint32))  # FP32 subnormals
    # FP8: every value, every midpoint between neighbours (exact ties), one FP32 ULP either side
    vals, nan = fp8_table()
    pos = np.sort(vals[:127]).astype(np.float32)
    mids = ((pos[:-1].astype(np.float64) + pos[1:]) / 2).astype(np.float32)
    extra = np.array([464.0, 480.0, 496.0, 512.0, 1e4, 3.4e38, 2.0**-10, 2.0**-11], np.float32)
    grid = np.concatenate([pos, mids, extra])
    near = [grid]
    for k in (1, 2):
        up, dn = grid.copy(), grid.copy()
        for _ in range(k):
            up = np.nextafter(up, np.float32(np.inf))
            dn = np.nextafter(dn, np.float32(-np.inf))
        near += [up, dn]
    g = np.concatenate(near)
    parts.append(np.concatenate([g, -g]).view(np.uint32))
    # FP8 overflow region on a fine grid
    ov = np.linspace(440.0, 490.0, 20001, dtype=np.float32)
    parts.append(np.concatenate([ov, -ov]).view(np.uint32))
    return np.concatenate(parts).view(np.float32)


def test_probe_set_covers_the_required_cases():
    x = probe_set()
    u = x.view(np.uint32)
    assert x.size > 1_400_000
    assert (u == 0).any() and (u == 0x80000000).any()
    assert np.isposinf(x).any() and np.isneginf(x).any()
    nan = np.isnan(x)
    assert (nan & ~np.signbit(x)).any() and (nan & np.signbit(x)).any()
    assert len(np.unique(u[nan])) > 1000  # many payloads
    assert ((u & 0x7F800000) == 0).sum() > 10_000  # subnormals
    assert ((u & 0xFFFF) == 0x8000).sum() >= 65536  # exact BF16 ties
    for v in (448.0, 464.0, 480.0):
        assert (x == np.float32(v)).any() and (x == -np.float32(v)).any()
        assert (x == np.nextafter(np.float32(v), np.float32(np.inf))).any()
        assert (x == np.nextafter(np.float32(v), np.float32(0))).any()


# ---------------------------------------------------------------------------------------------
# the oracles themselves agree with hand-derived values (so they can fail)
# ---------------------------------------------------------------------------------------------


def test_bf16_oracle_hand_values():
    cases = {
        0x3F800000: 0x3F80,  # 1.0
        0x3F808000: 0x3F80,  # 1 + 2^-8: tie, kept half even -> down
        0x3F818000: 0x3F82,  # 1 + 3*2^-8: tie, kept half odd -> up
        0x3F808001: 0x3F81,  # just above the tie
        0x3F807FFF: 0x3F80,  # just below the tie
        0x7F7FFFFF: 0x7F80,  # FLT_MAX overflows to inf
        0x00000001: 0x0000,  # smallest FP32 subnormal rounds to +0
        0x00012345: 0x0001,  # 1e-40-ish: BF16 subnormal kept
        0x80000000: 0x8000,  # -0
        0xFFC12345: 0xFFC0,  # -NaN keeps its sign, payload dropped
    }
    got = bf16_rne_oracle(f32(list(cases)))
    assert got.tolist() == list(cases.values())


def test_fp8_table_matches_the_format():
    vals, nan = fp8_table()
    assert nan.sum() == 2 and nan[0x7F] and nan[0xFF]
    assert vals[0x7E] == 448.0 and vals[0xFE] == -448.0
    assert vals[0x01] == 2.0**-9 and vals[0x08] == 2.0**-6 and vals[0x38] == 1.0
    finite = vals[~nan]
    assert len(np.unique(finite)) == 253  # +0 and -0 compare equal
    assert np.all(np.diff(vals[:127]) > 0)


# ---------------------------------------------------------------------------------------------
# FP32 -> BF16
# ---------------------------------------------------------------------------------------------


def test_to_bf16_matches_integer_oracle_on_probe_set():
    x = probe_set()
    got = bits16(to_bf16(x))
    want = bf16_rne_oracle(x)
    bad = got != want
    assert not bad.any(), [
        (hex(a), hex(b), hex(c))
        for a, b, c in zip(x.view(np.uint32)[bad][:5], got[bad][:5], want[bad][:5], strict=True)
    ]


def test_to_bf16_matches_ml_dtypes_on_probe_set():
    x = probe_set()
    with np.errstate(invalid="ignore"):
        want = bits16(x.astype(BF16))
    assert np.array_equal(bits16(to_bf16(x)), want)


def test_to_bf16_canonical_nan_policy():
    x = probe_set()
    got = bits16(to_bf16(x, nan="canonical"))
    nan = np.isnan(x)
    assert np.all(got[nan] == 0x7FC0)
    assert np.array_equal(got[~nan], bf16_rne_oracle(x)[~nan])


@pytest.mark.parametrize("seed", [0, 1])
def test_to_bf16_random_large_set_vs_oracle(seed):
    u = np.random.default_rng(seed).integers(0, 2**32, 500_000, dtype=np.uint32)
    x = u.view(np.float32)
    assert np.array_equal(bits16(to_bf16(x)), bf16_rne_oracle(x))


def test_bf16_exhaustive_widen_and_round_back():
    u = np.arange(65536, dtype=np.uint16)
    b = u.view(BF16)
    w = widen_to_fp32(b)
    assert w.dtype == np.float32
    # widening is exact: the 16 bits move to the top of the FP32 word (NaN payloads too)
    assert np.array_equal(w.view(np.uint32), u.astype(np.uint32) << 16)
    nan = np.isnan(w)
    assert nan.sum() == 2 * 127  # exponent all ones, 127 non-zero mantissas, two signs
    back = bits16(to_bf16(w))
    assert np.array_equal(back[~nan], u[~nan])
    assert np.array_equal(back[nan], (u[nan] & 0x8000) | 0x7FC0)  # sign kept, quiet NaN
    assert np.all(bits16(to_bf16(w, nan="canonical"))[nan] == 0x7FC0)


def test_bf16_round_trip_is_widen_of_round():
    x = probe_set()[:400_000]
    got = bf16_round_trip(x)
    assert got.dtype == np.float32
    want = (bf16_rne_oracle(x).astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


# ---------------------------------------------------------------------------------------------
# FP32 -> FP8 E4M3FN
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("saturate", [True, False])
def test_to_fp8_matches_nearest_search_oracle(saturate):
    x = probe_set()
    got = bits8(to_fp8_e4m3(x, saturate=saturate))
    want = fp8_rne_oracle(x, saturate=saturate)
    bad = got != want
    assert not bad.any(), [
        (float(a), hex(b), hex(c))
        for a, b, c in zip(x[bad][:5], got[bad][:5], want[bad][:5], strict=True)
    ]


def test_to_fp8_matches_ml_dtypes():
    x = probe_set()
    with np.errstate(invalid="ignore"):
        plain = bits8(x.astype(FP8))
        clamped = bits8(np.clip(x, np.float32(-448), np.float32(448)).astype(FP8))
    assert np.array_equal(bits8(to_fp8_e4m3(x, saturate=False)), plain)
    assert np.array_equal(bits8(to_fp8_e4m3(x, saturate=True)), clamped)


OVERFLOW_CASES = [
    # value, code with saturate=True, code with saturate=False (derived from the format)
    (447.0, 0x7E, 0x7E),  # between 416 and 448, nearer 448
    (448.0, 0x7E, 0x7E),
    (449.0, 0x7E, 0x7E),
    (463.99, 0x7E, 0x7E),
    (464.0, 0x7E, 0x7E),  # tie between 448 (even) and the missing 480 -> 448
    (464.01, 0x7E, 0x7F),
    (479.99, 0x7E, 0x7F),
    (480.0, 0x7E, 0x7F),
    (481.0, 0x7E, 0x7F),
    (1e30, 0x7E, 0x7F),
    (np.inf, 0x7E, 0x7F),
    (-464.0, 0xFE, 0xFE),
    (-464.01, 0xFE, 0xFF),
    (-np.inf, 0xFE, 0xFF),
    (np.nan, 0x7F, 0x7F),
    (-np.nan, 0xFF, 0xFF),
    (2.0**-9, 0x01, 0x01),  # smallest subnormal
    (2.0**-10, 0x00, 0x00),  # tie between 0 and 2^-9 -> even 0
    (2.0**-10 * 1.0001, 0x01, 0x01),
    (-(2.0**-11), 0x80, 0x80),  # rounds to -0
    (-0.0, 0x80, 0x80),
    (0.0, 0x00, 0x00),
    (1.0625, 0x38, 0x38),  # tie between 1 (0x38) and 1.125 (0x39) -> 1
    (1.1875, 0x3A, 0x3A),  # tie between 1.125 (0x39) and 1.25 (0x3A) -> 1.25
]


@pytest.mark.parametrize(("value", "sat", "nosat"), OVERFLOW_CASES)
def test_fp8_hand_cases(value, sat, nosat):
    x = np.array([value], dtype=np.float32)
    if np.isnan(value):
        x = f32([0xFFC00000 if np.signbit(value) else 0x7FC00000])
    assert bits8(to_fp8_e4m3(x, saturate=True))[0] == sat
    assert bits8(to_fp8_e4m3(x, saturate=False))[0] == nosat
    assert fp8_rne_oracle(x, saturate=True)[0] == sat
    assert fp8_rne_oracle(x, saturate=False)[0] == nosat


def test_fp8_negative_nan_keeps_sign():
    x = f32([0xFFC00000, 0xFF800001, 0x7F800001])
    assert bits8(to_fp8_e4m3(x)).tolist() == [0xFF, 0xFF, 0x7F]


@pytest.mark.parametrize("saturate", [True, False])
def test_fp8_exhaustive_widen_and_round_back(saturate):
    codes = np.arange(256, dtype=np.uint8)
    w = widen_to_fp32(codes.view(FP8))
    vals, nan = fp8_table()
    assert np.array_equal(np.isnan(w), nan)
    assert np.array_equal(w[~nan].astype(np.float64), vals[~nan])
    assert np.array_equal(np.signbit(w), codes >= 0x80)  # -0 and -NaN keep the sign
    back = bits8(to_fp8_e4m3(w, saturate=saturate))
    assert np.array_equal(back, codes)  # every code, NaN included, comes back


def test_every_bf16_value_to_fp8_matches_oracle():
    w = np.arange(65536, dtype=np.uint16).view(BF16)
    for saturate in (True, False):
        got = bits8(to_fp8_e4m3(w, saturate=saturate))  # bf16 widens exactly first
        want = fp8_rne_oracle(widen_to_fp32(w), saturate=saturate)
        assert np.array_equal(got, want)


# ---------------------------------------------------------------------------------------------
# argument checking, shapes, no mutation
# ---------------------------------------------------------------------------------------------


def test_float64_source_is_rejected_with_the_argument_named():
    with pytest.raises(TypeError, match=r"to_bf16\(x\).*float64"):
        to_bf16(np.ones(3))
    with pytest.raises(TypeError, match=r"to_fp8_e4m3\(x\).*float64"):
        to_fp8_e4m3(np.ones(3))
    with pytest.raises(TypeError, match=r"to_bf16\(x\).*int32"):
        to_bf16(np.ones(3, np.int32))


def test_bad_policy_arguments():
    with pytest.raises(ValueError, match="nan.*'keep'.*'canonical'.*'torch'"):
        to_bf16(np.ones(2, np.float32), nan="torch")
    with pytest.raises(TypeError, match="saturate"):
        to_fp8_e4m3(np.ones(2, np.float32), saturate="yes")
    with pytest.raises(TypeError, match=r"widen_to_fp32\(x\).*float64"):
        widen_to_fp32(np.ones(2))


def test_shapes_and_dtypes_are_kept():
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
    assert to_bf16(x).shape == (2, 3, 4) and to_bf16(x).dtype == BF16
    assert to_fp8_e4m3(x).shape == (2, 3, 4) and to_fp8_e4m3(x).dtype == FP8
    assert to_bf16(np.float32(1.5)).shape == ()
    assert bits16(to_bf16(np.float32(np.nan), nan="canonical")) == 0x7FC0
    # float16 and bf16 sources widen exactly before the rounding
    h = np.array([65504.0, 2.0**-24, -1.5], np.float16)
    assert np.array_equal(bits16(to_bf16(h)), bf16_rne_oracle(h.astype(np.float32)))
    assert widen_to_fp32(np.array([-128, 127], np.int8)).tolist() == [-128.0, 127.0]


def test_inputs_not_modified():
    x = probe_set()[:100_000].copy()
    keep = x.copy()
    to_bf16(x, nan="canonical")
    to_fp8_e4m3(x, saturate=True)
    bf16_round_trip(x)
    ulp_distance(x, keep)
    assert np.array_equal(x.view(np.uint32), keep.view(np.uint32))
    b = to_bf16(x)
    bk = b.copy()
    widen_to_fp32(b)
    to_bf16(b, nan="canonical")
    assert np.array_equal(bits16(b), bits16(bk))


def test_reference_and_shared_expose_the_same_functions():
    assert to_bf16 is casts.to_bf16 and to_fp8_e4m3 is casts.to_fp8_e4m3
    assert widen_to_fp32 is casts.widen_to_fp32


# ---------------------------------------------------------------------------------------------
# ulp_distance (values computed by hand)
# ---------------------------------------------------------------------------------------------


def test_ulp_distance_hand_values_float32():
    one = np.float32(1.0)
    a = np.array([1.0, 0.0, 0.0, 2.0**-149, 3.4028235e38, 1.0, 2.0, np.nan], np.float32)
    b = np.array(
        [np.nextafter(one, np.float32(2)), -0.0, -(2.0**-149), -(2.0**-149), np.inf, 1.0,
         np.nextafter(np.float32(2.0), np.float32(0)), 1.0],
        np.float32,
    )  # fmt: skip
    assert ulp_distance(a, b).tolist() == [1, 0, 1, 2, 1, 0, 1, -1]
    # 1.0 -> 2.0 spans the 2^23 mantissa steps of one binade
    assert ulp_distance(np.float32([1.0]), np.float32([2.0])).tolist() == [2**23]


def test_ulp_distance_narrow_and_wide_types():
    b = np.array([0x3F80, 0x8001, 0x7F7F], np.uint16).view(BF16)
    c = np.array([0x3F82, 0x0001, 0x7F80], np.uint16).view(BF16)
    assert ulp_distance(b, c).tolist() == [2, 2, 1]
    p = np.array([0x7E, 0x38, 0x00], np.uint8).view(FP8)
    q = np.array([0xFE, 0x3A, 0x7F], np.uint8).view(FP8)
    assert ulp_distance(p, q).tolist() == [2 * 126, 2, -1]
    d = np.array([1.0, -np.inf])
    e = np.array([1.0 + 2.0**-52 * 3, np.inf])
    assert ulp_distance(d, e).tolist() == [3, np.iinfo(np.int64).max]
    h = np.array([1.0], np.float16)
    assert ulp_distance(h, np.array([1.0 + 2.0**-10], np.float16)).tolist() == [1]


def test_ulp_distance_rejects_bad_arguments():
    with pytest.raises(TypeError, match="ulp_distance.*float64"):
        ulp_distance(np.ones(2, np.float32), np.ones(2))
    with pytest.raises(TypeError, match=r"ulp_distance\(a\).*int8"):
        ulp_distance(np.ones(2, np.int8), np.ones(2, np.int8))
    with pytest.raises(ValueError, match=r"ulp_distance\(b\).*shape"):
        ulp_distance(np.ones(2, np.float32), np.ones(3, np.float32))


# ---------------------------------------------------------------------------------------------
# torch cross-checks (torch 2.13.0 CPU on CI)
# ---------------------------------------------------------------------------------------------


def _torch_version() -> tuple[int, int]:
    import torch

    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


@pytest.mark.torch
def test_torch_bf16_rounding_bit_exact_except_nan_bits():
    import torch

    x = probe_set()
    t = torch.from_numpy(x.copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    ours = bits16(to_bf16(x))
    nan = np.isnan(x)
    assert np.array_equal(t[~nan], ours[~nan])
    # torch drops the NaN sign; the bits depend on the kernel path (0x7FC0 scalar path,
    # 0xFFFF on the AVX2/AVX512 path of torch 2.13.0) -- only "is NaN" is portable
    assert np.all(np.isnan(t[nan].view(BF16).astype(np.float32)))


@pytest.mark.torch
def test_torch_scalar_bf16_nan_is_canonical_0x7fc0():
    import torch

    for b in NAN_BITS:
        t = torch.tensor(f32(b).item(), dtype=torch.float32)  # 0-d: the scalar c10 path
        assert t.to(torch.bfloat16).view(torch.int16).item() & 0xFFFF == 0x7FC0
        assert bits16(to_bf16(f32(b), nan="canonical")) == 0x7FC0


@pytest.mark.torch
def test_torch_bf16_exhaustive_widen_and_round_trip():
    import torch

    u = np.arange(65536, dtype=np.uint16)
    tw = torch.from_numpy(u.view(np.int16).copy()).view(torch.bfloat16).float()
    assert np.array_equal(tw.numpy().view(np.uint32), widen_to_fp32(u.view(BF16)).view(np.uint32))
    back = tw.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    nan = np.isnan(u.view(BF16).astype(np.float32))
    assert np.array_equal(back[~nan], u[~nan])
    assert np.array_equal(bits16(to_bf16(tw.numpy()))[~nan], back[~nan])


@pytest.mark.torch
def test_torch_fp8_rounding_bit_exact_including_nan():
    import torch

    x = probe_set()
    t = torch.from_numpy(x.copy()).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    # torch >= 2.12 saturates finite overflow and +-inf to +-448 (PR #178817); older eager
    # casts gave NaN, i.e. the plain ml_dtypes rule
    saturates = _torch_version() >= (2, 12)
    assert np.array_equal(t, bits8(to_fp8_e4m3(x, saturate=saturates)))


@pytest.mark.torch
def test_torch_fp8_exhaustive_widen_and_round_trip():
    import torch

    codes = np.arange(256, dtype=np.uint8)
    tw = torch.from_numpy(codes.copy()).view(torch.float8_e4m3fn).float().numpy()
    ours = widen_to_fp32(codes.view(FP8))
    nan = np.isnan(ours)
    assert np.array_equal(np.isnan(tw), nan)
    assert np.array_equal(tw[~nan].view(np.uint32), ours[~nan].view(np.uint32))
    assert np.array_equal(np.signbit(tw), np.signbit(ours))  # NaN widening keeps the sign
    back = torch.from_numpy(tw).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    assert np.array_equal(back, codes)
