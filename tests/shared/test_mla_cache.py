"""DeepSeek-V3.2 MLA cache rows: PyPTO packed, FlashMLA packed and kv_split layouts.

Expected bytes are built independently with ``struct`` (little-endian) from the field bit
patterns, never with the code under test.
"""

from __future__ import annotations

import struct

import ml_dtypes
import numpy as np
import pytest
from tilesim.shared import (
    FLASHMLA_ROW_BYTES,
    PYPTO_ROW_BYTES,
    PYPTO_UB_PITCH,
    MlaCacheRows,
    convert_cache_layout,
    pack_flashmla_rows,
    pack_kv_split,
    pack_pypto_rows,
    unpack_flashmla_rows,
    unpack_kv_split,
    unpack_pypto_rows,
)
from tilesim.shared.layouts.mla_cache import pack_rows, unpack_rows

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)


def fields(rows: int = 9, seed: int = 0, qdtype=FP8) -> MlaCacheRows:
    """Arbitrary bit patterns (NaN payloads, -0, subnormals included) in every field."""
    rng = np.random.default_rng(seed)
    nope = rng.integers(0, 256, (rows, 512), dtype=np.uint8).view(qdtype)
    rope = rng.integers(0, 2**16, (rows, 64), dtype=np.uint16).view(BF16)
    sbits = rng.integers(0, 2**32, (rows, 4), dtype=np.uint32)
    sbits[0, :] = [0x7FC12345, 0xFF800001, 0x80000000, 0x00000001]  # NaN payloads, -0, subnormal
    return MlaCacheRows(nope, rope, sbits.view(np.float32))


def expected_row(f: MlaCacheRows, r: int, order: tuple[str, ...]) -> bytes:
    parts = {
        "nope": bytes(f.nope.view(np.uint8)[r].tolist()),
        "rope": struct.pack("<64H", *f.rope.view(np.uint16)[r].tolist()),
        "scales": struct.pack("<4I", *f.scales.view(np.uint32)[r].tolist()),
    }
    return b"".join(parts[k] for k in order)


def same_bits(a: MlaCacheRows, b: MlaCacheRows) -> bool:
    return (
        a.nope.dtype == b.nope.dtype
        and np.array_equal(a.nope.view(np.uint8), b.nope.view(np.uint8))
        and np.array_equal(a.rope.view(np.uint16), b.rope.view(np.uint16))
        and np.array_equal(a.scales.view(np.uint32), b.scales.view(np.uint32))
    )


def test_row_size_constants():
    assert PYPTO_ROW_BYTES == 656 == 512 + 64 * 2 + 4 * 4
    assert FLASHMLA_ROW_BYTES == 656
    assert PYPTO_UB_PITCH == 672 and PYPTO_UB_PITCH % 32 == 0 and PYPTO_UB_PITCH - 656 < 32


@pytest.mark.parametrize("qdtype", [FP8, np.dtype(np.int8)])
def test_pypto_bytes_at_their_offsets(qdtype):
    f = fields(qdtype=qdtype)
    cache = pack_pypto_rows(*f)
    assert cache.shape == (9, 656) and cache.dtype == qdtype
    raw = cache.view(np.uint8)
    for r in range(9):
        assert raw[r].tobytes() == expected_row(f, r, ("nope", "rope", "scales"))
    # spot checks of specific bytes: rope element 0 at 512..513 little-endian, scale 0 at 640
    r0 = f.rope.view(np.uint16)[3, 0]
    assert raw[3, 512] == r0 & 0xFF and raw[3, 513] == r0 >> 8
    assert raw[0, 640:644].tobytes() == bytes([0x45, 0x23, 0xC1, 0x7F])  # 0x7FC12345
    assert np.frombuffer(raw[5, 640:656].tobytes(), "<f4").view("<u4").tolist() == (
        f.scales.view(np.uint32)[5].tolist()
    )
    assert np.frombuffer(raw[5, 512:640].tobytes(), "<u2").tolist() == (
        f.rope.view(np.uint16)[5].tolist()
    )


