"""MiniMax-M3 MSA lightning indexer: decode block selection (``op-facts`` §2, anchors §1.6).

Two public ops:

* :func:`msa_indexer_scores` — the PyPTO kernel: the 4 index-query heads, zero-padded to 16 cube
  rows, times every 128-key block of the index keys, FP32 out. One tile per key block.
* :func:`msa_indexer` — kernel plus host tail: block score = max over the block's keys, then
  over the index heads; the top 15 non-local blocks (score descending, ties to the LOWER block
  id) followed by the local (last) block. ``nb <= 16`` returns ``arange(nb)``.

Differences from the seeds' host tail (all documented in ``docs/ops/msa.md``): ties are broken
deterministically (the seeds use an unsorted ``torch.topk``), the returned order is defined,
``seq_len`` keeps key rows at or beyond it out of the block max (the seeds score the zero
padding of the partial last block), and ``head_reduce="none"`` gives MiniMax's per-index-head
selection.
"""

from __future__ import annotations

import numbers

import numpy as np
from tilesim.reference.msa_common import (
    as_array,
    back,
    check_dtype,
    check_pos_int,
    check_trace,
    cube_matmul,
    widen64,
)
from tilesim.shared.casts import BF16, FP32
from tilesim.shared.models import MINIMAX_M3

_CFG = MINIMAX_M3.msa
HEAD_REDUCES = ("max", "none")


def _check_index_inputs(idx_q, idx_k, nb):
    q, q_torch = as_array(idx_q, "idx_q")
    k, k_torch = as_array(idx_k, "idx_k")
    nb = check_pos_int(nb, "nb")
    nidx, dim, by = _CFG.num_index_heads, _CFG.index_dim, _CFG.block_size
    check_dtype(q, "idx_q", (BF16,))
    check_dtype(k, "idx_k", (BF16,))
    if q.shape != (nidx, dim):
        raise ValueError(f"idx_q: expected shape ({nidx}, {dim}) [index heads, dim], got {q.shape}")
    if k.shape != (nb * by, dim):
        raise ValueError(
            f"idx_k: expected shape ({nb * by}, {dim}) [nb*{by} keys, dim] for nb={nb}, "
            f"got {k.shape}"
        )
    for name, a in (("idx_q", q), ("idx_k", k)):
        if not np.isfinite(a.astype(FP32)).all():
            raise ValueError(f"{name}: expected finite values (a NaN/inf makes the ranking void)")
    return q, k, nb, q_torch or k_torch


def _scores(q: np.ndarray, k: np.ndarray, nb: int) -> np.ndarray:
    """FP32 ``[16, nb*128]`` kernel scores (pad rows included)."""
    npad, by = _CFG.index_heads_padded, _CFG.block_size
    q_pad = np.zeros((npad, q.shape[1]), dtype=np.float64)
    q_pad[: q.shape[0]] = widen64(q)
    # One cube tile per key block in the kernel; the blocks do not interact, so all of them go
    # through one matmul (K = 128 = one K step). The "* 1.0" vector stage is the identity.
    s = cube_matmul(q_pad, widen64(k).T)  # a transposed view: BLAS reads it in place
    s = s * np.float32(1.0)
    assert s.shape == (npad, nb * by)
    return s


def msa_indexer_scores(idx_q, idx_k, nb, *, trace=None):
    """Lightning-indexer kernel scores.

    Args:
        idx_q: ``[4, 128]`` BF16 index-query heads (numpy/ml_dtypes or torch CPU).
        idx_k: ``[nb*128, 128]`` BF16 index keys (one MQA key per position).
        nb: number of 128-key blocks.
        trace: called once per 128-key block (kernel tile) with
            ``{"op": "msa_indexer_scores", "block", "kv_start", "kv_len", "row_max"}``
            (``row_max``: FP32 ``[4]`` max of the block's scores per index head).

    Returns:
        FP32 ``[4, nb*128]``: ``scores[h, j] = fp32(sum_d q[h,d]*k[j,d])``. BF16 products are
        exact and the 128-term sum is formed exactly (float64) and rounded once to FP32, i.e.
        the correctly rounded FP32 dot product (the cube's single K step). Rows 4..15 of the
        kernel's padded output are dropped. Same kind (numpy/torch) as the inputs.
    """
    check_trace(trace)
    q, k, nb, torch_out = _check_index_inputs(idx_q, idx_k, nb)
    s = _scores(q, k, nb)[: _CFG.num_index_heads]
    if trace is not None:
        by = _CFG.block_size
        for blk in range(nb):  # the kernel's static block loop
            tile = s[:, blk * by : (blk + 1) * by]
            trace(
                dict(
                    op="msa_indexer_scores",
                    block=blk,
                    kv_start=blk * by,
                    kv_len=by,
                    row_max=tile.max(axis=1),
                )
            )
    return back(np.ascontiguousarray(s), torch_out)


