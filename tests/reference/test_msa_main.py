"""MSA main branch (prefill): block mask, oracles, kernel-loop equivalence, the seeds' cases.

Oracles:
* ``mask_oracle`` — the block mask from token positions (slot real, query row < n, key
  position <= query position), no block cases.
* ``dense_oracle`` — float64 softmax attention over the gathered keys, visibility from token
  positions (not from ``block_mask``), on the inputs after the wrapper's dtype cast.
* ``loop_kernel`` — the kernel one query head at a time with explicit chunk and K-step loops
  and the wrapper's mask built element by element.

Error budget against the float64 oracle (O(1) data; u = 2^-24, R = max |scaled score| of the
row's visible keys, A = sum p|v| / sum p, V1 = sum |v| / sum p)::

    fp32: |out - ref| <= u ((32 R + 32) A + |ref|)
    bf16: fp32 budget + 2^-8 A                 (P rounded to BF16, unit roundoff 2^-8)
    fp16: fp32 budget + 2^-11 A + 2^-25 V1     (P rounded to FP16, unit roundoff 2^-11;
                                                subnormals below 2^-14 carry 2^-25 absolute)

The FP32 term bounds the relative error of every weight p_i (scores 3u|s|, subtraction,
exp <= 2 ulp, rescale factors) by u(16R + 8) and the sums/merges/division by 16u; a weighted
mean with weights perturbed by e moves by at most 2 e A.
"""

from __future__ import annotations

import importlib
import math
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from tilesim.reference import build_msa_block_mask, msa_main_branch, msa_make_case
from tilesim.reference.msa_cases import seeds_topk_indices
from tilesim.shared.casts import to_bf16
from tilesim.shared.tiling import MsaTiling

BF = ml_dtypes.bfloat16
F32, F64 = np.float32, np.float64
NEG = F32(-1e9)
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
        topk_indices=ids,
        max_n=max_n,
    )
    return c["inputs"], c["params"], c["meta"]["topk_indices"]


