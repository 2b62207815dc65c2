"""MSA block-sparse decode: oracles, kernel-loop equivalence, the seeds' cases, edge cases.

Oracles (``tests/oracles/msa.py``, with the error budget's derivation):
* ``dense_oracle`` — float64 softmax attention over the gathered keys whose token position
  ``block*128 + t`` is ``< seq_len`` (the mask rule restated by position), no chunks.
* ``loop_kernel`` — the kernel written the plain way: one (batch row, KV head) at a time,
  Python loops over chunks and K steps. The op batches (b, h) and must equal it bit for bit.
"""

from __future__ import annotations

import importlib

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles.msa import assert_in_budget, dense_oracle, loop_kernel
from tilesim.reference import msa_make_case, msa_sparse_decode
from tilesim.reference.msa_decode import msa_sparse_decode_flop
from tilesim.shared.casts import to_bf16
from tilesim.shared.tiling import MsaTiling
from tilesim.shared.trace import check_record

BF = ml_dtypes.bfloat16
BY = 128
F32, F64 = np.float32, np.float64


def make(rng, batch, nb, topk, *, hq=64, hkv=4, d=128, scale=1.0, ids=None):
    def r(shape):
        return to_bf16((rng.standard_normal(shape) * scale).astype(F32))

    q = r((batch, hq, d))
    k = r((batch, hkv, nb, BY, d))
    v = r((batch, hkv, nb, BY, d))
    if ids is None:
        ids = np.stack([rng.permutation(nb)[:topk] for _ in range(batch)]).astype(np.int32)
    return q, k, v, np.asarray(ids)


def put(ids, b, slot, blk):
    """Place block ``blk`` in ``ids[b, slot]`` keeping the row unique (swap if present)."""
    row = ids[b]
    where = np.flatnonzero(row == blk)
    if where.size:
        row[where[0]] = row[slot]
    row[slot] = blk


T512 = MsaTiling(ntile=512)


# ----------------------------------------------------------------------------- oracles
def test_matches_float64_oracle_within_budget(rng):
    nb = 20
    q, k, v, ids = make(rng, 3, nb, 16)
    put(ids, 1, 3, 19)  # the current block of row 1 (seq 19*128+5) sits in slot 3
    seq = np.array([nb * BY, 19 * BY + 5, 1000])  # row 2: blocks > 7 fully masked
    out = msa_sparse_decode(q, k, v, ids, seq, tiling=T512)
    assert out.dtype == BF and out.shape == q.shape
    ref, amag, vis = dense_oracle(q, k, v, ids, seq)
    assert vis.all()
    worst = assert_in_budget(out, ref, amag)
    print(f"decode: worst error {worst:.3f} x budget")
    assert worst > 0.05  # the budget is tight: the observed error uses a good part of it


def test_batched_equals_per_head_loop_bitwise(rng):
    nb = 9
    q, k, v, ids = make(rng, 3, nb, 6)  # 768 keys: one full 512 chunk + a 256-key tail
    ids[2] = [8, 7, 6, 5, 4, 3]
    seq = np.array([nb * BY, 5 * BY + 77, 2 * BY])  # row 2: every selected block masked
    for ntile, compat in ((512, False), (256, False), (128, False), (512, True)):
        got = msa_sparse_decode(
            q, k, v, ids, seq, tiling=MsaTiling(ntile=ntile), seeds_compat=compat
        )
        want = loop_kernel(q, k, v, ids, seq, ntile=ntile, seeds_compat=compat)
        assert got.tobytes() == want.tobytes(), (ntile, compat)


def test_reduced_heads_and_other_group_sizes(rng):
    q, k, v, ids = make(rng, 2, 6, 4, hq=8, hkv=2, d=64)
    seq = np.array([6 * BY - 3, 3 * BY + 1])
    got = msa_sparse_decode(q, k, v, ids, seq, tiling=MsaTiling(ntile=256))
    assert got.tobytes() == loop_kernel(q, k, v, ids, seq, ntile=256).tobytes()
    ref, amag, _ = dense_oracle(q, k, v, ids, seq)
    assert_in_budget(got, ref, amag)


