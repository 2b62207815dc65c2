"""MiniMax-M3 MSA block-sparse decode attention (``op-facts`` §3).

Kernel loop nest (per batch row ``b`` and KV head ``h``, the 16 query heads of the group on the
cube M axis)::

    gather the selected blocks' keys/values in slot order       -> K_cmp, V_cmp [topk*128, 128]
    for c in chunks of NTILE keys:                               (online softmax, visible below)
        S   = fp32(Q[16,128] @ K_c^T)        cube, FP32 out
        S   = S * SCALE                       FP32 (SCALE = fp32(1/sqrt(128)))
        S   = S*m + (1-m)*(-3e38)             FP32, m = valid mask (1 keep / 0 drop)
        m_c = rowmax(S); P = exp(S - m_c); l_c = rowsum(P)       FP32, unrounded P
        O_c = fp32(bf16(P) @ V_c)             cube, FP32 accumulation in 128-key K steps
        merge (m, l, O) with (m_c, l_c, O_c)  FP32
    out = bf16(O / l)

tilesim batches the (b, h) pairs of a block of :data:`BATCH_BLOCK` batch rows and the 16-head
group into one matmul per chunk; the chunk loop (which changes the numbers) stays explicit. The
row blocks share no reduction and run on the reference worker pool
(:func:`tilesim.reference.blas_pool.map_in_order`). ``tests/reference/test_msa_decode.py``
proves the batching bit-identical to a per-(b, h) loop, and the block size and worker count
invisible.

Beyond the seeds' kernel (``docs/ops/msa.md``): ``seq_len`` may differ per batch row; when
``topk*128`` is not a multiple of NTILE the last partial chunk is processed (the seeds drop
those keys; ``seeds_compat=True`` reproduces that); a batch row whose every key is masked
returns zeros (the kernel's arithmetic would give the mean of the gathered V).
"""

from __future__ import annotations

import numbers

import numpy as np
from tilesim.reference.blas_pool import blas_threads, map_in_order
from tilesim.reference.msa_common import (
    as_array,
    back,
    check_dtype,
    check_int_array,
    check_ndim,
    check_trace,
    chunk_bounds,
    cube_matmul,
    online_merge,
    softmax_chunk,
    widen64,
)
from tilesim.shared.casts import BF16, FP32, to_bf16
from tilesim.shared.models import MINIMAX_M3
from tilesim.shared.tiling import MsaTiling

_CFG = MINIMAX_M3.msa
#: key columns per score matmul (no numeric effect; keeps each (b, h) gemm small)
_N_SPLIT = 128
#: batch rows per work item (no numeric effect: rows share no reduction). Two rows keep a
#: chunk's float64 K and V (2 x 2 MB) in cache; measured 0.34 s -> 0.20 s on B = 64 serially.
BATCH_BLOCK = 2


def _check_seq_len(seq_len, batch: int, nb: int, by: int) -> np.ndarray:
    """One int or ``batch`` ints in ``[1, nb*by]`` -> int64 ``[batch]``."""
    if isinstance(seq_len, (bool, np.bool_)):
        raise TypeError(f"seq_len: expected an int or {batch} ints, got {seq_len!r}")
    if isinstance(seq_len, numbers.Integral):
        arr = np.full(batch, int(seq_len), dtype=np.int64)
    else:
        if isinstance(seq_len, (list, tuple)):
            a = np.asarray(seq_len)
        else:
            a, _ = as_array(seq_len, "seq_len")
        if a.dtype.kind not in "iu":
            raise TypeError(f"seq_len: expected an int or integer values, got dtype {a.dtype}")
        if a.ndim == 0:  # a 0-d array / tensor is one int
            a = np.full(batch, a.item(), dtype=np.int64)
        if a.shape != (batch,):
            raise ValueError(f"seq_len: expected one int or shape ({batch},), got {a.shape}")
        arr = a.astype(np.int64)
    bad = (arr < 1) | (arr > nb * by)
    if bad.any():
        b = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"seq_len: expected 1 <= seq_len <= nb*{by} = {nb * by}, got {int(arr[b])} "
            f"(batch row {b})"
        )
    return arr


def decode_valid_mask(block_ids: np.ndarray, seq_len: np.ndarray, by: int) -> np.ndarray:
    """FP32 ``[B, topk*by]`` keep-mask of the host code (1 keep, 0 drop).

    ``cur = (seq_len-1)//by``; a slot holding block ``cur`` keeps its first
    ``seq_len - by*cur`` tokens, a slot holding a block after ``cur`` is dropped, earlier blocks
    are kept whole. The current block is recognised by id, so slot order does not matter.
    """
    cur = (seq_len - 1) // by  # [B]
    cur_valid = seq_len - cur * by  # [B], 1..by
    ids = block_ids.astype(np.int64)
    t = np.arange(by)
    keep = np.where(
        (ids == cur[:, None])[:, :, None],
        t[None, None, :] < cur_valid[:, None, None],
        (ids < cur[:, None])[:, :, None],
    )  # [B, topk, by]
    return keep.reshape(ids.shape[0], -1).astype(FP32)