def _select(block_score: np.ndarray, nb: int, ksel: int) -> np.ndarray:
    """Top ``ksel-1`` of blocks ``0..nb-2`` (score descending, lower id first), then ``nb-1``."""
    order = np.argsort(-block_score[: nb - 1], kind="stable")
    return np.concatenate([order[: ksel - 1], [nb - 1]]).astype(np.int32)


def _check_seq_len(seq_len, nb: int) -> int:
    by = _CFG.block_size
    if (
        isinstance(seq_len, (bool, np.bool_))
        or not isinstance(seq_len, numbers.Integral)
        or not (nb - 1) * by < seq_len <= nb * by
    ):
        raise ValueError(
            f"seq_len: expected an int with {(nb - 1) * by} < seq_len <= {nb * by} "
            f"(nb = ceil(seq_len/{by}) = {nb} blocks), got {seq_len!r}"
        )
    return int(seq_len)


def msa_indexer(idx_q, idx_k, nb, *, seq_len=None, head_reduce="max", trace=None):
    """Lightning-indexer block selection (kernel scores + host top-k).

    Args:
        idx_q: ``[4, 128]`` BF16; idx_k: ``[nb*128, 128]`` BF16; nb: key blocks.
        seq_len: the true key count, ``(nb-1)*128 < seq_len <= nb*128``. Key rows at or beyond
            it take no part in the block max (``None``: every row counts, as in the seeds).
        head_reduce: ``"max"`` — block score = max over index heads, one selection
            ``[1, k]``; ``"none"`` — one selection per index head ``[4, k]`` (MiniMax MSA).
        trace: called once per 128-key block with ``{"op": "msa_indexer", "block",
            "kv_start", "kv_len" (keys that count), "head_max" (FP32 [4], -inf when no key
            counts), "block_score" (max over heads), "local", "slot"}`` (``slot``: position
            of the block in the ``head_reduce="max"`` selection, -1 when not selected).

    Returns:
        INT32 ``[1, k]`` (or ``[4, k]``), ``k = min(16, nb)``. ``nb > 16``: the 15 best
        non-local blocks in score-descending order (equal scores: lower block id first), then
        the local block ``nb-1``. ``nb <= 16``: ``arange(nb)``. Scores are the FP32 kernel
        scores of :func:`msa_indexer_scores` (no softmax scale: ranking is scale-free).
    """
    check_trace(trace)
    q, k, nb, torch_out = _check_index_inputs(idx_q, idx_k, nb)
    if head_reduce not in HEAD_REDUCES:
        raise ValueError(f"head_reduce: expected one of {HEAD_REDUCES}, got {head_reduce!r}")
    by, nidx = _CFG.block_size, _CFG.num_index_heads
    valid = nb * by if seq_len is None else _check_seq_len(seq_len, nb)
    ksel = min(_CFG.topk_blocks, nb)

    s = _scores(q, k, nb)[:nidx].copy()
    s[:, valid:] = -np.inf  # seq_len masking (the seeds keep the zero padding's scores)
    head_max = s.reshape(nidx, nb, by).max(axis=2)  # [4, nb]
    block_score = head_max.max(axis=0)  # [nb]

    if nb <= _CFG.topk_blocks:
        sel = np.arange(nb, dtype=np.int32)
        ids = sel[None, :] if head_reduce == "max" else np.tile(sel, (nidx, 1))
    elif head_reduce == "max":
        sel = _select(block_score, nb, ksel)
        ids = sel[None, :]
    else:
        sel = _select(block_score, nb, ksel)
        ids = np.stack([_select(head_max[h], nb, ksel) for h in range(nidx)])

    if trace is not None:
        slot_of = {int(b): i for i, b in enumerate(sel)}
        for blk in range(nb):
            trace(
                dict(
                    op="msa_indexer",
                    block=blk,
                    kv_start=blk * by,
                    kv_len=int(np.clip(valid - blk * by, 0, by)),
                    head_max=head_max[:, blk].copy(),
                    block_score=block_score[blk],
                    local=blk == nb - 1,
                    slot=slot_of.get(blk, -1),
                )
            )
    return back(np.ascontiguousarray(ids, dtype=np.int32), torch_out)