@pytest.mark.parametrize("ntile", [128, 256, 512, 2048])
def test_chunk_width_changes_bits_not_accuracy(rng, ntile):
    q, k, v, ids = make(rng, 2, 18, 16)
    seq = 18 * BY - 50
    put(ids, 0, 0, 17)
    put(ids, 1, 0, 17)
    out = msa_sparse_decode(q, k, v, ids, seq, tiling=MsaTiling(ntile=ntile))
    ref, amag, _ = dense_oracle(q, k, v, ids, seq)
    assert_in_budget(out, ref, amag)


# ----------------------------------------------------------------------------- seeds' cases
@pytest.mark.parametrize("name", ["msa_decode_e2e_nb17", "msa_decode_partial_nb17"])
def test_seed_cases(name):
    from tilesim.reference import msa_indexer

    case = msa_make_case(name)
    inp, prm = case["inputs"], case["params"]
    # the ids came from the indexer: recheck them against a brute-force selection
    for b, call in enumerate(case["meta"]["indexer"]):
        sc = call["idx_q"].astype(F64) @ call["idx_k"].astype(F64).T
        sc[:, call["seq_len"] :] = -np.inf
        nb = call["nb"]
        bs = sc.reshape(4, nb, BY).max(axis=(0, 2))
        ref_ids = sorted(range(nb - 1), key=lambda j: (-bs[j], j))[:15] + [nb - 1]
        assert set(inp["block_ids"][b].tolist()) == set(ref_ids)
        assert msa_indexer(**call)[0].tolist() == ref_ids
    out = msa_sparse_decode(**inp, **prm)
    ref, amag, _ = dense_oracle(
        inp["q"], inp["k_blocks"], inp["v_blocks"], inp["block_ids"], prm["seq_len"]
    )
    assert np.max(np.abs(out.astype(F64) - ref)) < case["tolerance"]["atol"]  # the seeds' rule
    assert_in_budget(out, ref, amag)


# ----------------------------------------------------------------------------- beyond the seed
def test_tail_chunk_is_processed_seeds_compat_drops_it(rng):
    nb = 8
    q, k, v, ids = make(rng, 2, nb, 5)  # 640 keys = 512 + a 128-key tail
    seq = nb * BY
    full = msa_sparse_decode(q, k, v, ids, seq, tiling=T512)
    seeds = msa_sparse_decode(q, k, v, ids, seq, tiling=T512, seeds_compat=True)
    ref_all, a_all, _ = dense_oracle(q, k, v, ids, seq)
    ref_head, a_head, _ = dense_oracle(q, k, v, ids[:, :4], seq)  # what the seeds attend to
    assert_in_budget(full, ref_all, a_all)
    assert_in_budget(seeds, ref_head, a_head)
    diff = np.abs(full.astype(F64) - seeds.astype(F64))
    assert diff.max() > 0.05  # dropping 128 of 640 keys is visible
    # fewer keys than one chunk: tilesim runs the partial chunk, the seeds' kernel cannot
    out3 = msa_sparse_decode(q, k, v, ids[:, :3], seq, tiling=T512)
    r3, a3, _ = dense_oracle(q, k, v, ids[:, :3], seq)
    assert_in_budget(out3, r3, a3)
    with pytest.raises(ValueError, match="seeds_compat"):
        msa_sparse_decode(q, k, v, ids[:, :3], seq, tiling=T512, seeds_compat=True)


def test_fully_masked_row_returns_zeros(rng):
    nb = 10
    q, k, v, ids = make(rng, 2, nb, 4)
    ids[1] = [9, 8, 7, 6]
    seq = np.array([nb * BY, 3 * BY])  # row 1 selected only future blocks
    out = msa_sparse_decode(q, k, v, ids, seq, tiling=T512)
    assert not out[1].astype(F32).any()
    alone = msa_sparse_decode(q[:1], k[:1], v[:1], ids[:1], seq[:1], tiling=T512)
    assert out[0].tobytes() == alone[0].tobytes()  # other rows unaffected
    # the seeds' arithmetic: every score -3e38, P = 1, so the mean of the gathered V
    kernel = msa_sparse_decode(q, k, v, ids, seq, tiling=T512, seeds_compat=True)
    mean_v = v[1][:, ids[1]].astype(F64).reshape(4, -1, 128).mean(axis=1)  # [HKV, D]
    expect = np.repeat(mean_v, 16, axis=0)
    np.testing.assert_allclose(kernel[1].astype(F64), expect, rtol=2**-8, atol=1e-6)
    assert np.abs(expect).max() > 0.01


