"""DeepSeek-V3.2 lightning indexer: index scores of every cached token and the top-k ids
(``docs/ops/dsa_indexer.md``; the contract is :mod:`tilesim.shared.dsa_indexer`).

Shapes (``T`` query rows, batch-major; ``S = max_blocks * block_size``)::

    q            [T, 64, 128]   int8 (path "int8") or float8_e4m3fn (path "fp8")
    weights      [T, 64]        float16 (int8) or float32 (fp8: q scale and 64^-0.5*128^-0.5 in)
    q_scale      [T, 64]        float16 (int8 only)
    k_cache      int8 [num_blocks, block_size, 128] + k_scale float16 [num_blocks, block_size]
                 or uint8 [num_blocks, block_size*132] (FP8 pages: shared/layouts/index_cache.py)
    block_table  [B, max_blocks] int, seq_lens [B] int, q_lens [B] int or None (decode)
    -> topk_indices int32 [T, topk], scores float32 [T, S]

Loop nest (the kernel's): batch ``b`` -> block tile (``_CHUNK_BLOCKS`` blocks of the batch's
table at a time; the kernel unrolls its block loop the same way) -> the tile's rows x tokens.
Tokens do not interact, so the tiling changes no number; batches run on the worker pool of
:mod:`tilesim.reference.util.blas_pool` (``TILESIM_REF_THREADS``), each writing its own rows, the
trace records emitted in batch order from the calling thread. Per tile, rounding points in capitals
(``d`` = the exact dot product of the codes, ``h`` = index head)::

    int8, "gym"   (pypto-gym kernel and golden; the default):
        v_h   = FP16(relu(d) * 2^-11)                        cube, fix-pipe epilogue
        w_h   = FP16(q_scale_h * weights_h)                   vector
        s     = HSUM_h(w_h * v_h)    (products exact in FP32)   vector
        score = FP32(s * fp32(k_scale))                       vector
    int8, "pypto" (hicann/pypto lightning_indexer.cpp):
        t = FP16(d * 2^-11); t = FP16(t * q_scale_h); t = FP16(t * k_scale); t = relu(t)
        t = FP16(t * weights_h);  score = FP32(sum_h t)
    fp8 (DeepSeek inference/kernel.py fp8_index, DeepGEMM):
        l_h = FP32(d); t_h = FP32(relu(l_h) * weights_h); s = HSUM_h(t_h)
        score = FP32(s * k_scale)

``FP32(d)`` is :func:`~tilesim.reference.util.arith.matmul_fp32` with one K tile (the INT8 dots are
exact in FP32 already: ``|d| <= 2^21``); ``HSUM_h`` is the kernel's head sum, the FP32 halving
tree of :func:`~tilesim.reference.util.arith.halving_sum_fp32` (32 + 32, then 16 + 16, ... 1 + 1:
every add rounds). pypto-gym's kernel sums the heads in a cube matmul instead and its golden
in an FP32 ``bmm``: those orders differ from the tree in the last bits only, which the judge's
score-aware id rule absorbs. The "pypto" order keeps ``FP32(sum_h t)``, a float64 sum rounded
once (PyPTO's own reduction order is not modelled).
Then positions a row does not see get ``-inf`` and :func:`tilesim.shared.dsa_indexer.select_topk`
picks the ids. Only the blocks and tokens the table selects for ``seq_lens`` are read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from tilesim.reference.util.arith import F32, F64, halving_sum_fp32, matmul_fp32
from tilesim.reference.util.blas_pool import blas_threads, map_in_order
from tilesim.reference.util.progress import progress_bar
from tilesim.shared.dsa_indexer import (
    INDEX_HEADS,
    INT8_QK_SCALE,
    TOPK,
    Args,
    Plan,
    check_meta,
    check_values,
    host_plan,
    select_topk,
)
from tilesim.shared.layouts.index_cache import INDEX_DIM, fp8_page_views
from tilesim.shared.models import DEEPSEEK_V32
from tilesim.shared.quant import e4m3_to_fp32
from tilesim.shared.trace import emit
from tilesim.shared.validate import host_array, same_kind

#: blocks per tile of the batch's block loop (8192 tokens at block_size 128)
_CHUNK_BLOCKS = 64
F16 = np.dtype(np.float16)
_QK_SCALE = np.float32(INT8_QK_SCALE)


class IndexerResult(NamedTuple):
    """What :func:`dsa_indexer` returns (a tuple: ``ids, scores = dsa_indexer(...)``)."""

    topk_indices: object  #: INT32 ``[T, topk]``
    scores: object  #: FP32 ``[T, S]``


class _Rows(NamedTuple):
    """One batch's query rows on the host: codes FP32 ``[n*64, 128]`` and per (row, head)
    factors FP32 ``[n, 64]`` (``wq``: INT8 gym ``FP16(q_scale * w)``, else the weights)."""

    q: np.ndarray
    w: np.ndarray
    qs: np.ndarray | None


def _batch_rows(a: Args, r0: int, r1: int) -> _Rows:
    q = host_array(a.q, "q")[r0:r1].reshape(-1, INDEX_DIM)
    w = host_array(a.weights, "weights")[r0:r1].astype(F32)
    if a.path == "fp8":
        return _Rows(e4m3_to_fp32(q), w, None)
    qs = host_array(a.q_scale, "q_scale")[r0:r1].astype(F32)
    if a.int8_order == "gym":
        w = (qs * w).astype(F16).astype(F32)  # FP16 product of two FP16 values
    return _Rows(q.astype(F32), w, qs)


def _keys(a: Args, blocks: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n`` tokens of the physical ``blocks``: codes FP32 ``[n, 128]`` (exact) and
    scales FP32 ``[n]`` (exact widening). Reads those blocks only."""
    if a.path == "int8":
        codes = host_array(a.k_cache, "k_cache")[blocks].reshape(-1, INDEX_DIM)[:n]
        scales = host_array(a.k_scale, "k_scale")[blocks].reshape(-1)[:n]
        return codes.astype(F32), scales.astype(F32)
    pages = fp8_page_views(host_array(a.k_cache, "k_cache")[blocks], block_size=a.block_size)
    codes = pages.codes.reshape(-1, INDEX_DIM)[:n]  # a copy (the page runs are not adjacent)
    return e4m3_to_fp32(codes), pages.scales.reshape(-1)[:n].astype(F32)


