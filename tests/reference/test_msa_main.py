"""MSA main branch (prefill): block mask, oracles, kernel-loop equivalence, fast == plain path,
trace records, FLOP counts, the seeds' cases.

The oracles (token-position mask, float64 dense attention with its error budget, the per-head
loop kernel) are in ``tests/oracles/msa_main.py``.
"""

from __future__ import annotations

import importlib
import math
import subprocess
import sys

import numpy as np
import pytest
from oracles.msa_main import (
    NEG,
    assert_in_budget,
    dense_oracle,
    live_pairs_rows,
    loop_kernel,
    mask_oracle,
)
from tilesim.reference import build_msa_block_mask, msa_main_branch, msa_make_case
from tilesim.reference.cases.msa import seeds_topk_indices
from tilesim.shared.casts import to_bf16
from tilesim.shared.tiling import MsaTiling
from tilesim.shared.trace import check_record

F32, F64 = np.float32, np.float64
T = MsaTiling(ntile=512, max_n=2048)


def case(n, ids=None, *, hq=64, hkv=4, dh=128, topk=16, bk=128, seed=1, max_n=None):
    c = msa_make_case(
        None,
        op="msa_main_branch",
        seed=seed,
        n=n,
        hq=hq,
        hkv=hkv,
        dh=dh,
        topk=topk,
        bk=bk,
        topk_indices=None if ids is None else np.asarray(ids, dtype=np.int32),
        max_n=max_n,
    )
    return c["inputs"], c["params"], c["meta"]["topk_indices"]


# ----------------------------------------------------------------------------- block mask
@pytest.mark.parametrize(
    "n, ids, bk, topk",
    [
        (1, [0], 128, 16),
        (64, [0], 128, 16),
        (128, [0], 128, 16),
        (129, [1, 0], 128, 16),
        (500, [3, 1, 0, 2], 128, 16),
        (1500, None, 128, 16),
        (700, [5, 2, 9, 0], 64, 8),
        (4096, None, 128, 16),
    ],
)
def test_block_mask_matches_position_rule(n, ids, bk, topk):
    ids = seeds_topk_indices(n, 45, bk=bk, topk=topk) if ids is None else np.array(ids)
    m = build_msa_block_mask(n, ids, bk=bk, topk=topk)
    assert m.dtype == F32 and m.shape == (-(-n // bk), topk, bk, bk)
    np.testing.assert_array_equal(m, mask_oracle(n, ids, bk, topk))
    assert set(np.unique(m).tolist()) <= {0.0, -1e9}


@pytest.mark.torch
def test_block_mask_torch():
    import torch

    m = build_msa_block_mask(300, torch.tensor([2, 0], dtype=torch.int64))
    assert isinstance(m, torch.Tensor) and m.dtype == torch.float32
    np.testing.assert_array_equal(m.numpy(), mask_oracle(300, [2, 0]))


@pytest.mark.parametrize(
    "args, kw, exc, msg",
    [
        ((0, [0]), {}, ValueError, r"n: expected an int in \[1, inf\], got 0"),
        ((100, [1]), {}, ValueError, r"topk_indices\[0\]: expected a value in \[0, 0\], got 1"),
        ((300, [0, -1]), {}, ValueError, r"topk_indices\[1\]: expected a value in \[0, 2\]"),
        ((300, [1, 1]), {}, ValueError, "topk_indices: expected unique ids"),
        ((300, [[0, 1]]), {}, ValueError, "topk_indices: expected a 1-D"),
        ((300, np.array([0.0, 1.0])), {}, TypeError, "topk_indices: expected an integer"),
        ((300, []), {}, ValueError, "topk_indices"),
        ((300, [0, 1, 2]), {"topk": 2}, ValueError, "1..topk=2 ids, got 3"),
        ((300, [0]), {"bk": 0}, ValueError, r"bk: expected an int in \[1"),
        ((300, [0]), {"topk": 1.5}, TypeError, "topk: expected an int"),
        ((300, [0, 1]), {}, TypeError, "topk_indices: expected a numpy array"),
    ],
)
def test_block_mask_bad_inputs(args, kw, exc, msg):
    n, ids = args
    if isinstance(ids, list) and msg != "topk_indices: expected a numpy array":
        ids = np.asarray(ids, dtype=np.int64)
    with pytest.raises(exc, match=msg):
        build_msa_block_mask(n, ids, **kw)


# ----------------------------------------------------------------------------- oracles
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_matches_float64_oracle_within_budget(dtype):
    inputs, params, ids = case(300, [2, 0, 1], hq=8, hkv=2, seed=5)
    out = msa_main_branch(**inputs, dtype=dtype, max_n=2048, tiling=T)
    assert out.dtype == F32 and out.shape == (300, 8, 128)
    worst = assert_in_budget(out, dense_oracle(inputs, ids, dtype), dtype)
    print(f"main branch {dtype}: worst error {worst:.4f} x budget")
    assert worst > 1e-3  # not vacuous


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_batched_equals_per_head_loop(dtype):
    inputs, params, ids = case(300, [2, 0, 1], hq=8, hkv=2, topk=4, seed=6)  # 512 keys
    if dtype == "fp32":  # BF16-valued FP32 data: exact score dot products
        inputs = {
            k: (to_bf16(v).astype(F32) if k != "block_mask" else v) for k, v in inputs.items()
        }
    for ntile in (512, 256, 384):  # one chunk; two chunks; a chunk plus a 128-key tail
        got = msa_main_branch(**inputs, dtype=dtype, max_n=2048, tiling=MsaTiling(ntile=ntile))
        want = loop_kernel(inputs, dtype, ntile=ntile)
        if dtype == "fp32":
            # FP32 P times V is not exact in float64; the BLAS order may move 1 FP32 ulp
            d = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32))
            assert d.max() <= 1 and (d == 0).mean() > 0.999, (ntile, d.max())
        else:
            assert got.tobytes() == want.tobytes(), ntile