def test_per_row_seq_len_equals_separate_calls(rng):
    nb = 12
    q, k, v, ids = make(rng, 3, nb, 8)
    seq = np.array([nb * BY, 7 * BY + 1, 9 * BY + 64])
    put(ids, 1, 0, 7)
    put(ids, 2, 5, 9)
    together = msa_sparse_decode(q, k, v, ids, seq, tiling=T512)
    same = msa_sparse_decode(q, k, v, ids, np.full(3, 9 * BY + 64), tiling=T512)
    assert (
        same.tobytes()
        == msa_sparse_decode(q, k, v, ids, np.int64(9 * BY + 64), tiling=T512).tobytes()
    )
    assert (
        same.tobytes()
        == msa_sparse_decode(q, k, v, ids, np.array(9 * BY + 64), tiling=T512).tobytes()
    )
    for b in range(3):
        one = msa_sparse_decode(
            q[b : b + 1], k[b : b + 1], v[b : b + 1], ids[b : b + 1], int(seq[b]), tiling=T512
        )
        assert together[b].tobytes() == one[0].tobytes()
    # the mask rule: the current block keeps exactly its first seq_len - 128*cur tokens
    v2 = v.copy()
    v2[1, :, 7, 1:] = to_bf16(np.full((4, BY - 1, 128), 1e4, F32))  # invisible tokens of blk 7
    k2 = k.copy()
    k2[1, :, 7, 1:] = to_bf16(np.full((4, BY - 1, 128), 50.0, F32))
    again = msa_sparse_decode(q, k2, v2, ids, seq, tiling=T512)
    assert again.tobytes() == together.tobytes()


def test_ntile_env_is_read_at_call_time(rng, monkeypatch):
    q, k, v, ids = make(rng, 1, 6, 4)
    recs = []
    monkeypatch.setenv("MSA_NTILE", "128")
    a = msa_sparse_decode(q, k, v, ids, 6 * BY, trace=recs.append)
    assert len(recs) == 4 * 4  # 4 KV heads x (512 keys / 128)
    assert (
        a.tobytes()
        == msa_sparse_decode(q, k, v, ids, 6 * BY, tiling=MsaTiling(ntile=128)).tobytes()
    )
    monkeypatch.setenv("MSA_NTILE", "512")
    recs.clear()
    msa_sparse_decode(q, k, v, ids, 6 * BY, trace=recs.append)
    assert len(recs) == 4


def test_trace_records(rng):
    nb = 9
    q, k, v, ids = make(rng, 2, nb, 6)
    seq = np.array([nb * BY, 4 * BY + 3])
    put(ids, 1, 2, 4)
    recs = []
    msa_sparse_decode(q, k, v, ids, seq, tiling=T512, trace=recs.append)
    assert len(recs) == 2 * 4 * 2
    order = [(r["lane"]["batch"], r["lane"]["kv_head"], r["step"]) for r in recs]
    assert order == [(b, h, c) for b in range(2) for h in range(4) for c in range(2)]
    for r in recs:
        check_record(r)
        assert r["op"] == "msa_sparse_decode" and set(r["lane"]) == {"batch", "kv_head"}
        assert r["key_range"] == ((0, 512) if r["step"] == 0 else (512, 768))
        assert r["row_max"].shape == (16,) and r["row_sum"].shape == (16,)
        width = r["key_range"][1] - r["key_range"][0]
        assert r["flop"] == 2 * 2 * 16 * width * 128  # Q K^T and P V of one KV head's group
        # kept keys, by position: key t of slot j is block ids[b, j], token t
        b = r["lane"]["batch"]
        pos = (ids[b][:, None] * BY + np.arange(BY)).reshape(-1)[slice(*r["key_range"])]
        assert r["keys_used"] == int((pos < seq[b]).sum())
        assert r["extra"] == {}
    assert sum(r["flop"] for r in recs) == msa_sparse_decode_flop(2, 64, 6 * BY, 128)
    # merged statistics agree with the float64 softmax denominator of the oracle
    for b in range(2):
        pos = (ids[b][:, None] * BY + np.arange(BY)).reshape(-1)
        vis = pos < seq[b]
        for h in range(4):
            kk = k[b, h][ids[b]].reshape(-1, 128).astype(F64)
            s = q[b, h * 16 : (h + 1) * 16].astype(F64) @ kk.T / np.sqrt(128)
            s = np.where(vis, s, -np.inf)
            mx = s.max(axis=1)
            den = np.exp(s - mx[:, None]).sum(axis=1)
            rs = [r for r in recs if r["lane"] == {"batch": b, "kv_head": h}]
            m_all = np.max([r["row_max"] for r in rs], axis=0).astype(F64)
            np.testing.assert_allclose(m_all, mx, rtol=1e-6, atol=1e-6)
            tot = sum(np.exp(r["row_max"].astype(F64) - m_all) * r["row_sum"] for r in rs)
            np.testing.assert_allclose(tot, den, rtol=1e-5)


