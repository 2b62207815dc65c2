"""MiniMax-M3 MSA main branch: prefill attention over the selected blocks (``op-facts`` §4).

Two public ops:

* :func:`build_msa_block_mask` — the host's FP32 additive mask ``[ceil(n/bk), topk, bk, bk]``
  (future block -1e9, diagonal block lower-triangular, past blocks 0, rows past ``n`` and
  padding slots -1e9).
* :func:`msa_main_branch` — the kernel behind its wrapper. Wrapper: ``block_mask`` transposed
  to ``[ceil(n/bk)*bk, topk*bk]`` and padded with -1e9 rows to ``[max_n, topk*bk]``; q, k, v cast
  to FP16/BF16 unless ``dtype="fp32"``. Kernel loop nest::

      for hg in 64 query heads (h_kv = hg // 16), all query rows on the cube M axis:
          for c in NTILE-wide key chunks:                        (online softmax)
              raw = fp32(Q_h @ K_c^T)                 cube, FP32 out
              S   = raw * scale + mask[:, chunk]      FP32 (scale = fp32(dh^-0.5))
              m_c = rowmax(S); P = exp(S - m_c); l_c = rowsum(P)      FP32
              PV  = fp32(cast(P) @ V_c)               cast: identity / FP16 / BF16; FP32
                                                      accumulation in 128-key K steps
              merge (m, l, O)                         FP32
          out = O / l                                 FP32 (output stays FP32)

tilesim batches the 16 heads of a KV group (and blocks of query rows) into one matmul per
chunk and runs the (KV head, row block) items on the reference worker pool
(:func:`tilesim.reference.blas_pool.map_in_order`); the chunk loop stays explicit. K steps
that no row of a row block sees (future blocks, padding slots) are skipped when that provably
changes no bit (:func:`_may_skip_dead_keys`; never with a trace hook or ``seeds_compat``).
Deliberate differences from the seeds' kernel
(``docs/ops/msa.md``): a last partial chunk is processed when ``topk*bk`` is not a multiple of
NTILE (``seeds_compat=True`` drops it, as the kernel does), and a query row that sees no
selected key returns zeros (the kernel's arithmetic gives the mean of V there).
"""

from __future__ import annotations

import math

import numpy as np
from tilesim.reference.blas_pool import blas_threads, map_in_order
from tilesim.reference.msa_common import (
    F16,
    K_STEP,
    as_array,
    back,
    check_dtype,
    check_int_array,
    check_ndim,
    check_pos_int,
    check_trace,
    chunk_bounds,
    cube_matmul,
    online_merge,
    softmax_chunk,
    widen64,
)
from tilesim.shared.casts import BF16, FP32, to_bf16, widen_to_fp32
from tilesim.shared.models import MINIMAX_M3
from tilesim.shared.tiling import MSA_DTYPES, MsaTiling

_CFG = MINIMAX_M3.msa
MASK_NEG = np.float32(_CFG.prefill_mask_neg)  # -1e9, exact in FP32

#: query rows per batched step (no numeric effect: rows never interact); one query block of the
#: seeds' cases, so the dead-key skipping below works at block granularity
ROW_BLOCK = 128
#: largest ``|q|*|k|*scale`` for which a -1e9 mask entry provably gives ``exp(S - m) == 0``
DEAD_KEY_SCORE_BOUND = 1e8