@pytest.mark.parametrize("workers", [1, 3])
def test_row_blocking_and_workers_are_invisible(monkeypatch, workers):
    """Row-block size and worker count change no bit; the (KV head, row block) items really
    run on the pool when there are several workers."""
    import threading

    from tilesim.reference.util import blas_pool

    fast_mod = importlib.import_module("tilesim.reference._msa_main_fast")

    inputs, _, ids = case(300, [2, 0, 1], hq=8, hkv=2, topk=4, seed=7)
    inputs = {k: (to_bf16(v).astype(F32) if k != "block_mask" else v) for k, v in inputs.items()}
    monkeypatch.setenv("TILESIM_REF_THREADS", "1")
    a = msa_main_branch(**inputs, dtype="bf16", max_n=2048, tiling=T)
    threads = set()
    real = blas_pool.pin_blas_thread

    def spy():
        threads.add(threading.get_ident())
        real()

    monkeypatch.setattr(blas_pool, "pin_blas_thread", spy)
    monkeypatch.setenv("TILESIM_REF_THREADS", str(workers))
    monkeypatch.setattr(fast_mod, "ROW_BLOCK", 7)
    b = msa_main_branch(**inputs, dtype="bf16", max_n=2048, tiling=T)
    assert a.tobytes() == b.tobytes()
    assert len(threads) == (workers if workers > 1 else 0)
    threads.clear()
    plain = msa_main_branch(**inputs, dtype="bf16", max_n=2048, tiling=T, _fast=False)
    assert plain.tobytes() == a.tobytes() and not threads  # the plain path: no pool


# ----------------------------------------------------------------------------- fast == plain
FAST_PLAIN_CASES = [
    # n, ids, topk, bk, dtype, ntile, seeds_compat
    (300, [2, 0, 1], 4, 128, "fp32", 512, False),  # raw FP32 data: inexact float64 sums
    (700, [5, 2, 4, 0], 16, 128, "fp16", 512, False),  # 12 zero padding slots
    (1500, None, 16, 128, "bf16", 384, False),  # the seeds' ids; a 128-key tail chunk
    (700, [9, 2, 6, 0, 10], 8, 64, "fp32", 256, False),  # bk 64
    (500, [3, 1], 16, 128, "fp32", 512, False),  # rows 0-127 see no key at all
    (500, [3, 1], 5, 128, "bf16", 256, True),  # seeds_compat: tail dropped, mean of V
]


def _records_bytes(recs):
    """Records with their arrays as bytes (for an exact comparison)."""
    out = []
    for r in recs:
        check_record(r)
        r = dict(r)
        r["row_max"], r["row_sum"] = r["row_max"].tobytes(), r["row_sum"].tobytes()
        out.append(r)
    return out


