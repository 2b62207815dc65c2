"""The indexer's key-cache layouts (``tilesim.shared.layouts.index_cache``) and its q / k quantizers
(``tilesim.shared.quant``: ``quantize_index_int8``, ``quantize_index_fp8``).

Oracles: the FP8 page bytes read back with ``struct`` at the documented offsets (DeepGEMM's
``kv_cache_cast_to_fp8`` layout: all codes token-major, then the scales); the quantizers
restated in float64 (an FP32 quotient is the float64 quotient rounded once; the UE8M0 scale
from ``math.log2`` / ``math.ceil`` on the float64 value)."""

from __future__ import annotations

import math
import struct

import ml_dtypes
import numpy as np
import pytest
from tilesim.shared.layouts.index_cache import (
    FP8_TOKEN_BYTES,
    check_int8_cache,
    fp8_page_bytes,
    fp8_page_views,
    fp8_scale_offset,
    pack_fp8_pages,
    pack_int8_cache,
    unpack_fp8_pages,
)
from tilesim.shared.quant import e4m3_to_fp32, quantize_index_fp8, quantize_index_int8

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)


def _fp8_fields(rng, nb=3, bs=5):
    codes = rng.integers(0, 256, size=(nb, bs, 128), dtype=np.uint8)
    codes[codes & 0x7F == 0x7F] = 0  # no NaN codes
    scales = rng.standard_normal((nb, bs)).astype(np.float32)
    return codes.view(E4M3), scales


def test_fp8_page_bytes_are_codes_then_little_endian_scales(rng):
    codes, scales = _fp8_fields(rng)
    cache = pack_fp8_pages(codes, scales)
    assert cache.dtype == np.uint8 and cache.shape == (3, 5 * 132) and FP8_TOKEN_BYTES == 132
    assert fp8_page_bytes(5) == 660 and fp8_scale_offset(5) == 640
    for b in range(3):
        page = cache[b].tobytes()
        for t in range(5):
            assert page[t * 128 : (t + 1) * 128] == codes[b, t].view(np.uint8).tobytes()
            (s,) = struct.unpack("<f", page[640 + 4 * t : 644 + 4 * t])
            assert np.float32(s) == scales[b, t]
    back = unpack_fp8_pages(cache, block_size=5)
    assert back.codes.dtype == E4M3 and back.scales.dtype == np.float32
    np.testing.assert_array_equal(back.codes.view(np.uint8), codes.view(np.uint8))
    np.testing.assert_array_equal(back.scales, scales)
    views = fp8_page_views(cache, block_size=5)  # no copy: writing a view writes the page
    assert np.shares_memory(views.codes, cache) and np.shares_memory(views.scales, cache)
    views.scales[2, 4] = 0.75
    assert struct.unpack("<f", cache[2, 640 + 16 : 644 + 16].tobytes()) == (0.75,)


def test_int8_layout_checks_and_copies(rng):
    codes = rng.integers(-128, 128, size=(2, 4, 128), dtype=np.int8)
    scales = rng.random((2, 4)).astype(np.float16)
    kc, ks = pack_int8_cache(codes, scales)
    assert kc is not codes and np.array_equal(kc, codes) and np.array_equal(ks, scales)
    assert check_int8_cache(kc, ks, block_size=4) == (2, 4)
    with pytest.raises(ValueError, match="k_scale"):
        check_int8_cache(kc, ks[:, :3], block_size=4)
    with pytest.raises(TypeError, match="k_scale"):
        check_int8_cache(kc, ks.astype(np.float32), block_size=4)
    with pytest.raises(ValueError, match="k_cache"):
        unpack_fp8_pages(np.zeros((2, 100), np.uint8), block_size=4)


def test_e4m3_widening_covers_every_code():
    codes = np.arange(256, dtype=np.uint8)
    with np.errstate(invalid="ignore"):
        want = codes.view(E4M3).astype(np.float64)
    got = e4m3_to_fp32(codes)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    assert np.array_equal(got[ok].astype(np.float64), want[ok])


def _vectors(rng):
    x = rng.standard_normal((40, 128)).astype(np.float32)
    x[0] = 0.0  # the floor
    x[1] *= 1e-5
    x[2] *= 3000.0
    x[3, 7] = 50.0  # one outlier
    x[4] = -1.0
    return x


