"""The MSA speed paths give the plain paths' bits: every new path against the plain one.

* ``check_finite``: the raw-bit test of BF16 / FP8 E4M3FN against ``np.isfinite`` of the
  exact float32 widening, exhaustively over every bit pattern, message included.
* ``zero_unread_rows``: the integer-view masked write (and the skip when every row is read)
  against ``np.where`` on the values, for every dtype the ops pass, on strided views too.
* The indexer's ``_FAST`` (4 real rows, one BLAS thread) against its plain path (the kernel's
  16 padded rows): same scores, same selection, same trace records; rows past ``seq_len``
  poisoned on both paths.
* The decode's ``_FAST`` (each chunk gathered and widened in one pass into reused buffers)
  against its plain path (compact BF16 gather, widened per chunk) and the independent loop
  oracle: chunk widths that cut blocks, short blocks, tails, ``seeds_compat``, unread slots
  poisoned with NaN / inf on both paths.
* Each op's one switch (``_FAST``; the fast code in ``reference/_msa_indexer_fast.py`` /
  ``reference/_msa_decode_fast.py``) on every named case of the op: same bits, same records.
"""

from __future__ import annotations

import importlib

import ml_dtypes
import numpy as np
import pytest
from oracles.msa import loop_kernel
from tilesim.reference import msa_indexer, msa_indexer_scores, msa_sparse_decode
from tilesim.reference.util.msa_common import zero_unread_rows
from tilesim.shared.casts import to_bf16
from tilesim.shared.msa_decode import decode_keep_mask, decode_read_mask
from tilesim.shared.tiling import MsaTiling
from tilesim.shared.validate import check_finite

BF, E4M3 = ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn
F32 = np.float32
IDX = importlib.import_module("tilesim.reference.msa_indexer")
DEC = importlib.import_module("tilesim.reference.msa_decode")
FAST_DEC = importlib.import_module("tilesim.reference._msa_decode_fast")


def _canon(x):
    """A record value in a form ``==`` compares bit for bit (arrays by dtype, shape, bytes)."""
    if isinstance(x, dict):
        return {key: _canon(val) for key, val in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_canon(val) for val in x)
    if isinstance(x, (np.ndarray, np.generic)):
        a = np.asarray(x)
        return ("array", a.dtype.str, a.shape, a.tobytes())
    return x


def _same_records(got: list, want: list) -> None:
    assert len(got) == len(want) > 0
    for a, b in zip(got, want, strict=True):
        assert _canon(a) == _canon(b)


# ----------------------------------------------------------------------------- check_finite
@pytest.mark.parametrize("dtype, uint", [(BF, np.uint16), (E4M3, np.uint8)])
def test_check_finite_bit_test_equals_isfinite_on_every_pattern(dtype, uint):
    """Every bit pattern of the type: alone in a finite array it raises iff the float32
    widening is not finite, naming its index and value; all finite patterns pass together."""
    patterns = np.arange(np.iinfo(uint).max + 1, dtype=uint).view(dtype)
    wide = patterns.astype(F32)
    finite = np.isfinite(wide)
    assert 0 < np.count_nonzero(~finite) < patterns.size  # the oracle sees both kinds
    check_finite(patterns[finite], "x")  # every finite pattern at once: no error
    base = np.zeros((3, 7), dtype=dtype)
    for p in np.flatnonzero(~finite):
        a = base.copy()
        a[2, 5] = patterns[p]
        a[2, 6] = patterns[p]  # the first one is named
        want = f"x: expected finite values, got {float(wide[p])!r} at index [2, 5]"
        with pytest.raises(ValueError) as err:
            check_finite(a, "x")
        assert str(err.value) == want