def test_flashmla_bytes_at_their_offsets():
    f = fields(seed=1)
    cache = pack_flashmla_rows(*f)
    raw = cache.view(np.uint8)
    for r in range(9):
        assert raw[r].tobytes() == expected_row(f, r, ("nope", "scales", "rope"))
    assert raw[0, 512:516].tobytes() == bytes([0x45, 0x23, 0xC1, 0x7F])  # scale 0 at 512
    assert raw[0, 524:528].tobytes() == bytes([0x01, 0x00, 0x00, 0x00])  # scale 3 at 524
    assert np.frombuffer(raw[2, 528:656].tobytes(), "<u2").tolist() == (
        f.rope.view(np.uint16)[2].tolist()
    )


@pytest.mark.parametrize("layout", ["pypto", "flashmla"])
@pytest.mark.parametrize("qdtype", [FP8, np.dtype(np.int8)])
def test_pack_unpack_round_trip_is_bit_exact(layout, qdtype):
    f = fields(rows=33, seed=2, qdtype=qdtype)
    cache = pack_rows(*f, layout=layout)
    back = unpack_rows(cache, layout)
    assert isinstance(back, MlaCacheRows) and same_bits(back, f)
    assert back.rope.dtype == BF16 and back.scales.dtype == np.float32
    for a in back:
        assert a.flags.c_contiguous and not np.shares_memory(a, cache)
    # a cache handed over as raw uint8 bytes decodes the nope as FP8
    if qdtype == FP8:
        assert same_bits(unpack_rows(cache.view(np.uint8), layout), f)


def test_named_wrappers_equal_the_generic_ones():
    f = fields(seed=3)
    assert np.array_equal(pack_pypto_rows(*f).view(np.uint8), pack_rows(*f, "pypto").view(np.uint8))
    fm = pack_flashmla_rows(*f)
    assert np.array_equal(fm.view(np.uint8), pack_rows(*f, "flashmla").view(np.uint8))
    assert same_bits(unpack_pypto_rows(pack_pypto_rows(*f)), f)
    assert same_bits(unpack_flashmla_rows(fm), f)


def test_layouts_differ_only_by_field_order():
    f = fields(seed=4)
    p = pack_pypto_rows(*f).view(np.uint8)
    m = pack_flashmla_rows(*f).view(np.uint8)
    assert np.array_equal(p[:, :512], m[:, :512])
    assert np.array_equal(p[:, 512:640], m[:, 528:656])
    assert np.array_equal(p[:, 640:656], m[:, 512:528])


def test_convert_between_layouts():
    f = fields(seed=5)
    p = pack_pypto_rows(*f)
    m = convert_cache_layout(p, src="pypto", dst="flashmla")
    assert np.array_equal(m.view(np.uint8), pack_flashmla_rows(*f).view(np.uint8))
    back = convert_cache_layout(m, src="flashmla", dst="pypto")
    assert np.array_equal(back.view(np.uint8), p.view(np.uint8)) and back.dtype == p.dtype
    same = convert_cache_layout(p, src="pypto", dst="pypto")
    assert np.array_equal(same.view(np.uint8), p.view(np.uint8)) and not np.shares_memory(same, p)
    with pytest.raises(ValueError, match="dst.*'pypto', 'flashmla'.*'fp8_ds_mla'"):
        convert_cache_layout(p, src="pypto", dst="fp8_ds_mla")
    with pytest.raises(ValueError, match="src"):
        convert_cache_layout(p, src="split", dst="pypto")


def test_kv_split_round_trip_and_copies():
    f = fields(seed=6)
    kn, kr, ks = pack_kv_split(*f)
    assert (kn.shape, kr.shape, ks.shape) == ((9, 512), (9, 64), (9, 4))
    assert (kn.dtype, kr.dtype, ks.dtype) == (FP8, BF16, np.dtype(np.float32))
    for new, old in zip((kn, kr, ks), f, strict=True):
        assert not np.shares_memory(new, old) and new.flags.c_contiguous
    assert same_bits(unpack_kv_split(kn, kr, ks), f)
    # the split triple carries the same bytes as the packed rows
    p = pack_pypto_rows(*f).view(np.uint8)
    assert np.array_equal(p[:, 512:640], kr.view(np.uint8).reshape(9, 128))
    assert np.array_equal(p[:, 640:656], ks.view(np.uint8).reshape(9, 16))