def test_int8_quantizer_equals_float64_restatement(rng):
    x = _vectors(rng)
    codes, scales = quantize_index_int8(x)
    assert codes.dtype == np.int8 and scales.dtype == np.float16 and scales.shape == (40,)
    for i in range(40):
        amax = max(float(np.abs(x[i]).max()), float(np.float32(1e-8)))
        inv = np.float32(127.0 / amax)  # FP32 quotient = float64 quotient rounded once
        prod = [float(np.float32(float(v) * float(inv))) for v in x[i]]  # FP32 products
        want = [min(127, max(-127, round(v))) for v in prod]  # Python round: half to even
        assert codes[i].tolist() == want, i
        assert scales[i] == np.float16(np.float32(amax / 127.0))
    assert (codes[0] == 0).all() and np.abs(codes[1:]).max(axis=1).min() == 127
    with pytest.raises(ValueError, match="amax_floor > 0"):
        quantize_index_int8(x, amax_floor=0.0)
    c2, _ = quantize_index_int8(x[1:], amax_floor=0.0)  # pypto-gym's floor-less rule
    np.testing.assert_array_equal(c2, codes[1:])


@pytest.mark.parametrize("ue8m0", [False, True])
def test_fp8_quantizer_equals_float64_restatement(rng, ue8m0):
    x = _vectors(rng)
    codes, scales = quantize_index_fp8(x, ue8m0=ue8m0)
    assert codes.dtype == E4M3 and scales.dtype == np.float32
    for i in range(40):
        amax = max(float(np.abs(x[i]).max()), float(np.float32(1e-4)))
        s = float(np.float32(amax / 448.0))
        if ue8m0:
            s = 2.0 ** math.ceil(math.log2(s))
        assert scales[i] == np.float32(s), i
        q = np.clip(np.float32(x[i].astype(np.float64) / s), -448, 448).astype(E4M3)
        assert np.array_equal(codes[i].view(np.uint8), q.view(np.uint8)), i
    if ue8m0:
        m, _ = np.frexp(scales)
        assert (m == 0.5).all()  # powers of two


def test_quantizer_arguments_are_checked():
    x = np.zeros((2, 128), np.float32)
    with pytest.raises(ValueError, match=r"\[..., 128\]"):
        quantize_index_int8(np.zeros((2, 64), np.float32))
    with pytest.raises(ValueError, match="finite"):
        quantize_index_fp8(np.full((1, 128), np.nan, np.float32))
    with pytest.raises(ValueError, match="amax_floor"):
        quantize_index_fp8(x, amax_floor=0.0)
    with pytest.raises(TypeError, match="ue8m0"):
        quantize_index_fp8(x, ue8m0=1)
    with pytest.raises(TypeError):
        quantize_index_int8(x.astype(np.float64))


@pytest.mark.parametrize("form", ["fortran", "column_strided"])
def test_unpack_fp8_pages_reads_any_layout(form):
    """A Fortran-ordered or column-strided page array unpacks to the same codes and scales,
    bit for bit, as its contiguous copy; ``fp8_page_views``, which promises views, refuses
    a non-contiguous last axis naming ``pages``."""
    from tilesim.shared.layouts.index_cache import fp8_page_views, unpack_fp8_pages

    g = np.random.default_rng(5)
    bs = 4
    pages = g.integers(0, 256, (3, bs * 132 * (2 if form == "column_strided" else 1)))
    pages = pages.astype(np.uint8)
    view = np.asfortranarray(pages) if form == "fortran" else pages[:, ::2]
    want = unpack_fp8_pages(np.ascontiguousarray(view), block_size=bs)
    got = unpack_fp8_pages(view, block_size=bs)
    assert np.array_equal(got.codes.view(np.uint8), want.codes.view(np.uint8))
    assert np.array_equal(got.scales.view(np.uint32), want.scales.view(np.uint32))
    with pytest.raises(ValueError, match="^pages: expected a contiguous last axis"):
        fp8_page_views(view, block_size=bs)


@pytest.mark.parametrize("bs", [True, 1.0, "1"])
def test_int8_cache_block_size_is_an_int(bs):
    """``block_size`` of the INT8 cache check is an int (bool, float and str refused with
    ``TypeError`` naming it), as every other int argument."""
    from tilesim.shared.layouts.index_cache import check_int8_cache

    k = np.zeros((2, 1, 128), np.int8)
    with pytest.raises(TypeError, match="^block_size: expected an int"):
        check_int8_cache(k, np.zeros((2, 1), np.float16), block_size=bs)


def test_pack_int8_cache_names_its_own_arguments():
    """A wrong ``scales`` dtype or shape is reported under ``scales`` (the packer's
    argument), not under the cache check's ``k_scale``."""
    from tilesim.shared.layouts.index_cache import pack_int8_cache

    codes = np.zeros((2, 4, 128), np.int8)
    with pytest.raises(TypeError, match="^scales:"):
        pack_int8_cache(codes, np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match="^scales:"):
        pack_int8_cache(codes, np.zeros((2, 3), np.float16))
