"""The seeds-style torch goldens the bench times the references against.

Plain torch written the way the seeds' tests (hicann/pypto-gym) write their goldens: Python
loops per expert (MoE), per batch (MSA decode), per head x query block x slot (MSA main
branch), per (batch, query token) x KV tile (DeepSeek); FP32 torch math on CPU. MoE and
DeepSeek use the family oracles (``tests/oracles/moe.py``, ``tests/oracles/dsa.py``); the MSA
ones are written here, because ``tests/oracles/msa*.py`` hold float64 dense oracles, not the
seeds' FP32 loops (see :data:`SOURCES`). Each golden is judged against the reference with the
case's own tolerance (:func:`check`), so the timings compare like with like.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def _torch():
    import torch

    return torch


def t_of(a: np.ndarray):
    """NumPy/ml_dtypes array -> torch tensor with the same bits (bf16, fp8 via raw views)."""
    torch = _torch()
    a = np.ascontiguousarray(a)
    name = a.dtype.name
    if name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    if name == "float8_e4m3fn":
        return torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn)
    return torch.from_numpy(a)


def np_of(t) -> np.ndarray:
    """torch tensor -> NumPy (bf16 via ml_dtypes); NumPy arrays pass through."""
    import ml_dtypes

    if isinstance(t, np.ndarray):
        return t
    torch = _torch()
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


# ---------------------------------------------------------------------------------------------
# plain torch goldens, the seeds' way (loops in Python, FP32 math)


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


def _dsa_tiling(args: dict):
    """The DeepSeek op's tile preset: its ``tiling`` argument or the documented default."""
    cfg = args.get("tiling")
    if cfg is None:
        from tilesim.shared import SaTileShapeConfig

        cfg = SaTileShapeConfig.from_env()
    return cfg


#: where each op's torch golden comes from (listed in the bench report)
SOURCES = {
    "moe_grouped_gemm": "oracles.moe:torch_seed_golden",
    "msa_indexer": "bench.goldens:torch_msa_indexer",
    "msa_sparse_decode": "bench.goldens:torch_msa_decode",
    "msa_main_branch": "bench.goldens:torch_msa_main",
    "sparse_attention_antiquant": "oracles.dsa:torch_golden",
}


def torch_golden_for(built) -> Callable[[], object] | None:
    """A no-argument callable running the torch golden of a built case (``None``: none)."""
    a, op, case = built.op_args, built.op_name, built.case
    if op == "moe_grouped_gemm":
        from oracles.moe import torch_seed_golden

        rnd = bool(built.meta.get("seed_golden_round_activation", True))
        return lambda: torch_seed_golden(case, rnd)
    if op == "msa_indexer":
        return lambda: torch_msa_indexer(a)
    if op == "msa_sparse_decode":
        return lambda: torch_msa_decode(a)
    if op == "msa_main_branch":
        ids = built.meta.get("topk_indices")
        if ids is None:  # the builder did not say which blocks it selected
            return None
        ids = np.asarray(ids).ravel()
        return lambda: torch_msa_main(a, ids)
    if op.startswith("sparse_attention_antiquant"):
        from oracles.dsa import torch_golden

        cfg = _dsa_tiling(a)
        return lambda: torch_golden(case, cfg.s_kv_tile, cfg.softmax)
    return None


def check(built, ref_out: np.ndarray, torch_out) -> str:
    """The torch golden judged against the reference with the case's tolerance rule."""
    from tilesim.reference import compare

    tol = built.tolerance
    t = np_of(torch_out)
    r = np.asarray(ref_out)
    if tol["mode"] == "set":
        ok = np.array_equal(np.sort(r, axis=-1), np.sort(t, axis=-1))
        return "same block set" if ok else "DIFFERENT block set"
    if tol["mode"] != "compare":
        return f"not judged (tolerance mode {tol['mode']!r})"
    rep = compare(
        r.astype(np.float32),
        t.astype(np.float32),
        atol=tol["atol"],
        rtol=tol["rtol"],
        ratio=tol["ratio"],
        check_dtype=False,
    )
    verdict = "agrees" if rep.passed else "DISAGREES"
    return (
        f"{verdict} ({rep.n_fail} > tol, allowed {rep.threshold}; "
        f"max abs err {rep.max_abs_err:.2g})"
    )