@pytest.mark.parametrize("n, ids, topk, bk, dtype, ntile, seeds_compat", FAST_PLAIN_CASES)
def test_fast_path_equals_plain_path(monkeypatch, n, ids, topk, bk, dtype, ntile, seeds_compat):
    """The speed path (row blocks on the pool, dead-key skipping) and the plain path (one item
    per KV head over all rows, serial, every key) give the same output bits, with or without
    a trace hook, and the same trace records; the module flag ``_FAST`` picks the path."""
    mod = importlib.import_module("tilesim.reference.msa_main")
    monkeypatch.setenv("TILESIM_REF_THREADS", "2")
    inputs, _, ids = case(n, ids, hq=8, hkv=2, topk=topk, bk=bk, seed=16)
    kw = dict(dtype=dtype, max_n=2048, tiling=MsaTiling(ntile=ntile), seeds_compat=seeds_compat)
    fast = msa_main_branch(**inputs, **kw, _fast=True)
    plain = msa_main_branch(**inputs, **kw, _fast=False)
    assert fast.tobytes() == plain.tobytes()
    rec_fast, rec_plain = [], []
    traced_fast = msa_main_branch(**inputs, **kw, _fast=True, trace=rec_fast.append)
    traced_plain = msa_main_branch(**inputs, **kw, _fast=False, trace=rec_plain.append)
    assert traced_fast.tobytes() == traced_plain.tobytes() == fast.tobytes()
    assert rec_fast and _records_bytes(rec_fast) == _records_bytes(rec_plain)
    monkeypatch.setattr(mod, "_FAST", False)
    widths = _count_key_columns(monkeypatch)
    assert msa_main_branch(**inputs, **kw).tobytes() == plain.tobytes()
    keys = topk * bk - (topk * bk) % ntile if seeds_compat else topk * bk
    assert sum(widths) == 2 * keys  # the flag's plain path: every key of both KV heads


# ----------------------------------------------------------------------------- dead-key skipping
def _count_key_columns(monkeypatch):
    """Wrap the module's matmul_fp32 (the score matmul S = Q K^T; P.V runs in msa_common):
    collect the key width N of every call."""
    mod = importlib.import_module("tilesim.reference.msa_main")
    widths = []
    real = mod.matmul_fp32

    def counting(a, b, *args, **kw):
        widths.append(b.shape[-1])
        return real(a, b, *args, **kw)

    monkeypatch.setattr(mod, "matmul_fp32", counting)
    return widths