# ----------------------------------------------------------------------------- contract
@pytest.mark.torch
def test_torch_in_torch_out(rng):
    import torch
    from tilesim.shared.interop import to_torch

    q, k, v, ids = make(rng, 2, 5, 4)
    out = msa_sparse_decode(
        to_torch(q),
        to_torch(k),
        to_torch(v),
        torch.from_numpy(ids),
        torch.tensor([5 * BY, 3 * BY]),
        tiling=T512,
    )
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    ref = msa_sparse_decode(q, k, v, ids, np.array([5 * BY, 3 * BY]), tiling=T512)
    assert out.view(torch.int16).numpy().tobytes() == ref.tobytes()


def test_inputs_unmodified_and_deterministic(rng):
    q, k, v, ids = make(rng, 2, 6, 5)
    seq = np.array([6 * BY, 2 * BY + 9])
    before = [x.copy() for x in (q, k, v, ids, seq)]
    a = msa_sparse_decode(q, k, v, ids, seq, tiling=T512)
    b = msa_sparse_decode(q, k, v, ids, seq, tiling=T512)
    assert a.tobytes() == b.tobytes()
    for x, y in zip((q, k, v, ids, seq), before, strict=True):
        assert x.tobytes() == y.tobytes()


def _bad(q, k, v, ids, seq):
    return [
        ((q.astype(F32), k, v, ids, seq), TypeError, "q: expected dtype bfloat16"),
        ((q, k.astype(np.float16), v, ids, seq), TypeError, "k_blocks: expected dtype"),
        ((q, k, v.astype(F32), ids, seq), TypeError, "v_blocks: expected dtype"),
        ((q[0], k, v, ids, seq), ValueError, "q: expected a 3-D"),
        ((q, k[:, :, :, :, :64], v, ids, seq), ValueError, "k_blocks: expected shape"),
        ((q[:, :62], k, v, ids, seq), ValueError, "HQ a multiple"),
        ((q, k, v[:, :, :5], ids, seq), ValueError, "v_blocks: expected the shape"),
        ((q, k, v, ids.astype(F32), seq), TypeError, "block_ids: expected an integer"),
        ((q, k, v, ids[0], seq), ValueError, "block_ids: expected a 2-D"),
        ((q, k, v, ids[:1], seq), ValueError, "block_ids: expected shape"),
        ((q, k, v, ids + 6, seq), ValueError, r"block_ids: expected ids in \[0, nb=6\)"),
        ((q, k, v, ids - 6, seq), ValueError, "block_ids: expected ids in"),
        ((q, k, v, np.array([[0, 1, 1], [2, 3, 4]]), seq), ValueError, "unique ids per row, row 0"),
        ((q, k, v, ids, 0), ValueError, "seq_len: expected 1 <= seq_len <= nb"),
        ((q, k, v, ids, 6 * BY + 1), ValueError, "seq_len"),
        ((q, k, v, ids, np.array([700, -1])), ValueError, "batch row 1"),
        ((q, k, v, ids, np.array([700])), ValueError, r"seq_len: expected one int or shape \(2,"),
        ((q, k, v, ids, np.array([700.0, 1.0])), TypeError, "seq_len: expected an integer"),
        ((q, k, v, ids, [700, 700]), TypeError, "seq_len: expected an int or an integer array"),
        ((q, k, v, ids, 700.0), TypeError, "seq_len"),
        ((q, k, v, ids, True), TypeError, "seq_len"),
        ((q.tolist(), k, v, ids, seq), TypeError, "q: expected a numpy array"),
        ((q, k, v, ids.tolist(), seq), TypeError, "block_ids: expected a numpy array"),
    ]


