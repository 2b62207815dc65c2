"""Independent oracles of DeepSeek-V3.2 sparse attention, shared by the tests.

Neither shares code with ``tilesim.reference.dsa*`` or ``tilesim.shared.dsa``: each decodes
the cache bytes itself (the byte offsets of the packed layouts are written out here) and walks
the block table with plain Python.

* :func:`oracle` — float64, dense: dequantize (``bf16(fp32(q) * scale)``, the defined rounding
  point of the cache), one float64 softmax per query token, no tiling. :func:`check_budget`
  judges a result against it. Error budget (``docs/ops/dsa.md``), per
  element, with ``u = 2^-8`` the BF16 unit roundoff, ``p`` the exact softmax weights, ``v``
  the values and ``o = sum p v``:

  - hard (worst case, both softmax modes): ``|ref - o| <= u |o| + 1.02 * 2u * sum p |v|`` —
    the final BF16 rounding, the BF16 rounding of P, and in per-tile mode the BF16 C2 output;
    the FP32 steps fit in the 2 % slack.
  - typical (rounding errors of the 2048 P values are independent): ``|ref - o| <= u |o| +
    4 u sqrt(sum p^2 v^2)`` for at least 99.9 % of the elements.

* :func:`torch_golden` — the seeds' golden written in torch, tile by tile (the DeepSeek tests
  of ``hicann/pypto-gym``): FP32 ``torch.matmul`` (torch's own accumulation order),
  ``torch.exp``, the online merge with ``L = L*a + l*c``, or the per-tile normalised softmax
  with a BF16 C2 output (one tile, as the seeds' per-tile golden).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
from tilesim.reference.util.blas_pool import blas_threads
from tilesim.shared.interop import to_numpy, to_torch

BF16 = np.dtype(ml_dtypes.bfloat16)
U = 2.0**-8

# byte offsets of (nope, rope, scales) per packed layout, written out independently
_OFFSETS = {"pypto": (0, 512, 640), "flashmla": (0, 528, 512)}


def decode_rows(inputs: dict, layout: str, rows: list[int]):
    """(quantized nope as float32 [n,512], rope float64 [n,64], scales float32 [n,4])."""
    if "kn_quant" in inputs:
        q = inputs["kn_quant"][rows].astype(np.float32)
        rope = inputs["kr"][rows].astype(np.float64)
        sc = inputs["kn_scales"][rows].astype(np.float32)
        return q, rope, sc
    cache = inputs["nope_cache"]
    raw = cache.view(np.uint8)[rows]
    o_n, o_r, o_s = _OFFSETS[layout]
    q = raw[:, o_n : o_n + 512].copy().view(cache.dtype).astype(np.float32)
    rope = raw[:, o_r : o_r + 128].copy().view("<u2").view(BF16).astype(np.float64)
    sc = raw[:, o_s : o_s + 16].copy().view("<f4").astype(np.float32)
    return q, rope, sc


def oracle(case: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """See :func:`_oracle` (BLAS pinned to one thread: small GEMMs on a busy box)."""
    with blas_threads():
        return _oracle(case)


def _oracle(case: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float64 ``(o, m1, m2)``, each ``[T*nq, 512]``: the exact output, ``sum p|v|`` and
    ``sqrt(sum p^2 v^2)``."""
    inp, prm = case["inputs"], case["params"]
    layout = prm.get("layout", "kv_split")
    nq, topk, bs = prm["nq"], prm["topk"], prm["block_size"]
    acts = [int(a) for a in inp["kv_act_seqs"]]
    s1 = inp["topk_indices"].shape[0] // len(acts)
    qn = inp["query_nope"].astype(np.float64)
    qr = inp["query_rope"].astype(np.float64)
    o = np.zeros((qn.shape[0], 512))
    m1 = np.zeros_like(o)
    m2 = np.zeros_like(o)
    for b, act in enumerate(acts):
        for s in range(s1):
            r = b * s1 + s
            cur = min(max(act - s1 + 1 + s, 0), topk)
            pos = [int(p) for p in inp["topk_indices"][r, :cur] if p != -1]
            if not pos:
                continue
            rows = [int(inp["block_table"][b, p // bs]) * bs + p % bs for p in pos]
            q, rope, sc = decode_rows(inp, layout, rows)
            kn = (q.reshape(-1, 4, 128) * sc[:, :, None]).reshape(-1, 512)
            kn = kn.astype(BF16).astype(np.float64)
            keys = np.concatenate([kn, rope], axis=1)
            hs = slice(r * nq, (r + 1) * nq)
            qq = np.concatenate([qn[hs], qr[hs]], axis=1)
            logits = qq @ keys.T * prm["softmax_scale"]
            w = np.exp(logits - logits.max(axis=1, keepdims=True))
            w /= w.sum(axis=1, keepdims=True)
            o[hs] = w @ kn
            m1[hs] = w @ np.abs(kn)
            m2[hs] = np.sqrt((w * w) @ (kn * kn))
    return o, m1, m2


def check_budget(ref: np.ndarray, o: np.ndarray, m1: np.ndarray, m2: np.ndarray) -> dict:
    """Assert the hard and typical budgets; return statistics."""
    err = np.abs(ref.astype(np.float64) - o)
    hard = U * np.abs(o) + 1.02 * 2 * U * m1
    assert np.isfinite(ref.astype(np.float32)).all()
    worst = float(np.max(err / np.maximum(hard, 1e-300)))
    assert (err <= hard).all(), f"hard budget exceeded: max err/budget {worst:.3f}"
    typical = U * np.abs(o) + 4 * U * m2
    frac_out = float((err > typical).mean())
    assert frac_out <= 1e-3, f"{100 * frac_out:.3f}% of elements beyond the typical budget"
    return {"worst_hard": worst, "beyond_typical": frac_out}


def _gather(inputs: dict, layout: str, offs):
    """(kv bf16 [n,512], kr bf16 [n,64]) of physical rows ``offs`` (torch int64)."""
    import torch

    if "kn_quant" in inputs:
        nope = to_torch(inputs["kn_quant"])[offs]
        kr = to_torch(inputs["kr"])[offs]
        scales = to_torch(inputs["kn_scales"])[offs]
    else:
        raw = to_torch(inputs["nope_cache"].view(np.uint8))[offs]
        o_n, o_r, o_s = _OFFSETS[layout]
        qdt = torch.int8 if inputs["nope_cache"].dtype == np.int8 else torch.float8_e4m3fn
        nope = raw[:, o_n : o_n + 512].contiguous().view(qdt)
        kr = raw[:, o_r : o_r + 128].contiguous().view(torch.bfloat16)
        scales = raw[:, o_s : o_s + 16].contiguous().view(torch.float32)
    kv = (nope.reshape(-1, 128).to(torch.float32) * scales.reshape(-1, 1)).to(torch.bfloat16)
    return kv.reshape(-1, 512), kr


def torch_golden(case: dict, tile: int, mode: str) -> np.ndarray:
    """The seeds' torch golden of ``case`` with KV tiles of ``tile`` keys, ``mode`` "online" or
    "per_tile" (one tile per token)."""
    import torch

    inp, prm = case["inputs"], case["params"]
    layout = prm.get("layout", "kv_split")
    nq, topk, bs, scale = prm["nq"], prm["topk"], prm["block_size"], prm["softmax_scale"]
    acts = [int(a) for a in inp["kv_act_seqs"]]
    s1 = inp["topk_indices"].shape[0] // len(acts)
    q = torch.cat([to_torch(inp["query_nope"]), to_torch(inp["query_rope"])], dim=1)
    ti = torch.from_numpy(inp["topk_indices"].astype(np.int64))
    bt = torch.from_numpy(inp["block_table"].astype(np.int64))
    out = torch.zeros(q.shape[0], 512, dtype=torch.bfloat16)
    for b, act in enumerate(acts):
        for s in range(s1):
            r = b * s1 + s
            cur = min(max(act - s1 + 1 + s, 0), topk)
            qi = q[r * nq : (r + 1) * nq].to(torch.float32)
            acc = None
            n_tiles = math.ceil(cur / tile)
            for t in range(n_tiles):
                idx = ti[r, t * tile : min(cur, (t + 1) * tile)]
                offs = bt[b, idx // bs] * bs + idx % bs
                kv, kr = _gather(inp, layout, offs)
                k = torch.cat([kv, kr], dim=1).to(torch.float32)
                sij = torch.matmul(qi, k.T) * scale
                m = sij.amax(dim=-1, keepdim=True)
                p = torch.exp(sij - m)
                l = p.sum(dim=-1, keepdim=True)
                if mode == "per_tile":
                    pn = (p / l).to(torch.bfloat16).to(torch.float32)
                    o_t = torch.matmul(pn, kv.to(torch.float32)).to(torch.bfloat16)
                    assert n_tiles == 1  # the seeds' per-tile golden: one tile
                    out[r * nq : (r + 1) * nq] = o_t
                    continue
                o_t = torch.matmul(p.to(torch.bfloat16).to(torch.float32), kv.to(torch.float32))
                if acc is None:
                    acc = [o_t, l, m]
                else:
                    o_old, l_old, m_old = acc
                    m_new = torch.maximum(m_old, m)
                    a = torch.exp(m_old - m_new)
                    c = torch.exp(m - m_new)
                    acc = [o_old * a + o_t * c, l_old * a + l * c, m_new]
            if mode == "online" and acc is not None:
                out[r * nq : (r + 1) * nq] = (acc[0] / acc[1]).to(torch.bfloat16)
    return to_numpy(out)


__all__ = ["U", "check_budget", "decode_rows", "oracle", "torch_golden"]