@pytest.mark.parametrize(
    "n, ids, topk, bk, dtype, ntile",
    [
        (300, [2, 0, 1], 4, 128, "bf16", 512),  # one chunk, slot 0 unseen by blocks 0-1
        (700, [5, 2, 4, 0], 16, 128, "fp16", 512),  # 12 zero padding slots
        (1500, None, 16, 128, "fp32", 384),  # the seeds' ids; a 128-key tail chunk
        (700, [9, 2, 6, 0, 10], 8, 64, "bf16", 256),  # bk 64: row blocks hold 2 query blocks
        (500, [3, 1], 16, 128, "fp32", 512),  # rows 0-127 see no key at all
    ],
)
def test_dead_key_skipping_is_invisible(monkeypatch, n, ids, topk, bk, dtype, ntile):
    """On the speed path, K steps that no row of a row block sees are not computed, with or
    without a trace hook (the switch alone picks the path); the output bits equal the plain
    path's all-keys computation and the per-head loop kernel. A trace hook adds one statistics
    pass of the plain path (the records need each chunk's m, l over every key)."""
    inputs, _, ids = case(n, ids, hq=8, hkv=2, topk=topk, bk=bk, seed=12)
    tiling = MsaTiling(ntile=ntile)
    widths = _count_key_columns(monkeypatch)
    fast = msa_main_branch(**inputs, dtype=dtype, max_n=2048, tiling=tiling)
    fast_cols = sum(widths)
    widths.clear()
    every = msa_main_branch(**inputs, dtype=dtype, max_n=2048, tiling=tiling, _fast=False)
    every_cols = sum(widths)
    widths.clear()
    traced = msa_main_branch(**inputs, dtype=dtype, max_n=2048, tiling=tiling, trace=lambda r: 0)
    # the plain path is one item per KV head over all rows (every key once per KV head); the
    # speed path runs row blocks of 128 rows and skips some keys in some of them
    assert fast_cols < every_cols * -(-n // 128)
    # with a hook: the same skipping run, then the plain statistics pass
    assert sum(widths) == fast_cols + every_cols
    assert fast.tobytes() == every.tobytes() == traced.tobytes()
    if dtype != "fp32":  # FP32 P.V is not exact in float64 (see test_batched_equals_...)
        want = loop_kernel(inputs, dtype, ntile=ntile)
        assert fast.tobytes() == want.tobytes()


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("change", ["soft_mask", "huge_scores", "inf_value"])
def test_dead_key_skipping_off_when_not_provably_exact(monkeypatch, change):
    """A mask with values other than 0 / -1e9, scores that could reach the mask's magnitude or
    a non-finite V make every key computed (results as the kernel computes them)."""
    inputs, _, ids = case(300, [2, 0, 1], hq=4, hkv=1, topk=4, seed=13)
    inputs = {k: v.copy() for k, v in inputs.items()}
    if change == "soft_mask":
        inputs["block_mask"][0, 1, :, :] = np.where(inputs["block_mask"][0, 1] == 0, -3.0, NEG)
    elif change == "huge_scores":
        inputs["query"] *= F32(1e4)
        inputs["key_blocks"] *= F32(1e4)
    else:
        inputs["value_blocks"][0, 0, 0] = np.inf  # slot 0 = block 2: unseen by blocks 0-1
    widths = _count_key_columns(monkeypatch)
    got = msa_main_branch(**inputs, dtype="fp32", max_n=2048, tiling=T)
    assert sum(widths) == 3 * 512  # 3 row blocks x one 512-key chunk: nothing skipped
    every = msa_main_branch(**inputs, dtype="fp32", max_n=2048, tiling=T, _fast=False)
    np.testing.assert_array_equal(got, every)
    if change == "inf_value":  # the kernel's 0 * inf in P.V reaches the rows of blocks 0-1
        assert np.isnan(got[:256]).any()


# ----------------------------------------------------------------------------- seeds' cases
@pytest.mark.parametrize(
    "name", ["msa_main_unaligned_1", "msa_main_unaligned_64", "msa_main_unaligned_100"]
)
def test_seed_cases_full_heads(name):
    c = msa_make_case(name)
    out = msa_main_branch(**c["inputs"], **c["params"], tiling=T)
    orc = dense_oracle(c["inputs"], c["meta"]["topk_indices"])
    ref = orc[0]
    tol = c["tolerance"]
    assert np.isfinite(out).all()
    assert (np.abs(out - ref) <= tol["atol"] + tol["rtol"] * np.abs(ref)).all()  # seeds' rule
    assert_in_budget(out, orc)


@pytest.mark.parametrize(
    "name, ids",
    [
        ("msa_main_unaligned_500", [3, 1, 0, 2]),
        ("msa_main_unaligned_1500", [5, 3, 9, 8, 0, 10, 2, 1, 11, 7, 6, 4]),
    ],
)
def test_seed_cases_reduced_heads(name, ids):
    """The seeds' n and block ids on 8 query / 4 KV heads (8x cheaper; full heads: slow)."""
    c = msa_make_case(name, hq=8)
    assert c["meta"]["topk_indices"].tolist() == ids
    out = msa_main_branch(**c["inputs"], **c["params"], tiling=T)
    orc = dense_oracle(c["inputs"], c["meta"]["topk_indices"])
    assert (np.abs(out - orc[0]) <= 1e-3 + 1e-3 * np.abs(orc[0])).all()
    assert_in_budget(out, orc)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        "msa_main_unaligned_500",
        "msa_main_unaligned_1500",
        "msa_main_aligned_1024",
        "msa_main_aligned_2048",
        "msa_main_aligned_4096",
    ],
)
def test_seed_cases_large(name):
    import time

    c = msa_make_case(name)
    t0 = time.perf_counter()
    out = msa_main_branch(**c["inputs"], **c["params"], tiling=MsaTiling())
    dt = time.perf_counter() - t0
    print(f"{name}: {dt:.2f} s")
    orc = dense_oracle(c["inputs"], c["meta"]["topk_indices"])
    assert (np.abs(out - orc[0]) <= 1e-3 + 1e-3 * np.abs(orc[0])).all()
    assert_in_budget(out, orc)