def build_msa_block_mask(n, topk_indices, *, bk=128, topk=16):
    """The host's additive block mask of the main branch (``op-facts`` §4.4).

    Args:
        n: query (= key) length of the sequence, ``>= 1``.
        topk_indices: 1-D integer ids of the ``ksel <= topk`` selected blocks in slot order,
            unique, each in ``[0, ceil(n/bk))`` (numpy or torch CPU).
        bk: block size; topk: slots (slots ``>= ksel`` are zero padding).

    Returns:
        FP32 ``[ceil(n/bk), topk, bk, bk]``: entry ``[qb, i, r, c]`` is 0 when slot ``i`` is
        real, query row ``qb*bk + r < n`` and block ``topk_indices[i]`` is before ``qb``, or
        equals ``qb`` with ``c <= r``; -1e9 otherwise. Same kind as ``topk_indices``.
    """
    n = check_pos_int(n, "n")
    bk = check_pos_int(bk, "bk")
    topk = check_pos_int(topk, "topk")
    ids, torch_out = as_array(topk_indices, "topk_indices")
    check_int_array(ids, "topk_indices")
    check_ndim(ids, "topk_indices", 1, "[ksel] of selected block ids")
    nbq = math.ceil(n / bk)
    ksel = ids.shape[0]
    if not 1 <= ksel <= topk:
        raise ValueError(f"topk_indices: expected 1..topk={topk} ids, got {ksel}")
    if ids.min() < 0 or ids.max() >= nbq:
        raise ValueError(
            f"topk_indices: expected ids in [0, ceil(n/bk)={nbq}), got min {ids.min()} "
            f"max {ids.max()}"
        )
    if np.unique(ids).size != ksel:
        raise ValueError(f"topk_indices: expected unique ids, got {ids.tolist()}")

    last_valid = n - (nbq - 1) * bk  # rows of the last query block
    mask = np.full((nbq, topk, bk, bk), MASK_NEG, dtype=FP32)
    r = np.arange(bk)[:, None]
    c = np.arange(bk)[None, :]
    for qb in range(nbq):
        qb_valid = last_valid if qb == nbq - 1 else bk
        for i in range(ksel):
            kv = int(ids[i])
            if kv > qb:
                continue  # future block: stays masked
            if kv == qb:
                allowed = c <= r  # diagonal block: causal
            else:
                allowed = np.ones((bk, bk), dtype=bool)
            allowed = allowed & (r < qb_valid)
            mask[qb, i][allowed] = 0.0
    return back(mask, torch_out)


def _cast_inputs(a: np.ndarray, dtype: str) -> np.ndarray:
    """The wrapper's cast of q / k / v (FP32 mode: exact widening only)."""
    a32 = widen_to_fp32(a)
    if dtype == "fp16":
        with np.errstate(over="ignore"):
            return a32.astype(F16)
    if dtype == "bf16":
        return to_bf16(a32)
    return a32


def kernel_mask(block_mask: np.ndarray, max_n: int) -> np.ndarray:
    """The wrapper's ``[max_n, topk*bk]`` FP32 mask: transpose(1, 2), reshape, pad with -1e9."""
    nbq, topk, bk, _ = block_mask.shape
    m2 = block_mask.transpose(0, 2, 1, 3).reshape(nbq * bk, topk * bk)
    pad = np.full((max_n - nbq * bk, topk * bk), MASK_NEG, dtype=FP32)
    return np.concatenate([m2, pad], axis=0)


def _may_skip_dead_keys(q64, k64, v64, mask: np.ndarray, scale: np.float32) -> bool:
    """True when dropping the K steps that every row of a row block has masked changes no bit.

    A masked score is ``raw*scale + (-1e9)``; a visible one is ``raw*scale + 0``. When the mask
    holds only 0 and -1e9 and ``|raw*scale| <= DEAD_KEY_SCORE_BOUND`` (Cauchy-Schwarz on the row
    norms), a masked key of a row that also sees a key in the chunk gets ``P = exp(S - m) = 0``
    exactly, so its column adds exact zeros to ``l`` and to every K step of ``P.V`` (V must be
    finite: ``0 * inf`` is NaN). A chunk in which a row sees nothing is erased by the online merge
    (its weight ``exp(-1e9 - m')`` is 0), whatever keys it held. Either way the output bits do not
    depend on whether those keys were computed.
    """
    if not ((mask == 0) | (mask == MASK_NEG)).all():
        return False
    if not (np.isfinite(q64).all() and np.isfinite(k64).all() and np.isfinite(v64).all()):
        return False
    q_norm = float(np.sqrt(np.einsum("hrd,hrd->hr", q64, q64).max()))  # q64: [HKV, rows, dh]
    k_norm = float(np.sqrt(np.einsum("hdk,hdk->hk", k64, k64).max()))  # k64: [HKV, dh, kv]
    return q_norm * k_norm * float(scale) * (1 + 1e-6) <= DEAD_KEY_SCORE_BOUND