def mask_oracle(n, ids, bk=128, topk=16):
    nbq = -(-n // bk)
    qpos = np.arange(nbq * bk).reshape(nbq, 1, bk, 1)
    slot = np.arange(topk).reshape(1, topk, 1, 1)
    ids_pad = np.concatenate([np.asarray(ids), np.full(topk - len(ids), -1)])
    kpos = ids_pad.reshape(1, topk, 1, 1) * bk + np.arange(bk).reshape(1, 1, 1, bk)
    ok = (slot < len(ids)) & (qpos < n) & (kpos <= qpos)
    return np.where(ok, 0.0, -1e9).astype(F32)


def cast(a, dtype):
    a = np.asarray(a, F32)
    if dtype == "fp16":
        return a.astype(np.float16).astype(F64)
    if dtype == "bf16":
        return a.astype(BF).astype(F64)
    return a.astype(F64)


def dense_oracle(inputs, ids, dtype="fp32", keep_slots=None):
    """(ref, A, V1, R, seen) in float64; ``keep_slots`` limits the visible slots."""
    q = cast(inputs["query"], dtype)
    kb = cast(inputs["key_blocks"], dtype)
    vb = cast(inputs["value_blocks"], dtype)
    n, hq, dh = q.shape
    bk = inputs["block_mask"].shape[2]
    hkv = kb.shape[1]
    ksel = len(ids) if keep_slots is None else min(len(ids), keep_slots)
    kpos = (np.asarray(ids[:ksel])[:, None] * bk + np.arange(bk)).reshape(-1)
    vis = kpos[None, :] <= np.arange(n)[:, None]  # [n, ksel*bk]
    seen = vis.any(axis=1)
    ref, amag, v1 = (np.zeros((n, hq, dh)) for _ in range(3))
    rmax = np.zeros((n, hq))
    for h in range(hq):
        hk = h // (hq // hkv)
        kk, vv = kb[: ksel * bk, hk], vb[: ksel * bk, hk]
        s = q[:, h] @ kk.T / math.sqrt(dh)
        s = np.where(vis, s, -np.inf)
        mx = np.where(seen, s.max(axis=1), 0.0)
        p = np.exp(s - mx[:, None])
        den = np.where(seen, p.sum(axis=1), 1.0)[:, None]
        ref[:, h] = p @ vv / den
        amag[:, h] = p @ np.abs(vv) / den
        v1[:, h] = vis.astype(F64) @ np.abs(vv) / den
        rmax[:, h] = np.where(seen, np.abs(np.where(vis, s, 0.0)).max(axis=1), 0.0)
    return ref, amag, v1, rmax, seen


def budget(ref, amag, v1, rmax, dtype):
    u = 2.0**-24
    b = u * ((32 * rmax[..., None] + 32) * amag + np.abs(ref))
    if dtype == "bf16":
        b = b + 2.0**-8 * amag
    if dtype == "fp16":
        b = b + 2.0**-11 * amag + 2.0**-25 * v1
    return b


def assert_in_budget(out, orc, dtype="fp32"):
    ref, amag, v1, rmax, _ = orc
    err = np.abs(np.asarray(out, F64) - ref)
    b = budget(ref, amag, v1, rmax, dtype)
    ratio = np.divide(err, b, out=np.where(err > 0, np.inf, 0.0), where=b > 0)
    worst = float(ratio.max())
    assert worst <= 1.0, f"error {worst:.3f} x budget"
    return worst


def loop_kernel(inputs, dtype="fp32", ntile=512, max_n=2048, seeds_compat=False):
    """The kernel one query head at a time; the wrapper's mask built element by element."""
    q, kb, vb, bm = (inputs[k] for k in ("query", "key_blocks", "value_blocks", "block_mask"))
    n, hq, dh = q.shape
    nbq, topk, bk, _ = bm.shape
    hkv = kb.shape[1]
    mask = np.full((max_n, topk * bk), NEG, F32)
    for qb in range(nbq):
        for i in range(topk):
            mask[qb * bk : (qb + 1) * bk, i * bk : (i + 1) * bk] = bm[qb, i]
    pdt = {"fp32": F32, "fp16": np.float16, "bf16": BF}[dtype]
    qc, kc, vc = (cast(a, dtype) for a in (q, kb, vb))
    scale = F32(1 / math.sqrt(dh))
    out = np.zeros((n, hq, dh), F32)
    kv_len = topk * bk
    stop = kv_len - kv_len % ntile if seeds_compat else kv_len
    for h in range(hq):
        hk = h // (hq // hkv)
        m = l = o = None
        for c0 in range(0, stop, ntile):
            w = min(ntile, kv_len - c0)
            raw = (qc[:, h] @ kc[c0 : c0 + w, hk].T).astype(F32)
            s = raw * scale + mask[:n, c0 : c0 + w]
            mx = s.max(axis=1, keepdims=True)
            p = np.exp(s - mx)
            ls = p.astype(F64).sum(axis=1, keepdims=True).astype(F32)
            pc = p.astype(pdt).astype(F64)
            oc = None
            for k0 in range(0, w, 128):
                part = pc[:, k0 : k0 + 128] @ vc[c0 + k0 : c0 + min(w, k0 + 128), hk]
                oc = part.astype(F32) if oc is None else oc + part.astype(F32)
            if m is None:
                m, l, o = mx, ls, oc
            else:
                mn = np.maximum(m, mx)
                a, b = np.exp(m - mn), np.exp(mx - mn)
                m, l, o = mn, a * l + b * ls, o * a + oc * b
        out[:, h] = o / l
    if not seeds_compat:
        out[~(mask[:n] > NEG).any(axis=1)] = 0
    return out


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
        ((0, [0]), {}, ValueError, "n: expected a positive int"),
        ((100, [1]), {}, ValueError, r"topk_indices: expected ids in \[0, ceil\(n/bk\)=1\)"),
        ((300, [-1]), {}, ValueError, "topk_indices: expected ids in"),
        ((300, [1, 1]), {}, ValueError, "topk_indices: expected unique ids"),
        ((300, [[0, 1]]), {}, ValueError, "topk_indices: expected a 1-D"),
        ((300, np.array([0.0, 1.0])), {}, TypeError, "topk_indices: expected an integer"),
        ((300, []), {}, ValueError, "topk_indices"),
        ((300, [0, 1, 2]), {"topk": 2}, ValueError, "1..topk=2 ids, got 3"),
        ((300, [0]), {"bk": 0}, ValueError, "bk: expected a positive int"),
        ((300, [0]), {"topk": 1.5}, ValueError, "topk"),
    ],
)
def test_block_mask_bad_inputs(args, kw, exc, msg):
    n, ids = args
    ids = np.asarray(ids, dtype=np.int64) if isinstance(ids, list) else ids
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

    from tilesim.reference import blas_pool

    mod = importlib.import_module("tilesim.reference.msa_main")

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
    monkeypatch.setattr(mod, "ROW_BLOCK", 7)
    b = msa_main_branch(**inputs, dtype="bf16", max_n=2048, tiling=T)
    assert a.tobytes() == b.tobytes()
    assert len(threads) == (workers if workers > 1 else 0)