# ----------------------------------------------------------------------------- beyond the seed
def test_rows_that_see_no_key_return_zeros():
    inputs, _, ids = case(500, [3, 1], hq=8, hkv=2, seed=8)  # block 0 not selected
    out = msa_main_branch(**inputs, dtype="fp32", max_n=2048, tiling=T)
    orc = dense_oracle(inputs, ids)
    seen = orc[4]
    assert not seen[:128].any() and seen[128:].all()
    assert not out[:128].any()
    assert_in_budget(out, orc)
    # the seeds' arithmetic: every score -1e9 exactly, P = 1: the mean of all topk*bk V rows
    kern = msa_main_branch(**inputs, dtype="fp32", max_n=2048, tiling=T, seeds_compat=True)
    mean_v = inputs["value_blocks"].astype(F64).mean(axis=0)  # [HKV, dh], zero slots included
    expect = np.repeat(mean_v, 4, axis=0)
    np.testing.assert_allclose(
        kern[:128], np.broadcast_to(expect, (128, 8, 128)), rtol=1e-5, atol=1e-7
    )
    assert np.abs(expect).max() > 1e-3
    np.testing.assert_array_equal(kern[128:], out[128:])


def _unread_key_rows(n, ids, topk, bk=128):
    """bool ``[topk*bk]`` from the ids (not from the mask): padding slots and token positions
    past ``n`` -- the key rows no query row may see."""
    slot = np.arange(topk * bk) // bk
    ids_pad = np.concatenate([np.asarray(ids), np.zeros(topk - len(ids), dtype=int)])
    return (slot >= len(ids)) | (ids_pad[slot] * bk + np.arange(topk * bk) % bk >= n)


POISON_CASES = [  # n, ids, topk, dtype, ntile, seeds_compat, fast
    (200, [1, 0], 4, "fp32", 512, False, True),  # padding slots + rows 200..255
    (200, [0, 1], 4, "bf16", 128, False, False),  # every chunk its own; the plain path
    (500, [3, 1], 5, "fp16", 256, False, True),  # rows 0..127 see nothing; a partial chunk
    (700, [5, 2, 0], 4, "fp32", 512, True, True),  # seeds_compat (no empty row)
    (1, [0], 16, "bf16", 512, False, True),  # one query row: 127 dead rows in its block
]


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("n, ids, topk, dtype, ntile, seeds_compat, fast", POISON_CASES)
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf, 3e38])
def test_unread_key_rows_never_reach_the_output(n, ids, topk, dtype, ntile, seeds_compat, fast,
                                                value):  # fmt: skip
    """NaN-robust masking: the K and V rows of keys no query row sees are zeroed
    (a select), so NaN, inf or huge garbage there gives the same output bits and the same
    trace records as zeros; a poisoned key that IS seen shows up (the control)."""
    inputs, _, _ = case(n, ids, hq=8, hkv=2, topk=topk, seed=n + topk)
    tiling = MsaTiling(ntile=ntile, max_n=-(-n // 128) * 128)
    unread = _unread_key_rows(n, ids, topk)
    assert unread.sum() >= 127
    kw = dict(dtype=dtype, tiling=tiling, seeds_compat=seeds_compat, _fast=fast)
    want_rec, got_rec = [], []
    want = msa_main_branch(**inputs, **kw, trace=want_rec.append)
    bad = dict(inputs)
    for name, sign in (("key_blocks", 1), ("value_blocks", -1)):
        bad[name] = inputs[name].copy()
        bad[name][unread] = sign * value
    got = msa_main_branch(**bad, **kw, trace=got_rec.append)
    assert np.isfinite(want).all()
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))
    assert len(got_rec) == len(want_rec)
    for a, b in zip(got_rec, want_rec, strict=True):
        for f in ("row_max", "row_sum"):
            np.testing.assert_array_equal(a[f].view(np.int32), b[f].view(np.int32))
    seen_key = int(np.flatnonzero(~unread)[0])  # the control: a key some row sees
    bad["value_blocks"] = inputs["value_blocks"].copy()
    bad["value_blocks"][seen_key] = np.nan
    assert np.isnan(msa_main_branch(**bad, **kw)).any()


def test_partial_chunk_processed_seeds_compat_drops_it():
    inputs, _, ids = case(700, [5, 1, 3, 0, 2], hq=8, hkv=2, topk=5, seed=9)  # 640 keys
    full = msa_main_branch(**inputs, dtype="fp32", max_n=768, tiling=T)
    seeds = msa_main_branch(**inputs, dtype="fp32", max_n=768, tiling=T, seeds_compat=True)
    assert_in_budget(full, dense_oracle(inputs, ids))
    assert_in_budget(seeds, dense_oracle(inputs, ids, keep_slots=4))  # slot 4 (block 2) lost
    assert np.abs(full - seeds).max() > 0.05
    small, _, ids3 = case(300, [2, 0, 1], hq=4, hkv=1, topk=3, seed=10)  # 384 keys < NTILE
    assert_in_budget(msa_main_branch(**small, dtype="fp32", tiling=T), dense_oracle(small, ids3))
    with pytest.raises(ValueError, match="seeds_compat"):
        msa_main_branch(**small, dtype="fp32", tiling=T, seeds_compat=True)