def test_check_finite_on_strided_views_and_other_dtypes():
    k = to_bf16(np.random.default_rng(1).standard_normal((40, 16)).astype(F32))
    k[33, 4] = np.inf
    check_finite(k[:33], "idx_k")  # the rows below seq_len only
    with pytest.raises(
        ValueError, match=r"idx_k: expected finite values, got inf at index \[4, 33\]"
    ):
        check_finite(k.T, "idx_k")  # a transposed view is read through its strides
    with pytest.raises(ValueError, match=r"at index \[6, 4\]"):
        check_finite(k[3::5], "idx_k")  # rows 3, 8, .., 33: the 7th
    for dt in (np.float16, np.float32, np.float64):
        a = np.ones(5, dtype=dt)
        check_finite(a, "a")
        a[3] = -np.inf
        with pytest.raises(ValueError, match=r"a: expected finite values, got -inf at index \[3\]"):
            check_finite(a, "a")
    check_finite(np.array([1, 2], dtype=np.int32), "ints")  # integers pass


# ----------------------------------------------------------------------------- zero_unread_rows
@pytest.mark.parametrize("dtype", [BF, E4M3, np.float16, np.float32, np.float64])
@pytest.mark.parametrize("pattern", ["random", "all_read", "none_read"])
def test_zero_unread_rows_equals_where_on_the_values(dtype, pattern):
    rng = np.random.default_rng(5)
    v = rng.standard_normal((2, 3, 40, 8)).astype(F32)
    v[0, 1, 7] = np.nan  # poisoned rows, read or not
    v[1, 2, 30] = -np.inf
    v[1, 0, 3] = -0.0  # a negative zero that is read must stay -0
    v = v.astype(dtype)
    read = {
        "random": rng.random((2, 1, 40)) < 0.6,
        "all_read": np.ones((2, 1, 40), dtype=bool),
        "none_read": np.zeros((2, 1, 40), dtype=bool),
    }[pattern]
    read[1, 0, 3] = pattern != "none_read"
    want = np.where(read[..., None], v, np.zeros((), dtype=dtype))  # the values, selected
    got = v.copy()
    assert zero_unread_rows(got, read) is got
    assert got.tobytes() == want.tobytes()
    # a strided view (as the main branch passes it: keys on axis 1 of the stored array)
    store = np.ascontiguousarray(v.transpose(0, 2, 1, 3))  # [2, 40, 3, 8]
    zero_unread_rows(store.transpose(0, 2, 1, 3), read)
    assert store.transpose(0, 2, 1, 3).tobytes() == want.tobytes()


def test_zero_unread_rows_writes_nothing_when_every_row_is_read():
    v = to_bf16(np.ones((4, 8), dtype=F32))
    v.setflags(write=False)  # any write would raise
    assert zero_unread_rows(v, np.ones(4, dtype=bool)) is v
    with pytest.raises(ValueError):
        zero_unread_rows(v, np.array([True, False, True, True]))


# ----------------------------------------------------------------------------- indexer
def _indexer_inputs(nb: int, seed: int):
    rng = np.random.default_rng(seed)
    q = to_bf16(rng.standard_normal((4, 128)).astype(F32))
    k = to_bf16(rng.standard_normal((nb * 128, 128)).astype(F32))
    return q, k


@pytest.mark.parametrize("nb, tail", [(1, 128), (5, 1), (16, 64), (17, 128), (40, 127)])
@pytest.mark.parametrize("reduce", ["max", "none"])
def test_indexer_fast_equals_padded_kernel(monkeypatch, nb, tail, reduce):
    q, k = _indexer_inputs(nb, seed=nb + tail)
    seq = (nb - 1) * 128 + tail
    k[seq:] = np.nan if tail % 2 else np.inf  # rows past seq_len: never read, on both paths
    out = {}
    for fast in (False, True):
        monkeypatch.setattr(IDX, "_FAST", fast)
        recs, srecs = [], []
        ids = msa_indexer(q, k, nb, seq_len=seq, head_reduce=reduce, trace=recs.append)
        clean = k[:seq]  # the scores kernel alone, on the rows that are finite
        full = np.concatenate([clean, np.zeros((nb * 128 - seq, 128), dtype=BF)])
        scores = msa_indexer_scores(q, full, nb, trace=srecs.append)
        out[fast] = ids, recs, scores, srecs
    (ids0, r0, s0, sr0), (ids1, r1, s1, sr1) = out[False], out[True]
    assert ids1.dtype == ids0.dtype == np.int32 and ids1.tobytes() == ids0.tobytes()
    assert s1.dtype == s0.dtype == F32 and s1.shape == (4, nb * 128)
    assert s1.flags.c_contiguous and s1.tobytes() == s0.tobytes()
    _same_records(r1, r0)
    _same_records(sr1, sr0)


