"""MiniMax-M3 MSA lightning indexer: decode block selection (``docs/ops/msa_indexer.md``).

Two public ops:

* :func:`msa_indexer_scores` — the PyPTO kernel: the 4 index-query heads, zero-padded to 16 cube
  rows, times every 128-key block of the index keys, FP32 out. One tile per key block.
* :func:`msa_indexer` — kernel plus host tail: block score = max over the block's keys, then
  over the index heads; the top 15 non-local blocks (score descending, ties to the LOWER block
  id) followed by the local (last) block. ``nb <= 16`` returns ``arange(nb)``. The tail is
  :mod:`tilesim.shared.msa_indexer`, the rule the device wrapper applies too.

Source: ``hicann/pypto-gym`` (the MiniMax-M3 lightning-indexer kernel and its host tail; see
``docs/sources.md``, "MSA lightning indexer"). Differences from the seeds' host tail (all in
``docs/ops/msa_indexer.md``): ties are broken deterministically (the seeds use an unsorted
``torch.topk``), the returned order is defined, ``seq_len`` keeps key rows at or beyond it
out of the block max (the seeds score the zero padding of the partial last block), and
``head_reduce="none"`` gives MiniMax's per-index-head selection.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from tilesim.reference import _msa_indexer_fast as _fast
from tilesim.reference.util.arith import F64, matmul_fp32
from tilesim.reference.util.msa_common import K_STEP
from tilesim.shared.models import MINIMAX_M3
from tilesim.shared.msa_indexer import (
    HEAD_REDUCES,
    Args,
    block_head_max,
    check_meta,
    check_values,
    cost,
    select_from_head_max,
    selection_slots,
    sized_args,
)
from tilesim.shared.trace import emit
from tilesim.shared.validate import check_trace, host_array, same_kind

_CFG = MINIMAX_M3.msa
BY, NIDX, NPAD, DIM = (
    _CFG.block_size,
    _CFG.num_index_heads,
    _CFG.index_heads_padded,
    _CFG.index_dim,
)
#: the one private speed switch. True: the speed path of
#: :mod:`tilesim.reference._msa_indexer_fast` (the product for the 4 real index-head rows only,
#: on ``TILESIM_BLAS_THREADS`` BLAS threads). False: the readable path below, the kernel's
#: 16-row product (4 heads + 12 zero rows, computed and then dropped). Each output row is its
#: own dot products (rows do not interact), so both give the same bits and the same trace
#: records (tested).
_FAST = True


def msa_indexer_flop(nb: int, *, padded: bool = True) -> int:
    """Matmul FLOPs of the score kernel over ``nb`` key blocks (2 per multiply-add).

    ``padded=True``: as the cube runs it, 16 rows (4 index heads + 12 zero rows) per block;
    ``False``: the 4 real heads only. One block's share is ``msa_indexer_flop(1)``. A thin
    call of :func:`tilesim.shared.msa_indexer.cost`.
    """
    return cost(sized_args(nb), padded=padded)["flop"]  # the one counter of the op


class _Inputs(NamedTuple):
    q: np.ndarray  # host BF16 [4, 128]
    k: np.ndarray  # host BF16 [nb*128, 128]
    args: Args


def _check(idx_q, idx_k, nb, trace, **kw) -> _Inputs:
    """The shared contract: :func:`check_meta`, then :func:`check_values` (always: the golden
    reads the data anyway)."""
    check_trace(trace)
    args = check_values(check_meta(idx_q, idx_k, nb, **kw))
    return _Inputs(host_array(idx_q, "idx_q"), host_array(idx_k, "idx_k"), args)


def _scores(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """FP32 ``[4, nb*128]`` kernel scores (the padded kernel output's 12 zero rows, dropped
    anyway, are computed only on the plain path, ``_FAST = False``)."""
    kt = k.astype(F64).T  # a transposed view, read in place by the BLAS
    # One cube tile per key block in the kernel; the blocks do not interact, so all of them go
    # through one matmul (K = 128 = one K step). The "* 1.0" vector stage is the identity.
    # Key rows at or beyond seq_len may hold NaN/inf (never read by the selection): no warning.
    with np.errstate(invalid="ignore", over="ignore"):
        if _FAST:
            return _fast.scores(q, kt)
        q_pad = np.zeros((NPAD, q.shape[1]), dtype=F64)
        q_pad[: q.shape[0]] = q.astype(F64)
        s = matmul_fp32(q_pad, kt, k_tile=K_STEP) * np.float32(1.0)
    return np.ascontiguousarray(s[:NIDX])


def msa_indexer_scores(idx_q, idx_k, nb, *, trace=None):
    """Lightning-indexer kernel scores.

    Args:
        idx_q: ``[4, 128]`` BF16 index-query heads (NumPy/ml_dtypes or torch).
        idx_k: ``[nb*128, 128]`` BF16 index keys (one MQA key per position).
        nb: number of 128-key blocks.
        trace: called once per 128-key block (kernel tile) with a
            :func:`tilesim.shared.trace.trace_record`: ``lane {}``, ``step`` = block,
            ``key_range`` = the block's keys, ``row_max`` = FP32 ``[4]`` block max per index
            head, ``flop`` = the block's cube FLOPs (16 rows).

    Returns:
        FP32 ``[4, nb*128]``: ``scores[h, j] = fp32(sum_d q[h,d]*k[j,d])``. BF16 products are
        exact and the 128-term sum is formed exactly (float64) and rounded once to FP32, i.e.
        the correctly rounded FP32 dot product (the cube's single K step). Rows 4..15 of the
        kernel's padded output are dropped. Same kind (NumPy/torch) as ``idx_q``.
    """
    inp = _check(idx_q, idx_k, nb, trace)
    s = _scores(inp.q, inp.k)
    if trace is not None:
        for blk in range(inp.args.nb):  # the kernel's static block loop
            tile = s[:, blk * BY : (blk + 1) * BY]
            emit(
                trace,
                "msa_indexer_scores",
                {},
                blk,
                (blk * BY, (blk + 1) * BY),
                row_max=tile.max(axis=1),
                flop=msa_indexer_flop(1),
            )
    return same_kind(s, idx_q)


def _trace_blocks(trace, head_max: np.ndarray, args: Args) -> None:
    """One record per key block: the keys that count, the maxima, the block's slot."""
    nb = args.nb
    slots = selection_slots(head_max, nb)
    block_score = head_max.max(axis=0)
    for blk in range(nb):
        hm = head_max[:, blk].copy()
        emit(
            trace,
            "msa_indexer",
            {},
            blk,
            (blk * BY, (blk + 1) * BY),
            keys_used=int(np.clip(args.valid - blk * BY, 0, BY)),
            row_max=hm,
            flop=msa_indexer_flop(1),
            head_max=hm,
            block_score=block_score[blk],
            local=blk == nb - 1,
            slot=int(slots[blk]),
        )


def msa_indexer(idx_q, idx_k, nb, *, seq_len=None, head_reduce="max", trace=None):
    """Lightning-indexer block selection (kernel scores + host top-k).

    Args:
        idx_q: ``[4, 128]`` BF16; idx_k: ``[nb*128, 128]`` BF16; nb: key blocks.
        seq_len: the true key count, ``(nb-1)*128 < seq_len <= nb*128``. Key rows at or beyond
            it take no part in the block max (``None``: every row counts, as in the seeds).
        head_reduce: ``"max"`` — block score = max over index heads, one selection
            ``[1, k]``; ``"none"`` — one selection per index head ``[4, k]`` (MiniMax MSA).
        trace: called once per 128-key block with a trace record: ``lane {}``, ``step`` =
            block, ``key_range`` = the block's keys, ``keys_used`` = the keys that count,
            ``row_max`` = FP32 ``[4]`` per-head max of those keys (-inf when none counts),
            ``flop``, and ``extra`` ``{"head_max" (= row_max), "block_score" (max over heads),
            "local", "slot"}`` (``slot``: the block's position in the ``head_reduce="max"``
            selection, -1 when not selected).

    Returns:
        INT32 ``[1, k]`` (or ``[4, k]``), ``k = min(16, nb)``. ``nb > 16``: the 15 best
        non-local blocks in score-descending order (equal scores: lower block id first), then
        the local block ``nb-1``. ``nb <= 16``: ``arange(nb)``. Scores are the FP32 kernel
        scores of :func:`msa_indexer_scores` (no softmax scale: ranking is scale-free).
    """
    inp = _check(idx_q, idx_k, nb, trace, seq_len=seq_len, head_reduce=head_reduce)
    args = inp.args
    head_max = block_head_max(_scores(inp.q, inp.k), args.nb, args.valid)  # [4, nb]
    ids = select_from_head_max(head_max, args.nb, head_reduce=args.head_reduce)
    if trace is not None:
        _trace_blocks(trace, head_max, args)
    return same_kind(ids, idx_q)


__all__ = ["HEAD_REDUCES", "msa_indexer", "msa_indexer_flop", "msa_indexer_scores"]
