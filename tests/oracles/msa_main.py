"""Independent oracles of the MSA main branch (prefill), shared by the reference and sim tests.

* :func:`mask_oracle` — the block mask from token positions (slot real, query row < n, key
  position <= query position), without the op's per-block cases.
* :func:`dense_oracle` — float64 softmax attention over the gathered keys, visibility from
  token positions (not from ``block_mask``), on the inputs after the wrapper's dtype cast;
  with :func:`budget` (the error budget against it) and :func:`assert_in_budget`.
* :func:`loop_kernel` — the kernel one query head at a time with explicit chunk and K-step
  loops and the wrapper's mask built element by element.
* :func:`torch_dense_oracle` — the same float64 attention written with torch (the sim tests).
* :func:`live_pairs_rows` — the live work of the seeds' published block ids, counted from the
  ids (query block, slot) pairs with ``block <= query block``.

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

import math

import ml_dtypes
import numpy as np

BF = ml_dtypes.bfloat16
F32, F64 = np.float32, np.float64
NEG = F32(-1e9)


def mask_oracle(n, ids, bk=128, topk=16):
    """``[ceil(n/bk), topk, bk, bk]``: 0 where the key's token position is visible, else -1e9."""
    nbq = -(-n // bk)
    qpos = np.arange(nbq * bk).reshape(nbq, 1, bk, 1)
    slot = np.arange(topk).reshape(1, topk, 1, 1)
    ids_pad = np.concatenate([np.asarray(ids), np.full(topk - len(ids), -1)])
    kpos = ids_pad.reshape(1, topk, 1, 1) * bk + np.arange(bk).reshape(1, 1, 1, bk)
    ok = (slot < len(ids)) & (qpos < n) & (kpos <= qpos)
    return np.where(ok, 0.0, -1e9).astype(F32)


def cast(a, dtype):
    """The wrapper's cast of q / k / v, as float64."""
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
    """The error budget of the module docstring, elementwise."""
    u = 2.0**-24
    b = u * ((32 * rmax[..., None] + 32) * amag + np.abs(ref))
    if dtype == "bf16":
        b = b + 2.0**-8 * amag
    if dtype == "fp16":
        b = b + 2.0**-11 * amag + 2.0**-25 * v1
    return b


def assert_in_budget(out, orc, dtype="fp32"):
    """Assert ``|out - ref| <= budget``; returns the worst error / budget ratio."""
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


def torch_dense_oracle(q, kb, vb, n, ids, bk=128):
    """float64 attention (torch) of each query row over the visible keys of the selected
    blocks; ``q``, ``kb``, ``vb`` already cast to the kernel dtype."""
    import torch

    hq, hkv, dh = q.shape[1], kb.shape[1], q.shape[2]
    g = hq // hkv
    out = torch.zeros(n, hq, dh, dtype=torch.float64)
    keys = torch.cat([i * bk + torch.arange(bk) for i in ids])  # key positions, slot order
    rows = torch.cat([torch.arange(s * bk, (s + 1) * bk) for s in range(len(ids))])
    for i in range(n):
        vis = keys <= i  # causal within the diagonal block, past blocks whole
        if not bool(vis.any()):
            continue
        for h in range(hq):
            k = kb[rows[vis], h // g].double()
            v = vb[rows[vis], h // g].double()
            s = (q[i, h].double() @ k.T) / dh**0.5
            out[i, h] = torch.softmax(s, dim=-1) @ v
    return out


def live_pairs_rows(n, ids, bk=128):
    """Sum over (query block, selected block) pairs with ``block <= query block`` of the query
    block's real rows: the live work unit of the main branch (times ``2*HQ*2*dh*bk`` FLOPs)."""
    rows = [min(bk, n - qb * bk) for qb in range(-(-n // bk))]
    return sum(rows[qb] for qb in range(len(rows)) for kv in ids if kv <= qb)