def _tile_int8_gym(rows: _Rows, k: np.ndarray, ks: np.ndarray) -> np.ndarray:
    n_rows = rows.w.shape[0]
    d = rows.q @ k.T  # exact: integer products and sums below 2^24
    v = (np.maximum(d, 0) * _QK_SCALE).astype(F16).astype(F32)  # FP16 values [n*64, n_tok]
    t = v.reshape(n_rows, INDEX_HEADS, -1) * rows.w[:, :, None]  # FP16 x FP16: exact in FP32
    return halving_sum_fp32(t, axis=1) * ks[None, :]


def _tile_int8_pypto(rows: _Rows, k: np.ndarray, ks: np.ndarray) -> np.ndarray:
    n_rows = rows.w.shape[0]
    d = rows.q @ k.T
    t = (d * _QK_SCALE).astype(F16)
    t = (t.astype(F32) * rows.qs.reshape(-1, 1)).astype(F16)  # FP16 x FP16, rounded once
    t = (t.astype(F32) * ks[None, :]).astype(F16)  # ks: FP16 values, widened
    t = np.maximum(t, F16.type(0))
    t = (t.astype(F32) * rows.w.reshape(-1, 1)).astype(F16).astype(F32)
    return t.reshape(n_rows, INDEX_HEADS, -1).astype(F64).sum(axis=1).astype(F32)


def _tile_fp8(rows: _Rows, k: np.ndarray, ks: np.ndarray) -> np.ndarray:
    n_rows = rows.w.shape[0]
    logits = matmul_fp32(rows.q, k.T, k_tile=None)  # exact float64 dots, one FP32 rounding
    t = np.maximum(logits, 0) * rows.w.reshape(-1, 1)  # FP32 multiply
    return halving_sum_fp32(t.reshape(n_rows, INDEX_HEADS, -1), axis=1) * ks[None, :]


def _tile_fn(a: Args) -> Callable:
    if a.path == "fp8":
        return _tile_fp8
    return _tile_int8_gym if a.int8_order == "gym" else _tile_int8_pypto


def _batch(a: Args, plan: Plan, b: int, scores: np.ndarray) -> None:
    """L1 of batch ``b``: its block tiles, written into ``scores``, then its rows' masks."""
    r0, r1 = int(plan.row_start[b]), int(plan.row_start[b + 1])
    n_tok = int(a.seq_lens[b])
    if r0 == r1 or n_tok == 0:
        return
    rows = _batch_rows(a, r0, r1)
    tile = _tile_fn(a)
    bs = a.block_size
    for c0 in range(0, int(plan.blocks[b]), _CHUNK_BLOCKS):  # the kernel's block loop
        c1 = min(c0 + _CHUNK_BLOCKS, int(plan.blocks[b]))
        lo, hi = c0 * bs, min(c1 * bs, n_tok)
        k, ks = _keys(a, a.block_table[b, c0:c1], hi - lo)
        with np.errstate(over="ignore", invalid="ignore"):
            scores[r0:r1, lo:hi] = tile(rows, k, ks)
    for r in range(r0, r1):  # causal / MTP offset: a row sees its first `visible` tokens
        scores[r, int(plan.visible[r]) : n_tok] = -np.inf


