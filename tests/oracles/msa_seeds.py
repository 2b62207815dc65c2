"""The seeds-style torch goldens of the MSA family: plain torch written the way the seeds'
tests (hicann/pypto-gym, see docs/sources.md) write them — Python loops per batch row (decode),
per head x query block x slot (main branch), FP32 torch math on the CPU. The bench times the
references against them; they call nothing of tilesim.
"""

from __future__ import annotations

import numpy as np

from oracles.torch_io import _torch, t_of


def torch_msa_indexer(args: dict):
    """BF16 score matmul, block max, head max, top-15 + local block (docs/sources.md, "MSA
    lightning indexer")."""
    torch = _torch()
    q, k, nb = t_of(args["idx_q"]), t_of(args["idx_k"]), int(args["nb"])
    sc = torch.matmul(q, k.T)  # BF16 result, as the seeds' reference
    blk = sc.float().view(q.shape[0], nb, 128).amax(-1).amax(0)
    if nb <= 16:
        return torch.arange(nb, dtype=torch.int32).view(1, nb)
    top = torch.topk(blk[: nb - 1], 15).indices
    return torch.cat([top, torch.tensor([nb - 1])]).to(torch.int32).view(1, 16)


def torch_msa_decode(args: dict):
    """A gather-then-attend oracle like the seeds' decode test, one batch row at a time
    (docs/sources.md, "MSA sparse decode")."""
    torch = _torch()
    q, kb, vb = t_of(args["q"]), t_of(args["k_blocks"]), t_of(args["v_blocks"])
    ids = np.asarray(args["block_ids"]).astype(np.int64)
    bsz, hq, d = q.shape
    hkv, by = kb.shape[1], kb.shape[3]
    seq = np.broadcast_to(np.asarray(args["seq_len"]), (bsz,))
    out = torch.zeros(bsz, hq, d)
    scale = d**-0.5
    for b in range(bsz):
        sel = torch.from_numpy(ids[b])
        cur = (int(seq[b]) - 1) // by
        valid = int(seq[b]) - cur * by
        kg = kb[b][:, sel].reshape(hkv, -1, d).repeat_interleave(hq // hkv, 0).float()
        vg = vb[b][:, sel].reshape(hkv, -1, d).repeat_interleave(hq // hkv, 0).float()
        s = (q[b].float().unsqueeze(1) @ kg.transpose(1, 2)).squeeze(1) * scale  # [HQ, keys]
        for j, blk in enumerate(ids[b].tolist()):
            if blk == cur:
                s[:, j * by + valid : (j + 1) * by] = -torch.inf
            elif blk > cur:
                s[:, j * by : (j + 1) * by] = -torch.inf
        p = torch.softmax(s, -1)
        out[b] = (p.unsqueeze(1) @ vg).squeeze(1)
    return out


def torch_msa_main(args: dict, topk_indices: np.ndarray):
    """The seeds-style main-branch golden: per head, per query block, per reachable slot
    (docs/sources.md, "MSA main branch"): scores of each slot, causal mask on the diagonal
    block, one softmax over the concatenated slots, times the concatenated V."""
    torch = _torch()
    q = torch.from_numpy(np.asarray(args["query"], dtype=np.float32))
    kb = torch.from_numpy(np.asarray(args["key_blocks"], dtype=np.float32))
    vb = torch.from_numpy(np.asarray(args["value_blocks"], dtype=np.float32))
    n, hq, d = q.shape
    bk = 128
    nbk = -(-n // bk)
    hkv = kb.shape[1]
    sel = [int(x) for x in topk_indices]
    qpad = torch.zeros(nbk * bk, hq, d)
    qpad[:n] = q
    causal = torch.triu(torch.full((bk, bk), -1e9), diagonal=1)
    scale = d**-0.5
    out = torch.zeros(n, hq, d)
    for h in range(hq):
        hk = h // (hq // hkv)
        for qb in range(nbk):
            qh = qpad[qb * bk : (qb + 1) * bk, h]
            ss, vs = [], []
            for i, kv in enumerate(sel):
                if kv > qb:
                    continue
                s = qh @ kb[i * bk : (i + 1) * bk, hk].T * scale
                if kv == qb:
                    s = s + causal
                ss.append(s)
                vs.append(vb[i * bk : (i + 1) * bk, hk])
            if not ss:
                continue
            p = torch.softmax(torch.cat(ss, -1), -1)
            o = p @ torch.cat(vs, 0)
            rows = min(bk, n - qb * bk)
            out[qb * bk : qb * bk + rows, h] = o[:rows]
    return out