def test_env_defaults_read_at_call_time(monkeypatch):
    inputs, _, ids = case(300, [2, 0, 1], hq=4, hkv=1, seed=11)
    monkeypatch.setenv("MSA_MAX_N", "256")
    with pytest.raises(ValueError, match=r"max_n: expected a multiple of bk=128 and >= .* 384"):
        msa_main_branch(**inputs)
    monkeypatch.setenv("MSA_MAX_N", "384")
    monkeypatch.setenv("MSA_DTYPE", "bf16")
    monkeypatch.setenv("MSA_NTILE", "256")
    recs = []
    a = msa_main_branch(**inputs, trace=recs.append)
    b = msa_main_branch(**inputs, dtype="bf16", max_n=384, tiling=MsaTiling(ntile=256))
    assert a.tobytes() == b.tobytes() and len(recs) == 4 * 8


def test_trace_records():
    """Records of the shared schema: lane (head, kv_head), step = chunk, key_range on the slot
    axis, keys_used = keys some query row sees (from token positions), FLOPs of the chunk."""
    inputs, _, ids = case(200, [1, 0], hq=8, hkv=2, seed=12)
    recs = []
    msa_main_branch(**inputs, dtype="fp32", max_n=2048, tiling=T, trace=recs.append)
    assert [(r["lane"]["head"], r["step"]) for r in recs] == [
        (h, c) for h in range(8) for c in range(4)
    ]
    # slot axis -> token position (padding slots: none); a key is used when position < n
    pos = np.concatenate([i * 128 + np.arange(128) for i in ids] + [np.full(14 * 128, 10**9)])
    for r in recs:
        check_record(r)
        c = r["step"]
        assert r["op"] == "msa_main_branch" and r["lane"] == {
            "head": r["lane"]["head"],
            "kv_head": r["lane"]["head"] // 4,
        }
        assert r["key_range"] == (512 * c, 512 * c + 512) and r["extra"] == {}
        assert r["keys_used"] == int((pos[512 * c : 512 * c + 512] < 200).sum())
        assert r["flop"] == 2 * 200 * 512 * 128 * 2  # S = Q K^T and P V, one head
        assert r["row_max"].shape == (200,) and r["row_sum"].shape == (200,)
    assert recs[0]["keys_used"] == 72 + 128 and recs[1]["keys_used"] == 0
    assert sum(r["flop"] for r in recs) == 2 * 200 * 8 * 2048 * 2 * 128
    for r in recs:
        r.update(head=r["lane"]["head"], kv_head=r["lane"]["kv_head"], chunk=r["step"])
    # chunk 0 holds both selected blocks: its max is the row's max visible score
    q = inputs["query"].astype(F64)
    kk = inputs["key_blocks"].astype(F64)
    vis = mask_oracle(200, [1, 0]).transpose(0, 2, 1, 3).reshape(256, -1)[:200] == 0
    for r in recs[::4]:
        s = q[:, r["head"]] @ kk[:, r["kv_head"]].T / math.sqrt(128)
        want = np.where(vis, s, -np.inf).max(axis=1)
        np.testing.assert_allclose(r["row_max"], want, rtol=1e-6, atol=1e-6)
    # chunks 1..3 are padding slots: every entry -1e9, P = 1, row sum 512
    for r in recs:
        if r["chunk"] > 0:
            assert (r["row_max"] == NEG).all() and (r["row_sum"] == 512).all()


@pytest.mark.parametrize(
    "n, ids",
    [
        (1024, [6, 7, 4, 3, 1, 5, 2, 0]),  # the seeds' published ids
        (1500, [5, 3, 9, 8, 0, 10, 2, 1, 11, 7, 6, 4]),
        (300, [2, 0, 1]),
    ],
)
def test_flop_counts(n, ids):
    """The kernel's count covers every row and slot; the live count only the (query block,
    slot) pairs whose block is not in the future, each with the query block's real rows."""
    from tilesim.reference.msa_main import msa_main_flop_count, msa_main_live_flop_count

    mask = build_msa_block_mask(n, np.array(ids))
    live = msa_main_live_flop_count(n, 64, 128, mask)
    assert live == 2 * 64 * 2 * 128 * 128 * live_pairs_rows(n, ids)
    assert msa_main_flop_count(n, 64, 128, 16 * 128) == 2 * n * 64 * 16 * 128 * 2 * 128
    assert live < msa_main_flop_count(n, 64, 128, 16 * 128)