def test_bad_inputs(rng):
    q, k, v, ids = make(rng, 2, 6, 3)
    seq = 6 * BY
    for args, exc, msg in _bad(q, k, v, ids, seq):
        with pytest.raises(exc, match=msg):
            msa_sparse_decode(*args, tiling=T512)
    with pytest.raises(TypeError, match="tiling"):
        msa_sparse_decode(q, k, v, ids, seq, tiling="512")
    with pytest.raises(TypeError, match="trace"):
        msa_sparse_decode(q, k, v, ids, seq, trace=[])
    with pytest.raises(TypeError, match="trace"):  # checked before anything else
        msa_sparse_decode(None, k, v, ids, 0, trace=[])
    with pytest.raises(TypeError, match="seeds_compat"):
        msa_sparse_decode(q, k, v, ids, seq, seeds_compat="yes")


@pytest.mark.parametrize("workers, block", [(1, 1), (2, 2), (3, 1), (2, 64), (1, 3)])
def test_batch_blocks_and_workers_are_invisible(rng, monkeypatch, workers, block):
    """The speed path (blocks of batch rows on the worker pool) changes no bit and no trace
    record: compared with the plain path (private switch ``_FAST = False``: one batch row at
    a time, in the calling thread)."""
    import threading

    from tilesim.reference.util import blas_pool

    mod = importlib.import_module("tilesim.reference.msa_decode")
    nb = 9
    q, k, v, ids = make(rng, 5, nb, 6)
    seq = np.array([nb * BY, 4 * BY + 3, 2 * BY, nb * BY - 5, 1])  # row 4 sees one key
    put(ids, 1, 2, 4)
    ids[2] = [8, 7, 6, 5, 4, 3]  # every selected block is in the future: zeros
    monkeypatch.setattr(mod, "_FAST", False)
    want_recs = []
    want = msa_sparse_decode(q, k, v, ids, seq, tiling=T512, trace=want_recs.append)
    assert msa_sparse_decode(q, k, v, ids, seq, tiling=T512).tobytes() == want.tobytes()
    monkeypatch.setattr(mod, "_FAST", True)
    threads = set()
    real = blas_pool.pin_blas_thread

    def spy():
        threads.add(threading.get_ident())
        real()

    monkeypatch.setattr(blas_pool, "pin_blas_thread", spy)
    monkeypatch.setenv("TILESIM_REF_THREADS", str(workers))
    monkeypatch.setattr(importlib.import_module("tilesim.reference._msa_decode_fast"),
                        "BATCH_BLOCK", block)  # fmt: skip
    recs = []
    got = msa_sparse_decode(q, k, v, ids, seq, tiling=T512, trace=recs.append)
    pool_threads = len(threads)  # the worker threads of this one call
    assert got.tobytes() == want.tobytes()
    assert not got[2].astype(F32).any()
    assert msa_sparse_decode(q, k, v, ids, seq, tiling=T512).tobytes() == want.tobytes()
    assert len(recs) == len(want_recs) == 5 * 4 * 2
    for a, b in zip(recs, want_recs, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(a[key], np.ndarray):
                assert a[key].tobytes() == b[key].tobytes(), key
            else:
                assert a[key] == b[key], key
    n_items = -(-5 // block)
    assert pool_threads == (min(workers, n_items) if min(workers, n_items) > 1 else 0)


def test_exp_model_within_2_ulp_of_correctly_rounded():
    """P = exp(S - m) uses NumPy's float32 exp (``arith.exp_fp32_numpy``): <= 2 ulp from the
    correctly rounded value on the softmax domain [-104, 0] (below -103.3 exp is 0 in FP32)."""
    from tilesim.reference.util.arith import exp_fp32_numpy as exp_fp32
    from tilesim.reference.util.numerics import ulp_distance

    lo = np.float32(-104.0).view(np.uint32)
    x = np.arange(0x80000000, int(lo) + 1, 997, dtype=np.uint64).astype(np.uint32).view(F32)
    got = exp_fp32(x)
    cr = np.exp(x.astype(F64)).astype(F32)
    assert ulp_distance(got, cr).max() <= 2
    assert exp_fp32(np.array([0.0, -0.0], F32)).tolist() == [1.0, 1.0]
    assert exp_fp32(np.array([-3.0e38], F32))[0] == 0.0


@pytest.mark.torch
def test_matches_torch_sdpa_float64(rng):
    """A second, independent oracle: torch's scaled_dot_product_attention in float64."""
    import torch
    import torch.nn.functional as F

    nb = 12
    q, k, v, ids = make(rng, 2, nb, 8)
    put(ids, 1, 4, 9)
    seq = np.array([nb * BY, 9 * BY + 100])
    out = msa_sparse_decode(q, k, v, ids, seq, tiling=T512)
    _, amag, _ = dense_oracle(q, k, v, ids, seq)
    for b in range(2):
        kk = torch.from_numpy(k[b][:, ids[b]].astype(F64).reshape(4, -1, 128))
        vv = torch.from_numpy(v[b][:, ids[b]].astype(F64).reshape(4, -1, 128))
        pos = torch.from_numpy((ids[b][:, None] * BY + np.arange(BY)).reshape(-1))
        qq = torch.from_numpy(q[b].astype(F64)).view(4, 16, 1, 128)
        ref = F.scaled_dot_product_attention(
            qq, kk[:, None], vv[:, None], attn_mask=(pos < int(seq[b]))[None, None, None]
        ).reshape(64, 128)
        assert_in_budget(out[b : b + 1], ref.numpy()[None], amag[b : b + 1])


@settings(max_examples=20, deadline=None)
@given(
    batch=st.integers(1, 3),
    nb=st.integers(1, 10),
    topk_frac=st.floats(0.01, 1.0),
    ntile=st.sampled_from([128, 256, 384, 512]),
    seed=st.integers(0, 2**32 - 1),
)
def test_property_matches_oracle(batch, nb, topk_frac, ntile, seed):
    """Random shapes (reduced heads), per-row seq_len, NTILE widths with and without tails."""
    r = np.random.default_rng(seed)
    topk = max(1, round(topk_frac * nb))
    q, k, v, ids = make(r, batch, nb, topk, hq=8, hkv=2, d=64)
    seq = r.integers(1, nb * BY + 1, batch)
    out = msa_sparse_decode(q, k, v, ids, seq, tiling=MsaTiling(ntile=ntile))
    ref, amag, vis = dense_oracle(q, k, v, ids, seq)
    assert_in_budget(out, ref, amag)
    assert not out[~vis].astype(F32).any()  # rows with no visible key are zeros
    assert out.tobytes() == loop_kernel(q, k, v, ids, seq, ntile=ntile).tobytes()


# ----------------------------------------------------------------------------- the contract
def test_contract_module_exports_the_five_things():
    from tilesim.shared import msa_decode as contract

    for name in ("Args", "check_meta", "check_values", "host_plan", "cost"):
        assert callable(getattr(contract, name)), name


def _meta(torch, batch=2, nb=5, topk=3, ids_dtype=None, seq=None):
    bf = torch.bfloat16
    q = torch.empty((batch, 64, 128), dtype=bf, device="meta")
    kv = torch.empty((batch, 4, nb, BY, 128), dtype=bf, device="meta")
    ids = torch.empty((batch, topk), dtype=ids_dtype or torch.int32, device="meta")
    seq = torch.empty((batch,), dtype=torch.int64, device="meta") if seq is None else seq
    return q, kv, kv, ids, seq


def test_check_meta_reads_no_value_on_meta_tensors():
    """check_meta on torch ``meta`` tensors (any read would raise) gives the sizes and leaves
    the values unchecked (``ids`` / ``seq`` None); wrong metadata is refused by name."""
    torch = pytest.importorskip("torch")
    from tilesim.shared.msa_decode import check_meta

    q, k, v, ids, seq = _meta(torch)
    args = check_meta(q, k, v, ids, seq)
    assert (args.batch, args.hq, args.hkv, args.nb, args.by, args.dim, args.topk) == (
        2, 64, 4, 5, BY, 128, 3)  # fmt: skip
    assert args.ids is None and args.seq is None and args.block_ids is ids
    with pytest.raises(TypeError, match="block_ids"):
        check_meta(*_meta(torch, ids_dtype=torch.float32))
    with pytest.raises(ValueError, match="seq_len"):
        check_meta(*_meta(torch, seq=torch.empty((3,), dtype=torch.int64, device="meta")))
    with pytest.raises(ValueError, match="seq_len"):
        check_meta(q, k, v, ids, 5 * BY + 1)  # an int is a static value: checked here


def test_check_values_catches_what_check_meta_does_not(rng):
    from tilesim.shared.msa_decode import check_meta, check_values

    q, k, v, ids = make(rng, 2, 5, 3, hq=8, hkv=2, d=32)
    ids[1, 2] = 5  # out of range [0, nb)
    args = check_meta(q, k, v, ids, 600)  # metadata only: passes
    with pytest.raises(ValueError, match=r"block_ids: expected ids in \[0, nb=5\)"):
        check_values(args)
    ids[1, 2] = ids[1, 0]  # a duplicate
    with pytest.raises(ValueError, match="block_ids: expected unique ids"):
        check_values(check_meta(q, k, v, ids, 600))
    ids[1, 2] = 4
    with pytest.raises(ValueError, match="seq_len"):
        check_values(check_meta(q, k, v, ids, np.array([600, 0])))
    got = check_values(check_meta(q, k, v, ids, np.array([600, 1])))
    assert got.ids.tolist() == ids.tolist() and got.seq.tolist() == [600, 1]


def test_torch_keep_mask_and_page_table_twins():
    torch = pytest.importorskip("torch")
    from tilesim.shared.msa_decode import decode_keep_mask, keep_mask_torch, page_table_torch

    ids = np.array([[3, 0, 4], [1, 2, 0]])
    seq = np.array([3 * BY + 7, 1])
    got = keep_mask_torch(torch.from_numpy(ids), torch.from_numpy(seq)).numpy()
    np.testing.assert_array_equal(got, decode_keep_mask(ids, seq))
    table = page_table_torch(torch.from_numpy(ids), 2, 5).numpy()
    assert table.tolist() == [[3, 0, 4], [8, 5, 9], [11, 12, 10], [16, 17, 15]]


def test_cost_counts_flops_and_bytes():
    from tilesim.shared.msa_decode import cost, sized_args

    args = sized_args(2, 64, 128, hkv=4, topk=16)
    c = cost(args)
    keys = 16 * BY
    assert c["flop"] == 4 * 2 * 64 * keys * 128 == msa_sparse_decode_flop(2, 64, keys, 128)
    # q and out BF16 [2, 64, 128]; K and V BF16 rows of 2*4 pairs x 2048 keys
    assert c["bytes"] == 2 * (2 * 64 * 128 * 2) + 2 * (2 * 4 * keys * 128 * 2)


def test_tiling_none_is_the_shared_rule_with_soc(rng, monkeypatch):
    """``tiling=None``: the reference applies the shared split rule for its ``soc`` (as the
    device wrapper): topk 64 (16 chunks), B 1, HKV 4 gives 4 splits on the 910B, and the
    call's bits are those of an explicit tiling with those splits."""
    from tilesim.shared.msa_decode import resolve_tiling

    monkeypatch.delenv("MSA_NTILE", raising=False)
    monkeypatch.delenv("MSA_KV_SPLITS", raising=False)
    t = resolve_tiling(None, batch=1, hkv=4, topk=64, soc="910b")
    assert t.kv_splits == 4 and t.ntile == 512
    assert resolve_tiling(T512, batch=1, hkv=4, topk=64, soc="910b") is T512
    with pytest.raises(TypeError, match="tiling"):
        resolve_tiling(512, batch=1, hkv=4, topk=64, soc="910b")
    q, k, v, ids = make(rng, 1, 64, 64, hq=8, hkv=4, d=32)
    auto = msa_sparse_decode(q, k, v, ids, 64 * BY, soc="910b")
    split = msa_sparse_decode(q, k, v, ids, 64 * BY, tiling=t)
    assert auto.tobytes() == split.tobytes()
    with pytest.raises(ValueError, match="soc"):
        msa_sparse_decode(q, k, v, ids, 64 * BY, soc="nope")