def msa_sparse_decode(
    q,
    k_blocks,
    v_blocks,
    block_ids,
    seq_len,
    *,
    tiling: MsaTiling | None = None,
    seeds_compat: bool = False,
    trace=None,
):
    """Block-sparse decode attention over the selected key blocks.

    Args:
        q: ``[B, 64, 128]`` BF16 query (one decode token per sequence).
        k_blocks, v_blocks: ``[B, 4, nb, 128, 128]`` BF16 paged K / V (``[B, HKV, nb, BY, D]``;
            other head counts work when ``HQ % HKV == 0``).
        block_ids: ``[B, topk]`` integer ids of the selected blocks, each in ``[0, nb)`` and
            unique per row (slot order is the key order of the gathered sequence).
        seq_len: KV length including the current token, one int or one per batch row,
            ``1 <= seq_len <= nb*128``.
        tiling: :class:`MsaTiling` (``ntile`` = key chunk width); ``None`` means
            ``MsaTiling.from_env()`` at call time (``MSA_NTILE``).
        seeds_compat: ``True`` reproduces the seeds' kernel where tilesim deliberately differs:
            the tail ``topk*128 mod NTILE`` keys are dropped (``ValueError`` if no whole chunk
            fits, the kernel would leave the output unwritten) and a fully masked row keeps the
            kernel's arithmetic (mean of the gathered V) instead of zeros.
        trace: called once per (batch row, KV head, chunk), in the kernel's order, with
            ``{"op": "msa_sparse_decode", "batch", "kv_head", "q_start", "chunk", "kv_start",
            "kv_len", "row_max", "row_sum"}``; ``kv_start`` is the offset in the gathered keys,
            ``row_max``/``row_sum`` the chunk's FP32 ``m_c``/``l_c`` for the 16 query heads.

    Returns:
        BF16 ``[B, 64, 128]`` (same kind, numpy or torch, as ``q``).

    Rounding points: scores FP32 (correctly rounded dot, BF16 inputs), ``* SCALE`` FP32, mask
    FP32, ``exp`` FP32, P rounded to BF16 before P.V, FP32 accumulation per 128-key K step,
    FP32 merge and division, one final rounding to BF16.
    """
    check_trace(trace)
    tiling = MsaTiling.from_env() if tiling is None else tiling
    if not isinstance(tiling, MsaTiling):
        raise TypeError(f"tiling: expected a MsaTiling or None, got {type(tiling).__name__}")
    if not isinstance(seeds_compat, (bool, np.bool_)):
        raise TypeError(f"seeds_compat: expected a bool, got {seeds_compat!r}")

    qa, q_torch = as_array(q, "q")
    ka, k_torch = as_array(k_blocks, "k_blocks")
    va, v_torch = as_array(v_blocks, "v_blocks")
    ids, i_torch = as_array(block_ids, "block_ids")
    torch_out = q_torch or k_torch or v_torch or i_torch
    for name, a in (("q", qa), ("k_blocks", ka), ("v_blocks", va)):
        check_dtype(a, name, (BF16,))
    check_ndim(qa, "q", 3, "[B, HQ, D]")
    check_ndim(ka, "k_blocks", 5, "[B, HKV, nb, BY, D]")
    batch, hq, dim = qa.shape
    if batch < 1 or hq < 1 or dim < 1:
        raise ValueError(f"q: expected a non-empty [B, HQ, D] array, got shape {qa.shape}")
    kb, hkv, nb, by, kdim = ka.shape
    if kb != batch or kdim != dim or hkv < 1 or nb < 1 or by < 1:
        raise ValueError(
            f"k_blocks: expected shape ({batch}, HKV, nb, BY, {dim}) matching q {qa.shape}, "
            f"got {ka.shape}"
        )
    if hq % hkv:
        raise ValueError(f"q: expected HQ a multiple of HKV={hkv}, got HQ={hq}")
    if va.shape != ka.shape:
        raise ValueError(f"v_blocks: expected the shape of k_blocks {ka.shape}, got {va.shape}")
    check_int_array(ids, "block_ids")
    check_ndim(ids, "block_ids", 2, "[B, topk]")
    if ids.shape[0] != batch or ids.shape[1] < 1:
        raise ValueError(f"block_ids: expected shape ({batch}, topk>=1), got {ids.shape}")
    topk = ids.shape[1]
    if ids.min() < 0 or ids.max() >= nb:
        raise ValueError(
            f"block_ids: expected ids in [0, nb={nb}), got min {ids.min()} max {ids.max()}"
        )
    srt = np.sort(ids, axis=1)
    dup = (srt[:, 1:] == srt[:, :-1]).any(axis=1)
    if dup.any():
        b = int(np.flatnonzero(dup)[0])
        raise ValueError(f"block_ids: expected unique ids per row, row {b} is {ids[b].tolist()}")
    seq = _check_seq_len(seq_len, batch, nb, by)

    group = hq // hkv
    sel = topk * by
    bounds = chunk_bounds(sel, tiling.ntile, seeds_compat=bool(seeds_compat))
    if not bounds:
        raise ValueError(
            f"seeds_compat=True: topk*{by} = {sel} keys is less than one NTILE chunk "
            f"({tiling.ntile}); the seeds' kernel runs no chunk and leaves the output unwritten"
        )
    scale = np.float32(dim**-0.5)
    neg = np.float32(_CFG.decode_mask_neg)

    mask = decode_valid_mask(ids, seq, by)  # [B, sel], the host's keep-mask

    def batch_rows(b0: int) -> tuple[np.ndarray, list]:
        """The kernel for batch rows ``b0 .. b0+BATCH_BLOCK-1``: FP32 ``O / l`` [rows, HKV, 16, D]
        and the chunks' (m_c, l_c) for the trace. Reads shared inputs only."""
        rows = slice(b0, min(batch, b0 + BATCH_BLOCK))
        n = rows.stop - rows.start
        # host preparation: compact gathered K/V [rows, HKV, sel, D] (slot-major)
        bi = np.arange(rows.start, rows.stop)[:, None, None]
        hi = np.arange(hkv)[None, :, None]
        k_cmp = ka[bi, hi, ids[rows, None, :]].reshape(n, hkv, sel, dim)
        v_cmp = va[bi, hi, ids[rows, None, :]].reshape(n, hkv, sel, dim)
        q64 = widen64(qa[rows]).reshape(n, hkv, group, dim)  # the 16 query rows of a KV head
        state = None
        stats = []
        for c0, w in bounds:  # NTILE chunks: online softmax (changes the numbers)
            k_c = widen64(k_cmp[:, :, c0 : c0 + w]).swapaxes(-1, -2)  # [rows, HKV, D, w]
            # S = Q K_c^T [rows, HKV, 16, w] FP32, formed 128 keys at a time: the same dot
            # products (same values) as one matmul, in (b, h) gemms that stay in cache
            s = np.empty((n, hkv, group, w), dtype=FP32)
            for n0 in range(0, w, _N_SPLIT):
                s[..., n0 : n0 + _N_SPLIT] = cube_matmul(q64, k_c[..., n0 : n0 + _N_SPLIT])
            s = s * scale
            m = mask[rows, None, None, c0 : c0 + w]  # broadcast over KV heads and the 16 rows
            one_minus_m = m * np.float32(-1) + np.float32(1)
            with np.errstate(invalid="ignore", over="ignore"):
                s = s * m + one_minus_m * neg
            m_c, l_c, o_c = softmax_chunk(s, widen64(v_cmp[:, :, c0 : c0 + w]), BF16)
            state = online_merge(state, m_c, l_c, o_c)
            if trace is not None:
                stats.append((m_c[..., 0], l_c[..., 0]))
        _, l_run, o_run = state
        with np.errstate(invalid="ignore", divide="ignore"):
            return o_run / l_run, stats  # FP32 [rows, HKV, 16, D]

    # Batch rows share no reduction: blocks of BATCH_BLOCK rows (small enough that a chunk's
    # float64 K and V stay in cache) run on the reference worker pool, results in row order.
    out = np.empty((batch, hkv, group, dim), dtype=FP32)
    records = [(c, c0, w, [], []) for c, (c0, w) in enumerate(bounds)]
    starts = range(0, batch, BATCH_BLOCK)
    with blas_threads():  # numbers do not depend on it, speed on a busy machine does
        for b0, (o_blk, stats) in zip(starts, map_in_order(batch_rows, starts), strict=True):
            out[b0 : b0 + o_blk.shape[0]] = o_blk
            for rec, (mx, sm) in zip(records, stats, strict=trace is not None):
                rec[3].append(mx)
                rec[4].append(sm)
    if not seeds_compat:
        # a batch row with no valid key: zeros (the kernel's arithmetic gives mean(V))
        empty = ~(mask > 0).any(axis=1)
        out[empty] = 0.0
    out = to_bf16(out).reshape(batch, hq, dim)
    if trace is not None:
        records = [
            (c, c0, w, np.concatenate(mx), np.concatenate(sm)) for c, c0, w, mx, sm in records
        ]
        for b in range(batch):  # kernel order: outer = b*HKV + h, then chunks
            for h in range(hkv):
                for c, c0, w, mx, sm in records:
                    trace(
                        dict(
                            op="msa_sparse_decode",
                            batch=b,
                            kv_head=h,
                            q_start=b * hq + h * group,
                            chunk=c,
                            kv_start=c0,
                            kv_len=w,
                            row_max=mx[b, h].copy(),
                            row_sum=sm[b, h].copy(),
                        )
                    )
    return back(out, torch_out)