# ----------------------------------------------------------------------------- contract
@pytest.mark.torch
def test_torch_in_torch_out():
    import torch

    inputs, _, _ = case(130, [1, 0], hq=4, hkv=1, seed=13)
    t_in = {k: torch.from_numpy(v) for k, v in inputs.items()}
    out = msa_main_branch(**t_in, dtype="fp32", max_n=256, tiling=T)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    ref = msa_main_branch(**inputs, dtype="fp32", max_n=256, tiling=T)
    assert out.numpy().tobytes() == ref.tobytes()


def test_inputs_unmodified_and_deterministic():
    inputs, _, _ = case(130, [1, 0], hq=4, hkv=1, seed=14)
    before = {k: v.copy() for k, v in inputs.items()}
    a = msa_main_branch(**inputs, dtype="fp16", max_n=256, tiling=T)
    b = msa_main_branch(**inputs, dtype="fp16", max_n=256, tiling=T)
    assert a.tobytes() == b.tobytes()
    for k, v in inputs.items():
        assert v.tobytes() == before[k].tobytes()


def test_bad_inputs():
    inputs, _, _ = case(130, [1, 0], hq=4, hkv=1, seed=15)
    q, kb, vb, bm = (inputs[k] for k in ("query", "key_blocks", "value_blocks", "block_mask"))
    kb3 = np.concatenate([kb] * 3, axis=1)
    bad = [
        ((q.astype(F64), kb, vb, bm), {}, TypeError, "query: expected dtype"),
        ((q, kb.astype(np.int32), vb, bm), {}, TypeError, "key_blocks: expected dtype"),
        ((q, kb, vb, bm.astype(F64)), {}, TypeError, "block_mask: expected dtype float32"),
        ((q[0], kb, vb, bm), {}, ValueError, "query: expected a 3-D"),
        ((q, kb[:-1], vb, bm), {}, ValueError, r"key_blocks: expected shape \(2048, HKV, 128\)"),
        ((q, kb[..., :64], vb, bm), {}, ValueError, "key_blocks: expected shape"),
        ((q, kb3, kb3, bm), {}, ValueError, "query: expected HQ a multiple of HKV=3"),
        ((q, kb, vb[:, :, :64], bm), {}, ValueError, "value_blocks: expected the shape"),
        ((q, kb, vb, bm[:1]), {}, ValueError, r"block_mask: expected shape \(2, topk, bk, bk\)"),
        ((q, kb, vb, bm[..., :64]), {}, ValueError, "block_mask: expected shape"),
        ((q[:100], kb, vb, bm), {}, ValueError, "block_mask: expected shape"),
        ((q, kb, vb, np.where(bm < 0, -np.inf, bm).astype(F32)), {}, ValueError, "finite"),
        ((q, kb, vb, bm), {"max_n": 128}, ValueError, "max_n: expected a multiple of bk=128"),
        ((q, kb, vb, bm), {"max_n": 300}, ValueError, "max_n"),
        ((q, kb, vb, bm), {"max_n": 0}, ValueError, "max_n"),
        ((q, kb, vb, bm), {"dtype": "fp8"}, ValueError, "dtype: expected one of"),
        ((q, kb, vb, bm), {"tiling": 512}, TypeError, "tiling"),
        ((q, kb, vb, bm), {"trace": 1}, TypeError, "trace"),
        ((q, kb, vb, bm), {"seeds_compat": 1}, TypeError, "seeds_compat"),
        ((q, kb, vb, bm), {"_fast": "yes"}, TypeError, "_fast: expected a bool"),
        ((q.tolist(), kb, vb, bm), {}, TypeError, "query: expected a numpy array"),
    ]
    for args, kw, exc, msg in bad:
        kw = {"max_n": 256, "dtype": "fp32", "tiling": T, **kw}
        with pytest.raises(exc, match=msg):
            msa_main_branch(*args, **kw)