def live_key_steps(visible: np.ndarray, c0: int, w: int) -> np.ndarray | None:
    """Key columns (chunk-relative) of the K steps some row of ``visible`` ``[rows, kv]`` sees.

    Whole :data:`K_STEP` groups counted from the chunk start are kept or dropped, so the P.V
    K-step boundaries of the kept keys are the kernel's. ``None``: every group is live.
    """
    seen = visible[:, c0 : c0 + w].any(axis=0)
    starts = range(0, w, K_STEP)
    live = [k0 for k0 in starts if seen[k0 : k0 + K_STEP].any()]
    if len(live) == len(starts):
        return None
    if not live:
        return np.empty(0, dtype=np.intp)
    return np.concatenate([np.arange(k0, min(w, k0 + K_STEP)) for k0 in live])


def msa_main_branch(
    query,
    key_blocks,
    value_blocks,
    block_mask,
    *,
    dtype: str | None = None,
    max_n: int | None = None,
    tiling: MsaTiling | None = None,
    seeds_compat: bool = False,
    trace=None,
):
    """MSA prefill attention with a precomputed block mask.

    Args:
        query: ``[n, 64, 128]`` (``[n, HQ, dh]``) FP32 (FP16/BF16 accepted, widened exactly).
        key_blocks, value_blocks: ``[topk*bk, 4, 128]`` (``[topk*bk, HKV, dh]``): row
            ``i*bk + t`` is token ``t`` of the block in slot ``i`` (zeros for padding slots).
        block_mask: FP32 ``[ceil(n/bk), topk, bk, bk]`` from :func:`build_msa_block_mask`
            (any finite additive mask works; a key counts as visible when its entry is > -1e9).
        dtype: ``"fp32"``, ``"fp16"`` or ``"bf16"``: the wrapper's cast of q, k, v and the cast of
            P before P.V. ``None``: ``tiling.dtype`` (``MSA_DTYPE``).
        max_n: the kernel's compiled row count, a multiple of bk and ``>= ceil(n/bk)*bk``.
            ``None``: ``tiling.max_n`` (``MSA_MAX_N``, default 2048).
        tiling: :class:`MsaTiling`; ``None`` means ``MsaTiling.from_env()`` at call time.
        seeds_compat: ``True`` reproduces the seeds' kernel where tilesim deliberately differs:
            the ``topk*bk mod NTILE`` tail keys are dropped (``ValueError`` when no whole chunk
            fits) and a row that sees no key keeps the kernel's arithmetic (mean of V).
        trace: called once per (query head, chunk), in the kernel's order, with
            ``{"op": "msa_main_branch", "head", "kv_head", "chunk", "kv_start", "kv_len",
            "row_max", "row_sum"}`` (``row_max``/``row_sum``: the chunk's FP32 ``m_c``/``l_c``
            for the ``n`` query rows).

    Returns:
        FP32 ``[n, HQ, dh]`` (same kind, numpy or torch, as ``query``).

    Rounding points: inputs cast to ``dtype``; scores FP32 (float64 sum of exact products,
    rounded once); scale multiply and mask add FP32; exp FP32; P cast to ``dtype``; P.V FP32
    accumulation per 128-key K step; merge and final division FP32.
    """
    check_trace(trace)
    tiling = MsaTiling.from_env() if tiling is None else tiling
    if not isinstance(tiling, MsaTiling):
        raise TypeError(f"tiling: expected a MsaTiling or None, got {type(tiling).__name__}")
    if not isinstance(seeds_compat, (bool, np.bool_)):
        raise TypeError(f"seeds_compat: expected a bool, got {seeds_compat!r}")
    dtype = tiling.dtype if dtype is None else dtype
    if dtype not in MSA_DTYPES:
        raise ValueError(f"dtype: expected one of {MSA_DTYPES}, got {dtype!r}")

    qa, q_torch = as_array(query, "query")
    ka, k_torch = as_array(key_blocks, "key_blocks")
    va, v_torch = as_array(value_blocks, "value_blocks")
    ma, m_torch = as_array(block_mask, "block_mask")
    torch_out = q_torch or k_torch or v_torch or m_torch
    floats = (FP32, F16, BF16)
    for name, a in (("query", qa), ("key_blocks", ka), ("value_blocks", va)):
        check_dtype(a, name, floats)
    check_dtype(ma, "block_mask", (FP32,))
    check_ndim(qa, "query", 3, "[n, HQ, dh]")
    check_ndim(ka, "key_blocks", 3, "[topk*bk, HKV, dh]")
    check_ndim(ma, "block_mask", 4, "[ceil(n/bk), topk, bk, bk]")
    n, hq, dh = qa.shape
    if n < 1 or hq < 1 or dh < 1:
        raise ValueError(f"query: expected a non-empty [n, HQ, dh] array, got shape {qa.shape}")
    nbq, topk, bk, bk2 = ma.shape
    if bk2 != bk or bk < 1 or topk < 1 or nbq != math.ceil(n / bk):
        raise ValueError(
            f"block_mask: expected shape ({math.ceil(n / max(bk, 1))}, topk, bk, bk) for "
            f"n={n}, got {ma.shape}"
        )
    kv_len, hkv, kdh = ka.shape
    if kv_len != topk * bk or kdh != dh or hkv < 1:
        raise ValueError(
            f"key_blocks: expected shape ({topk * bk}, HKV, {dh}) (topk*bk rows, query's dh), "
            f"got {ka.shape}"
        )
    if hq % hkv:
        raise ValueError(f"query: expected HQ a multiple of HKV={hkv}, got HQ={hq}")
    if va.shape != ka.shape:
        raise ValueError(
            f"value_blocks: expected the shape of key_blocks {ka.shape}, got {va.shape}"
        )
    if not np.isfinite(ma).all():
        raise ValueError("block_mask: expected finite values (masked keys carry -1e9, not -inf)")
    max_n = tiling.max_n if max_n is None else max_n
    max_n = check_pos_int(max_n, "max_n")
    if max_n % bk or max_n < nbq * bk:
        raise ValueError(
            f"max_n: expected a multiple of bk={bk} and >= ceil(n/bk)*bk = {nbq * bk}, got {max_n}"
        )
    bounds = chunk_bounds(kv_len, tiling.ntile, seeds_compat=bool(seeds_compat))
    if not bounds:
        raise ValueError(
            f"seeds_compat=True: kv_len = topk*bk = {kv_len} is less than one NTILE chunk "
            f"({tiling.ntile}); the seeds' kernel runs no chunk (0/0 output)"
        )

    # Wrapper: kernel mask [max_n, kv_len] and dtype casts; rows >= n are outside the valid
    # shape and never reach the output.
    mask2d = kernel_mask(ma, max_n)[:n]
    p_dtype = {"fp32": FP32, "fp16": F16, "bf16": BF16}[dtype]
    group = hq // hkv
    # Q as [HKV, n*16, dh] with the 16 heads of a KV group adjacent per row: a block of query
    # rows is one contiguous [rows*16, dh] slab, i.e. one big cube M axis.
    q64 = widen64(_cast_inputs(qa, dtype)).reshape(n, hkv, group, dh)
    q64 = np.ascontiguousarray(q64.transpose(1, 0, 2, 3)).reshape(hkv, n * group, dh)
    k64 = np.ascontiguousarray(widen64(_cast_inputs(ka, dtype)).transpose(1, 2, 0))  # [HKV,dh,kv]
    v64 = np.ascontiguousarray(widen64(_cast_inputs(va, dtype)).transpose(1, 0, 2))  # [HKV,kv,dh]
    k_chunks = [
        [np.ascontiguousarray(k64[h, :, c0 : c0 + w]) for c0, w in bounds] for h in range(hkv)
    ]
    scale = np.float32(dh**-0.5)
    # Dead keys (K steps no row of a row block sees) are skipped when that provably changes no
    # bit; with a trace hook every chunk is computed, since the trace reports each chunk's m, l.
    skip_dead = (
        trace is None and not seeds_compat and _may_skip_dead_keys(q64, k64, v64, mask2d, scale)
    )
    visible = mask2d > MASK_NEG

    out = np.zeros((n, hkv, group, dh), dtype=FP32)
    if trace is not None:
        tr_max = np.empty((len(bounds), n, hkv, group), dtype=FP32)
        tr_sum = np.empty((len(bounds), n, hkv, group), dtype=FP32)

    def row_block(item: tuple[int, int]) -> None:
        """The chunk loop of KV head ``h_kv`` for query rows ``r0 .. r0+ROW_BLOCK-1``: writes
        only those rows of ``out`` (and of the trace arrays)."""
        h_kv, r0 = item
        r1 = min(n, r0 + ROW_BLOCK)
        q_blk = q64[h_kv, r0 * group : r1 * group]  # [(r1-r0)*16, dh]
        state = None
        for c, (c0, w) in enumerate(bounds):  # NTILE chunks: online softmax
            cols = live_key_steps(visible[r0:r1], c0, w) if skip_dead else None
            if cols is None:  # the whole chunk, as the kernel computes it
                k_c, v_c = k_chunks[h_kv][c], v64[h_kv, c0 : c0 + w]
                mask_c = mask2d[r0:r1, c0 : c0 + w]
            elif cols.size == 0:
                continue  # no row of the block sees a key of this chunk: merge weight 0
            else:  # only the live K steps (chunk-relative columns `cols`)
                k_c = k_chunks[h_kv][c][:, cols]
                v_c = v64[h_kv, c0 + cols]
                mask_c = mask2d[r0:r1, c0 + cols]
            raw = cube_matmul(q_blk, k_c)  # [(r1-r0)*16, w or live keys]
            s = raw.reshape(r1 - r0, group, -1)  # a view: the FP32 steps run in place
            np.multiply(s, scale, out=s)
            np.add(s, mask_c[:, None, :], out=s)  # one mask row, 16 heads
            m_c, l_c, o_c = softmax_chunk(s, v_c, p_dtype)
            state = online_merge(state, m_c, l_c, o_c)
            if trace is not None:
                tr_max[c, r0:r1, h_kv] = m_c[..., 0]
                tr_sum[c, r0:r1, h_kv] = l_c[..., 0]
        if state is None:
            return  # the block's rows see no key at all: zeros (set again below)
        _, l_run, o_run = state
        with np.errstate(invalid="ignore", divide="ignore"):
            out[r0:r1, h_kv] = o_run / l_run

    # The kernel's per-head loop, one KV group (16 heads) at a time, and blocks of query rows:
    # neither shares a reduction, so the (head, row block) items run on the reference worker
    # pool (one BLAS thread each); each item writes only its own rows.
    items = [(h_kv, r0) for h_kv in range(hkv) for r0 in range(0, n, ROW_BLOCK)]
    with blas_threads():  # numbers do not depend on it, speed on a busy machine does
        for _ in map_in_order(row_block, items):
            pass
    out = out.reshape(n, hq, dh)

    if not seeds_compat:
        # a query row that sees no selected key: zeros (the kernel's arithmetic: mean of V)
        empty = ~(mask2d > MASK_NEG).any(axis=1)
        out[empty] = 0.0

    if trace is not None:
        for hg in range(hq):  # kernel order: head-major, then chunks
            for c, (c0, w) in enumerate(bounds):
                trace(
                    dict(
                        op="msa_main_branch",
                        head=hg,
                        kv_head=hg // group,
                        chunk=c,
                        kv_start=c0,
                        kv_len=w,
                        row_max=tr_max[c, :, hg // group, hg % group].copy(),
                        row_sum=tr_sum[c, :, hg // group, hg % group].copy(),
                    )
                )
    return back(out, torch_out)