# ----------------------------------------------------------------------------- dead-key skipping
def _count_key_columns(monkeypatch):
    """Wrap the module's cube_matmul (the score matmul S = Q K^T; P.V runs in msa_common):
    collect the key width N of every call."""
    mod = importlib.import_module("tilesim.reference.msa_main")
    widths = []
    real = mod.cube_matmul

    def counting(a, b, *args, **kw):
        widths.append(b.shape[-1])
        return real(a, b, *args, **kw)

    monkeypatch.setattr(mod, "cube_matmul", counting)
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
    """Without a trace hook, K steps that no row of a row block sees are not computed; the
    output bits equal the all-keys computation (the trace hook forces it) and the per-head
    loop kernel."""
    inputs, _, ids = case(n, ids, hq=8, hkv=2, topk=topk, bk=bk, seed=12)
    tiling = MsaTiling(ntile=ntile)
    widths = _count_key_columns(monkeypatch)
    fast = msa_main_branch(**inputs, dtype=dtype, max_n=2048, tiling=tiling)
    fast_cols = sum(widths)
    widths.clear()
    every = msa_main_branch(**inputs, dtype=dtype, max_n=2048, tiling=tiling, trace=lambda r: None)
    every_cols = sum(widths)
    assert fast_cols < every_cols  # keys were skipped
    assert fast.tobytes() == every.tobytes()
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
    every = msa_main_branch(**inputs, dtype="fp32", max_n=2048, tiling=T, trace=lambda r: None)
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
    inputs, _, ids = case(200, [1, 0], hq=8, hkv=2, seed=12)
    recs = []
    msa_main_branch(**inputs, dtype="fp32", max_n=2048, tiling=T, trace=recs.append)
    assert [(r["head"], r["chunk"]) for r in recs] == [(h, c) for h in range(8) for c in range(4)]
    for r in recs:
        assert r["op"] == "msa_main_branch" and r["kv_head"] == r["head"] // 4
        assert (r["kv_start"], r["kv_len"]) == (512 * r["chunk"], 512)
        assert r["row_max"].shape == (200,) and r["row_sum"].shape == (200,)
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
        ((q.tolist(), kb, vb, bm), {}, TypeError, "query: expected a numpy array"),
    ]
    for args, kw, exc, msg in bad:
        kw = {"max_n": 256, "dtype": "fp32", "tiling": T, **kw}
        with pytest.raises(exc, match=msg):
            msa_main_branch(*args, **kw)


def test_direct_submodule_import_keeps_the_public_function():
    """``tilesim.reference.msa_main`` / ``.msa_indexer`` name both a module and an op."""
    code = (
        "import tilesim.reference.msa_main, tilesim.reference.msa_lightning_indexer\n"
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
    c = msa_make_case(None, op="msa_main_branch", seed=21, n=n, hq=8, hkv=2, topk_indices=ids)
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