def test_direct_submodule_import_keeps_the_public_function():
    """``tilesim.reference.msa_main`` / ``.msa_indexer`` name both a module and an op."""
    code = (
        "import tilesim.reference.msa_main, tilesim.reference.msa_indexer\n"
        "import tilesim.reference as r\n"
        "from tilesim.reference import msa_main_branch, msa_indexer\n"
        "assert callable(msa_main_branch) and callable(msa_indexer)\n"
        "assert r.msa_main_branch.__name__ == 'msa_main_branch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.torch
def test_matches_torch_sdpa_float64():
    """A second, independent oracle: torch's scaled_dot_product_attention in float64 over
    the full (unselected) sequence with a token-level mask built from the selected blocks."""
    import torch
    import torch.nn.functional as F

    n, ids = 333, [2, 0]
    c = msa_make_case(
        None, op="msa_main_branch", seed=21, n=n, hq=8, hkv=2, topk_indices=np.array(ids)
    )
    out = msa_main_branch(**c["inputs"], **c["params"], tiling=T)
    rng = np.random.default_rng(21)  # the builder's stream: query, key, value
    q = rng.standard_normal((n, 8, 128), dtype=F32)
    k = rng.standard_normal((n, 2, 128), dtype=F32)
    v = rng.standard_normal((n, 2, 128), dtype=F32)
    np.testing.assert_array_equal(q, c["inputs"]["query"])
    blk = np.arange(n) // 128
    allowed = np.isin(blk, ids)[None, :] & (np.arange(n)[None, :] <= np.arange(n)[:, None])
    qt = torch.from_numpy(q.astype(F64)).permute(1, 0, 2)  # [8, n, 128]
    kt = torch.from_numpy(k.astype(F64)).permute(1, 0, 2).repeat_interleave(4, 0)
    vt = torch.from_numpy(v.astype(F64)).permute(1, 0, 2).repeat_interleave(4, 0)
    seen = allowed.any(axis=1)
    mask = torch.from_numpy(allowed | ~seen[:, None])  # SDPA needs one allowed key per row
    ref = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask).permute(1, 0, 2).numpy()
    ref[~seen] = 0.0
    orc = dense_oracle(c["inputs"], np.array(ids))
    np.testing.assert_allclose(orc[0], ref, rtol=1e-12, atol=1e-12)  # the two oracles agree
    assert_in_budget(out, (ref, *orc[1:]))


def test_huge_row_counts_fail_a_bound_check_not_an_allocation():
    """``max_n`` (and the builder's ``n``) above MAX_PREFILL_ROWS are refused by a bound check,
    before anything is allocated (a typo must not surface as a multi-PiB MemoryError)."""
    from tilesim.shared.msa_main import MAX_PREFILL_ROWS

    c = msa_make_case(None, op="msa_main_branch", n=100, seed=1)
    with pytest.raises(ValueError, match=rf"max_n: expected an int in \[1, {MAX_PREFILL_ROWS}\]"):
        msa_main_branch(**c["inputs"], **{**c["params"], "max_n": 2**40})
    with pytest.raises(ValueError, match=rf"n: expected an int in \[1, {MAX_PREFILL_ROWS}\]"):
        msa_make_case(None, op="msa_main_branch", n=MAX_PREFILL_ROWS + 1)


def _main_case_names():
    from tilesim.reference.cases.msa import MSA_CASES

    return [k for k, v in MSA_CASES.items() if v["op"] == "msa_main_branch"]


@pytest.mark.parametrize("name", _main_case_names())
def test_speed_path_is_bit_equal_on_every_named_case(name, monkeypatch):
    """The one switch ``_FAST`` (:mod:`tilesim.reference._msa_main_fast` vs the golden loop):
    same output bits and trace records on every named main-branch case (n >= 1024 reduced as
    tests/digests/golden_digests.py reduces it; seed and max_n kept)."""
    from tilesim.reference.cases.msa import MSA_CASES, msa_make_case

    mod = importlib.import_module("tilesim.reference.msa_main")
    n = MSA_CASES[name]["params"]["n"]
    case = msa_make_case(name, **({"n": 300 + n % 97} if n >= 1024 else {}))
    monkeypatch.setenv("TILESIM_REF_THREADS", "2")
    got = {}
    for fast in (False, True):
        monkeypatch.setattr(mod, "_FAST", fast)
        recs = []
        out = msa_main_branch(**case["inputs"], **case["params"], trace=recs.append)
        got[fast] = (out.tobytes(), _records_bytes(recs))
    assert got[True][0] == got[False][0]
    assert got[True][1] == got[False][1] and got[False][1]