def test_indexer_fast_scores_are_the_correctly_rounded_dots(monkeypatch):
    """Independent oracle for the 4-row product: exact rational dot products (BF16 products
    and their sum are exact in float64 here: small exponent spread), rounded once."""
    from fractions import Fraction

    monkeypatch.setattr(IDX, "_FAST", True)
    q, k = _indexer_inputs(2, seed=9)
    s = msa_indexer_scores(q, k, 2)
    q64, k64 = q.astype(np.float64), k.astype(np.float64)
    for h, j in [(0, 0), (1, 77), (2, 128), (3, 255), (3, 3)]:
        exact = sum(Fraction(a) * Fraction(b) for a, b in zip(q64[h], k64[j], strict=True))
        assert s[h, j] == F32(float(exact))


# ----------------------------------------------------------------------------- decode
def _decode_case(rng, batch, nb, topk, *, by=128, hq=8, hkv=2, d=32):
    def r(shape):
        return to_bf16(rng.standard_normal(shape).astype(F32))

    q, k, v = r((batch, hq, d)), r((batch, hkv, nb, by, d)), r((batch, hkv, nb, by, d))
    ids = np.stack([rng.permutation(nb)[:topk] for _ in range(batch)]).astype(np.int32)
    return q, k, v, ids


def _poison_unread(k, v, ids, seq, by, value, seeds_compat):
    """NaN/inf into every K and V slot no read key uses (both paths must ignore them)."""
    read = decode_read_mask(decode_keep_mask(ids, seq, by), seeds_compat=seeds_compat)
    k, v = k.copy(), v.copy()
    topk = ids.shape[1]
    for b in range(ids.shape[0]):
        for slot in range(topk):
            for t in np.flatnonzero(~read[b, slot * by : (slot + 1) * by]):
                k[b, :, ids[b, slot], t] = value
                v[b, :, ids[b, slot], t] = value
        for blk in sorted(set(range(k.shape[2])) - set(ids[b].tolist())):
            k[b, :, blk], v[b, :, blk] = value, value  # unselected blocks
    return k, v


def _decode_paths(monkeypatch, args, tiling, seeds_compat):
    out = {}
    for fast in (False, True):
        monkeypatch.setattr(DEC, "_FAST", fast)
        recs = []
        got = msa_sparse_decode(*args, tiling=tiling, seeds_compat=seeds_compat, trace=recs.append)
        out[fast] = got, recs
    (o0, r0), (o1, r1) = out[False], out[True]
    assert o1.dtype == o0.dtype and o1.tobytes() == o0.tobytes()
    _same_records(r1, r0)
    return o1


@pytest.mark.parametrize(
    "ntile, by, topk, seeds_compat",
    [(48, 128, 3, False), (80, 128, 5, False), (512, 128, 6, False), (176, 128, 4, True),
     (48, 16, 7, False), (32, 16, 5, True), (512, 16, 9, False)],
)  # fmt: skip
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_decode_fast_equals_plain_with_unread_slots_poisoned(
    rng, monkeypatch, ntile, by, topk, seeds_compat, value
):
    """Chunks that cut blocks (ntile 48/80/176 over 128-key blocks), blocks shorter than a
    chunk (16 keys), tails kept or dropped; rows with a partial current block, a fully
    future selection and one key only. Poisoned unread slots change nothing on either path."""
    batch, nb = 4, 10
    q, k, v, ids = _decode_case(rng, batch, nb, topk, by=by)
    if nb - 1 not in ids[0]:
        ids[0, 1] = nb - 1  # row 0's partial current block is selected
    ids[3] = np.arange(nb - topk, nb)  # every selected block after the current one
    seq = np.array([nb * by - 5, 3 * by + 1, 1, 2 * by])
    tiling = MsaTiling(ntile=ntile, block_size=16)
    clean = _decode_paths(monkeypatch, (q, k, v, ids, seq), tiling, seeds_compat)
    pk, pv = _poison_unread(k, v, ids, seq, by, value, seeds_compat)
    poisoned = _decode_paths(monkeypatch, (q, pk, pv, ids, seq), tiling, seeds_compat)
    assert poisoned.tobytes() == clean.tobytes()
    assert np.isfinite(clean.astype(F32)).all()
    if by == 128:  # the independent loop oracle (one (b, h) at a time, 128-key blocks)
        want = loop_kernel(q, k, v, ids, seq, ntile=ntile, seeds_compat=seeds_compat)
        assert clean.tobytes() == np.asarray(want).tobytes()