def test_non_contiguous_fields_pack_correctly():
    big = fields(rows=18, seed=7)
    f = MlaCacheRows(big.nope[::2], big.rope[::2], big.scales[::2])
    contiguous = MlaCacheRows(*(np.ascontiguousarray(a) for a in f))
    assert np.array_equal(
        pack_pypto_rows(*f).view(np.uint8), pack_pypto_rows(*contiguous).view(np.uint8)
    )
    cache = pack_flashmla_rows(*big)[1::2]
    assert same_bits(unpack_flashmla_rows(cache), MlaCacheRows(*(a[1::2] for a in big)))


def test_inputs_not_modified():
    f = fields(seed=8)
    keep = MlaCacheRows(*(a.copy() for a in f))
    cache = pack_pypto_rows(*f)
    ck = cache.copy()
    pack_flashmla_rows(*f)
    pack_kv_split(*f)
    unpack_kv_split(*f)
    unpack_pypto_rows(cache)
    convert_cache_layout(cache, src="pypto", dst="flashmla")
    assert same_bits(f, keep)
    assert np.array_equal(cache.view(np.uint8), ck.view(np.uint8))


@pytest.mark.parametrize(
    ("change", "exc", "pattern"),
    [
        (
            {"nope": np.zeros((9, 512), np.float32)},
            TypeError,
            "nope: expected dtype float8_e4m3fn or int8, got float32",
        ),
        ({"nope": np.zeros((9, 256), np.int8)}, ValueError, r"nope: expected shape \[rows, 512\]"),
        (
            {"rope": np.zeros((9, 64), np.float16)},
            TypeError,
            "rope: expected dtype bfloat16, got float16",
        ),
        ({"rope": np.zeros((8, 64), BF16)}, ValueError, r"rope: expected shape \(9, 64\)"),
        ({"scales": np.zeros((9, 4))}, TypeError, "scales: expected dtype float32, got float64"),
        ({"scales": np.zeros((9, 3), np.float32)}, ValueError, r"scales: expected shape \(9, 4\)"),
    ],
)
def test_bad_fields_name_the_argument(change, exc, pattern):
    f = fields()._replace(**change)
    for pack in (pack_pypto_rows, pack_flashmla_rows, pack_kv_split):
        with pytest.raises(exc, match=pattern):
            pack(*f)


def test_bad_cache_names_the_argument():
    with pytest.raises(ValueError, match=r"cache: expected shape \[rows, 656\].*\(4, 672\)"):
        unpack_pypto_rows(np.zeros((4, 672), np.int8))
    with pytest.raises(
        TypeError, match="cache: expected dtype float8_e4m3fn or int8 or uint8, got float32"
    ):
        unpack_flashmla_rows(np.zeros((4, 656), np.float32))
    with pytest.raises(ValueError, match="layout"):
        unpack_rows(np.zeros((4, 656), np.int8), "paged")
    with pytest.raises(ValueError, match="layout"):
        pack_rows(*fields(), layout="paged")


@pytest.mark.parametrize("layout", ["pypto", "flashmla"])
def test_the_field_offset_tables_locate_the_packed_fields(layout):
    """``FIELD_BYTES`` / ``LAYOUT_OFFSETS`` (read by the kernel and the CLI) against bytes
    written here with ``struct``: rope element 0 = BF16 1.5 (0x3FC0), scale 0 = FP32 2.0."""
    from tilesim.shared.layouts.mla_cache import FIELD_BYTES, LAYOUT_OFFSETS

    nope = np.zeros((1, 512), dtype=FP8)
    rope = np.zeros((1, 64), dtype=BF16)
    rope[0, 0] = 1.5
    scales = np.zeros((1, 4), dtype=np.float32)
    scales[0, 0] = 2.0
    row = pack_rows(nope, rope, scales, layout).view(np.uint8)[0].tobytes()
    rope_off, scale_off = LAYOUT_OFFSETS[layout]
    assert row[rope_off : rope_off + 2] == struct.pack("<H", 0x3FC0)
    assert row[scale_off : scale_off + 4] == struct.pack("<f", 2.0)
    spans = sorted(FIELD_BYTES[layout].values())
    assert spans[0][0] == 0 and spans[-1][1] == PYPTO_ROW_BYTES
    assert all(a[1] == b[0] for a, b in zip(spans[:-1], spans[1:], strict=True))  # no gap
    assert FIELD_BYTES[layout]["rope"][0] == rope_off
