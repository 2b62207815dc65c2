"""Independent oracles of the MSA lightning indexer and block-sparse decode, written once for
the reference and the sim tests (the main branch's are in :mod:`oracles.msa_main`).

None of them calls ``tilesim.reference`` or ``tilesim.shared.msa_indexer`` / ``msa_decode``:

* :func:`inject` — index q/k whose kernel scores are exactly the wanted BF16 values (unit
  vectors in ``idx_q``, the scores in the matching column of ``idx_k``).
* :func:`oracle_select` — the indexer's selection by brute force: per-block max with Python
  loops, then ``sorted`` on ``(-score, block id)`` (MiniMax's exact top-k contract).
* :func:`dense_oracle` — decode as float64 softmax attention over the gathered keys whose
  token position ``block*128 + t`` is ``< seq_len`` (the mask rule restated by position), no
  chunks; :func:`assert_in_budget` the per-element error budget against it.
* :func:`loop_kernel` — the decode kernel written the plain way: one (batch row, KV head) at a
  time, Python loops over chunks and K steps, the keep-mask built slot by slot; with
  ``kv_splits``, the chunk runs and their merge spelled out too.
* :func:`torch_dense_oracle` — the float64 attention of :func:`dense_oracle` written with
  torch (``torch.softmax``), for the sim tests.

Decode error budget against the float64 oracle (O(1) data), per output element::

    |out - ref| <= 2^-8 |ref| + 2^-8 (1 + 2^-6) A,   A = sum_i p_i |v_i| / sum_i p_i

BF16's unit roundoff is 2^-8 (8 significant bits): 2^-8|ref| is the final BF16 rounding,
2^-8 A the BF16 rounding of P before P.V, 2^-14 A covers every FP32 step (scores, exp, sums,
merge), which is > 100x their size here.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

BF = ml_dtypes.bfloat16
BY = 128
F32, F64 = np.float32, np.float64


def _bf16(x) -> np.ndarray:
    return np.asarray(x, dtype=F32).astype(BF)


# ----------------------------------------------------------------------------- indexer
def inject(scores_per_head: np.ndarray):
    """idx_q/idx_k whose kernel scores are exactly ``scores_per_head`` ``[4, nb*128]`` (BF16)."""
    nkeys = scores_per_head.shape[1]
    q = np.zeros((4, 128), dtype=F32)
    q[np.arange(4), np.arange(4)] = 1.0
    k = np.zeros((nkeys, 128), dtype=F32)
    k[:, :4] = scores_per_head.T
    return _bf16(q), _bf16(k)


def oracle_select(scores, nb, seq_len=None, per_head=False):
    """Brute force: per-block max with Python loops, then sorted() by (-score, id)."""
    scores = np.asarray(scores, dtype=F64)
    valid = nb * BY if seq_len is None else seq_len

    def block_max(rows):
        out = []
        for j in range(nb):
            best = -math.inf
            for h in rows:
                for t in range(j * BY, min((j + 1) * BY, valid)):
                    best = max(best, scores[h, t])
            out.append(best)
        return out

    def pick(bs):
        if nb <= 16:
            return list(range(nb))
        ranked = sorted(range(nb - 1), key=lambda j: (-bs[j], j))
        return ranked[:15] + [nb - 1]

    if per_head:
        return [pick(block_max([h])) for h in range(4)]
    return [pick(block_max(range(4)))]


# ----------------------------------------------------------------------------- decode
def dense_oracle(q, k, v, ids, seq):
    """float64 reference; returns (out, A, visible_any) with out/A ``[B, HQ, D]``."""
    batch, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    seq = np.broadcast_to(np.asarray(seq), (batch,))
    out = np.zeros((batch, hq, d))
    amag = np.zeros((batch, hq, d))
    any_vis = np.zeros(batch, bool)
    for b in range(batch):
        pos = (ids[b].astype(np.int64)[:, None] * BY + np.arange(BY)).reshape(-1)
        vis = pos < seq[b]
        any_vis[b] = vis.any()
        if not vis.any():
            continue
        kk = k[b][:, ids[b]].reshape(hkv, -1, d).astype(F64)[:, vis]
        vv = v[b][:, ids[b]].reshape(hkv, -1, d).astype(F64)[:, vis]
        head_kv = np.arange(hq) // g
        s = np.einsum("hd,hld->hl", q[b].astype(F64), kk[head_kv]) / np.sqrt(d)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        den = p.sum(axis=1, keepdims=True)
        out[b] = np.einsum("hl,hld->hd", p, vv[head_kv]) / den
        amag[b] = np.einsum("hl,hld->hd", p, np.abs(vv[head_kv])) / den
    return out, amag, any_vis


def assert_in_budget(out, ref, amag):
    """The decode budget of the module docstring; returns the worst error / budget ratio."""
    err = np.abs(np.asarray(out).astype(F64) - ref)
    budget = 2.0**-8 * np.abs(ref) + 2.0**-8 * (1 + 2.0**-6) * amag
    ratio = np.divide(err, budget, out=np.where(err > 0, np.inf, 0.0), where=budget > 0)
    worst = np.max(ratio)
    assert worst <= 1.0, f"error {worst:.3f} x budget"
    return worst


def _slot_mask(row_ids, seq_len: int) -> np.ndarray:
    """FP32 keep-mask of one batch row, slot by slot (current block partly, later blocks not)."""
    cur = (seq_len - 1) // BY
    cur_valid = seq_len - cur * BY
    mask = np.ones(len(row_ids) * BY, F32)
    for j, blk in enumerate(row_ids):
        if blk == cur:
            mask[j * BY + cur_valid : (j + 1) * BY] = 0
        elif blk > cur:
            mask[j * BY : (j + 1) * BY] = 0
    return mask


def _merge(state, part):
    """The online merge of two FP32 ``(m, l, o)`` states, step by step."""
    if state is None:
        return part
    m, l, o = state
    mx, ls, oc = part
    mn = np.maximum(m, mx)
    a, bb = np.exp(m - mn), np.exp(mx - mn)
    return mn, a * l + bb * ls, o * a + oc * bb


def _loop_head(qq, kk, vv, mask, stop, ntile, kv_splits=1):
    """One (batch row, KV head): explicit chunk loop, K-step loop and online merge. With
    ``kv_splits``: the chunk starts dealt into ``ceil(chunks / kv_splits)``-long runs, one
    merge state per run, then the runs' states merged in run order."""
    starts = list(range(0, stop, ntile))
    per = -(-len(starts) // kv_splits)
    states = []
    for r0 in range(0, len(starts), per):
        states.append(_loop_run(qq, kk, vv, mask, starts[r0 : r0 + per], ntile))
    total = None
    for st in states:
        total = _merge(total, st)
    m, l, o = total
    return o / l


def _loop_run(qq, kk, vv, mask, starts, ntile):
    """The chunks at ``starts`` folded into one unnormalised ``(m, l, o)``."""
    scale, neg = F32(1 / np.sqrt(qq.shape[1])), F32(-3.0e38)
    state = None
    for c0 in starts:
        kc, vc, mc = kk[c0 : c0 + ntile], vv[c0 : c0 + ntile], mask[c0 : c0 + ntile]
        s = (qq @ kc.T).astype(F32) * scale
        s = s * mc + (mc * F32(-1) + F32(1)) * neg
        mx = s.max(axis=1, keepdims=True)
        p = np.exp(s - mx)
        ls = p.astype(F64).sum(axis=1, keepdims=True).astype(F32)
        pb = p.astype(BF).astype(F64)
        oc = None
        for k0 in range(0, kc.shape[0], 128):
            part = pb[:, k0 : k0 + 128] @ vc[k0 : k0 + 128]
            oc = part.astype(F32) if oc is None else oc + part.astype(F32)
        state = _merge(state, (mx, ls, oc))
    return state


def loop_kernel(q, k, v, ids, seq, ntile=512, seeds_compat=False, kv_splits=1):
    """The kernel, one (batch row, KV head) at a time, every loop spelled out (``kv_splits``:
    split-KV, see :func:`_loop_head`)."""
    batch, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    sel = ids.shape[1] * BY
    seq = np.broadcast_to(np.asarray(seq), (batch,))
    out = np.zeros((batch, hq, d), F32)
    stop = sel - sel % ntile if seeds_compat else sel
    for b in range(batch):
        mask = _slot_mask(ids[b], int(seq[b]))
        for h in range(hkv):
            kk = np.concatenate([k[b, h, blk] for blk in ids[b]]).astype(F64)
            vv = np.concatenate([v[b, h, blk] for blk in ids[b]]).astype(F64)
            qq = q[b, h * g : (h + 1) * g].astype(F64)
            res = _loop_head(qq, kk, vv, mask, stop, ntile, kv_splits)
            if not seeds_compat and not mask.any():
                res[:] = 0
            out[b, h * g : (h + 1) * g] = res
    return out.astype(BF)


def torch_dense_oracle(q, kb, vb, ids, seq):
    """float64 softmax attention over the visible tokens of the selected blocks (torch)."""
    import torch

    b, hq, d = q.shape
    hkv = kb.shape[1]
    g = hq // hkv
    out = torch.zeros(b, hq, d, dtype=torch.float64)
    for r in range(b):
        blocks = ids[r].long()
        pos = (blocks[:, None] * 128 + torch.arange(128)[None, :]).reshape(-1)
        vis = pos < seq[r]
        if not bool(vis.any()):
            continue
        for h in range(hkv):
            k = kb[r, h, blocks].reshape(-1, d).double()[vis]
            v = vb[r, h, blocks].reshape(-1, d).double()[vis]
            s = q[r, h * g : (h + 1) * g].double() @ k.T / 128**0.5
            out[r, h * g : (h + 1) * g] = torch.softmax(s, dim=-1) @ v
    return out


__all__ = [
    "assert_in_budget",
    "dense_oracle",
    "inject",
    "loop_kernel",
    "oracle_select",
    "torch_dense_oracle",
]