def test_decode_widened_keys_equal_the_compact_gather(rng):
    """The one-pass gather against fancy indexing of the compact sequence, for chunk bounds
    that start and stop inside blocks."""
    q, k, v, ids = _decode_case(rng, 3, 6, 4, by=16)
    call = DEC._check(q, k, v, ids, 96, MsaTiling(ntile=16), "910b", False, None)
    bi, hi = np.arange(3)[:, None, None], np.arange(2)[None, :, None]
    compact = k[bi, hi, ids[:, None, :]].reshape(3, 2, 64, 32).astype(np.float64)
    for c0, w in [(0, 64), (5, 11), (15, 2), (16, 16), (31, 33), (63, 1)]:
        for rows in (slice(0, 3), slice(1, 2), slice(2, 3)):
            out = np.full((rows.stop - rows.start, 2, w, 32), np.nan)
            FAST_DEC.widened_keys(k, call, rows, c0, out)
            assert out.tobytes() == compact[rows, :, c0 : c0 + w].tobytes()


# ----------------------------------------------------------------------------- named cases
def _named(op: str) -> list[str]:
    from tilesim.reference.cases.msa import MSA_CASES

    return [name for name, spec in MSA_CASES.items() if spec["op"] == op]


def _both_paths(monkeypatch, mod, fn, case):
    """``fn`` on the case with the module's ``_FAST`` False then True: ``[(out, records)]``."""
    out = []
    for fast in (False, True):
        monkeypatch.setattr(mod, "_FAST", fast)
        recs = []
        res = fn(**case["inputs"], **case["params"], trace=recs.append)
        out.append((res, recs))
    return out


@pytest.mark.parametrize("name", _named("msa_indexer"))
def test_indexer_speed_path_is_bit_equal_on_every_named_case(monkeypatch, name):
    """The one switch of the indexer golden: same ids, same trace records on every named case
    (they are small: no size reduction needed), and the scores kernel alike."""
    from tilesim.reference.cases.msa import msa_make_case

    case = msa_make_case(name)
    (ids0, r0), (ids1, r1) = _both_paths(monkeypatch, IDX, msa_indexer, case)
    assert ids0.dtype == ids1.dtype == np.int32 and ids0.tobytes() == ids1.tobytes()
    _same_records(r1, r0)
    scores_case = {"inputs": case["inputs"], "params": {"nb": case["params"]["nb"]}}
    (s0, _), (s1, _) = _both_paths(monkeypatch, IDX, msa_indexer_scores, scores_case)
    assert s0.tobytes() == s1.tobytes()


@pytest.mark.parametrize("name", _named("msa_sparse_decode"))
def test_decode_speed_path_is_bit_equal_on_every_named_case(monkeypatch, name):
    """The one switch of the decode golden: same output, same trace records on every named
    case (they are small: no size reduction needed)."""
    from tilesim.reference.cases.msa import msa_make_case

    case = msa_make_case(name)
    (o0, r0), (o1, r1) = _both_paths(monkeypatch, DEC, msa_sparse_decode, case)
    assert o0.dtype == o1.dtype and o0.tobytes() == o1.tobytes()
    _same_records(r1, r0)