def _trace_batch(trace, a: Args, plan: Plan, b: int, scores: np.ndarray) -> None:
    r0, r1 = int(plan.row_start[b]), int(plan.row_start[b + 1])
    n_tok, bs = int(a.seq_lens[b]), a.block_size
    for j in range(int(plan.blocks[b])):
        lo, hi = j * bs, min((j + 1) * bs, n_tok)
        emit(trace, "dsa_indexer", {"b": b}, j, (lo, hi),
             keys_used=hi - lo, row_max=scores[r0:r1, lo:hi].max(axis=1, initial=-np.inf),
             flop=2 * INDEX_HEADS * (INDEX_DIM + 1) * (r1 - r0) * (hi - lo),
             block=int(a.block_table[b, j]), rows=(r0, r1))  # fmt: skip


def dsa_indexer_scores(a: Args, *, trace=None, progress=None) -> np.ndarray:
    """FP32 ``[T, S]`` scores of a checked call (:func:`check_values` Args): the loop nest of
    the module docstring, ``-inf`` at every position a row does not see."""
    plan = host_plan(a)
    scores = np.full((a.rows, plan.width), -np.inf, dtype=F32)
    bar = progress_bar(a.n_b, progress, "dsa_indexer", unit="batch")

    def run(b: int) -> int:  # one batch: writes only its own rows of `scores`
        _batch(a, plan, b, scores)
        return b

    try:
        with blas_threads():
            for b in map_in_order(run, range(a.n_b)):  # L0: batches, in order
                if trace is not None:
                    _trace_batch(trace, a, plan, b, scores)
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return scores


def dsa_indexer(
    q,
    weights,
    k_cache,
    block_table,
    seq_lens,
    *,
    q_scale=None,
    k_scale=None,
    q_lens=None,
    path="int8",
    int8_order="gym",
    topk=TOPK,
    block_size=DEEPSEEK_V32.block_size,
    trace=None,
    progress=None,
):
    """Lightning-indexer golden: scores of every visible cached token and the top-k ids.

    Args:
        q, weights, k_cache, block_table, seq_lens, q_scale, k_scale: see the module docstring
            (INT8 path: ``q_scale`` and ``k_scale`` required; FP8 path: both ``None``).
        q_lens: int ``[B]`` rows per batch (prefill / ragged); ``None``: decode, ``s1 = T // B``
            rows per batch, ``1 <= s1 <= 4``. Row ``r`` of batch ``b`` sees positions ``0 ..
            seq_lens[b] - q_lens[b] + r``.
        path: ``"int8"`` or ``"fp8"``; int8_order: ``"gym"`` (default, the kernel's) or
            ``"pypto"`` (module docstring); topk: ids per row (2048); block_size: tokens per
            cache block.
        trace: called once per (batch, block) with a :func:`tilesim.shared.trace.trace_record`:
            ``lane {"b"}``, ``step`` = logical block, ``key_range`` = its tokens, ``keys_used``,
            ``row_max`` = FP32 per-row max score over the block (``-inf`` where a row sees none of
            it), ``flop``, ``extra {"block": physical block, "rows": (first, stop)}``.
        progress: ``True`` a tqdm bar, ``False`` none, ``None`` after 3 s.

    Returns:
        ``(topk_indices, scores)``: INT32 ``[T, topk]`` -- the ``min(topk, visible)`` best
        positions, score descending, equal scores lower position first, then ``-1``
        (:func:`tilesim.shared.dsa_indexer.select_topk`) -- and FP32 ``[T, S]`` (``-inf`` where
        not visible). Same kind (NumPy / torch) as ``q``; inputs are never modified.
    """
    a = check_values(check_meta(
        q, weights, k_cache, block_table, seq_lens, q_scale=q_scale, k_scale=k_scale,
        q_lens=q_lens, path=path, int8_order=int8_order, topk=topk, block_size=block_size,
        trace=trace, progress=progress,
    ))  # fmt: skip
    return indexer_from_args(a, q, trace=trace, progress=progress)


def indexer_from_args(a: Args, like, *, trace=None, progress=None,
                      nan_last: bool = False) -> IndexerResult:  # fmt: skip
    """:func:`dsa_indexer` on already checked arguments (:func:`check_values` Args): the
    scores, the top-k, the kind of ``like`` (the caller's ``q``). The layer step
    (:mod:`tilesim.reference.dsa_attention_step`) checks every stage first, then calls this;
    ``nan_last``: NaN scores (from an earlier stage's overflow) ranked last
    (:func:`tilesim.shared.dsa_indexer.select_topk`) instead of refused."""
    scores = dsa_indexer_scores(a, trace=trace, progress=progress)
    ids = select_topk(scores, host_plan(a).visible, a.topk, nan_last=nan_last)
    return IndexerResult(same_kind(ids, like), same_kind(scores, like))


__all__ = ["IndexerResult", "dsa_indexer", "dsa_indexer_scores", "indexer_from_args"]
