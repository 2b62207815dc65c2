"""MiniMax-M3 MSA block-sparse decode attention (``docs/ops/msa_decode.md``).

Source: ``hicann/pypto-gym`` (the MiniMax-M3 sparse-decode kernel; ``docs/sources.md``, "MSA
sparse decode"). Kernel loop nest (per batch row ``b`` and KV head ``h``, the 16 query heads
of the group on the cube M axis)::

    gather the selected blocks' keys/values in slot order       -> K_cmp, V_cmp [topk*128, 128]
    for c in chunks of NTILE keys:                               (online softmax, visible below)
        S   = fp32(Q[16,128] @ K_c^T)        cube, FP32 out
        S   = S * SCALE                       FP32 (SCALE = fp32(1/sqrt(128)))
        S   = where(keep, S, -3e38)           FP32 select (keep-mask: 1 keep / 0 drop)
        m_c = rowmax(S); P = exp(S - m_c); l_c = rowsum(P)       FP32, unrounded P
        O_c = fp32(bf16(P) @ V_c)             cube, FP32 accumulation in 128-key K steps;
                                              V rows of dropped keys zeroed beforehand
        merge (m, l, O) with (m_c, l_c, O_c)  FP32
    out = bf16(O / l)

Arithmetic: :mod:`tilesim.reference.util.arith` — ``matmul_fp32`` with 128-key K tiles, NumPy's
float32 ``exp`` (:func:`~tilesim.reference.util.arith.exp_fp32_numpy`), ``SoftmaxMerge("online")``.
The keep-mask and the argument checks are :mod:`tilesim.shared.msa_decode` (the device
wrapper uses the same functions).

NaN-robust masking (``docs/ops/msa_decode.md``, "Masking and NaN"): the seeds' kernel masks by
multiplying, ``S*m + (1-m)*(-3e38)``, so a NaN score stays NaN (``0 * NaN``) and a dropped
key's ``P = 0`` times a NaN V row is NaN again. Here a dropped score is selected to -3e38
(:func:`~tilesim.reference.util.msa_common.select_masked`) and the dropped keys' V rows are zeroed
(:func:`~tilesim.reference.util.msa_common.zero_unread_rows`, rows from
:func:`~tilesim.shared.msa_decode.decode_read_mask`) before P.V. On finite inputs the bits are
those of the multiply form; whatever the masked tail of the current block, a selected future
block or an unselected block holds (NaN, inf), the output does not change.

The (b, h) pairs of a group of batch rows and the 16-head group go through one matmul per
chunk; the chunk loop (which changes the numbers) stays explicit. Speed path (private switch
``_FAST``, the code in :mod:`tilesim.reference._msa_decode_fast`): blocks of batch rows on the
reference worker pool, each chunk's K/V gathered from the paged cache and widened in one pass
into reused float64 buffers; with ``_FAST = False`` every batch row runs alone in the calling
thread on the kernel's compact BF16 gather (the readable loop nest of this module). The rows
share no reduction and the widened values are the same, so both give the same bits and the
same trace records (tested).

Split-KV (``tiling.kv_splits = k``, :mod:`tilesim.shared.msa_decode`): the chunks of a (b, h)
are grouped into ``ceil(chunks / k)``-chunk ranges, each folded by its own FP32 online merge
(chunk 0 of a range stored as it is); the ranges' ``(O, l, m)`` are then folded into range
0's state in range order with the same online merge, and ``bf16(O / l)`` as before. The
rounding points inside a chunk do not change; only the merge tree does. ``kv_splits = 1`` (and
any split with one chunk per range) is the chunk loop above, same bits.

Beyond the seeds' kernel (``docs/ops/msa_decode.md``): ``seq_len`` may differ per batch row; when
``topk*128`` is not a multiple of NTILE the last partial chunk is processed (the seeds drop
those keys; ``seeds_compat=True`` reproduces that); a batch row whose every key is masked
returns zeros (the kernel's arithmetic would give the mean of the gathered V).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from tilesim.reference import _msa_decode_fast as _fast
from tilesim.reference.util.arith import F32, F64, SoftmaxMerge, exp_fp32_numpy, matmul_fp32
from tilesim.reference.util.msa_common import (
    K_STEP,
    chunk_bounds,
    select_masked,
    softmax_chunk,
    zero_unread_rows,
)
from tilesim.shared.casts import BF16, to_bf16
from tilesim.shared.layouts.splitkv import split_ranges
from tilesim.shared.models import MINIMAX_M3
from tilesim.shared.msa_decode import (
    Args,
    check_meta,
    check_values,
    cost,
    host_plan,
    resolve_tiling,
    sized_args,
)
from tilesim.shared.soc import DEFAULT_SOC, get_soc
from tilesim.shared.tiling import MsaTiling
from tilesim.shared.trace import emit
from tilesim.shared.validate import check_bool, check_pos_int, check_trace, host_array, same_kind

_CFG = MINIMAX_M3.msa
#: key columns per score matmul (no numeric effect; keeps each (b, h) gemm small)
_N_SPLIT = 128
#: the one private speed switch: True = the speed path of
#: :mod:`tilesim.reference._msa_decode_fast` (blocks of batch rows on the worker pool, each
#: chunk's K/V gathered and widened in one pass into reused buffers); False = the readable
#: loop nest below, one batch row at a time in the calling thread (same bits, same records)
_FAST = True


def msa_sparse_decode_flop(batch: int, hq: int, keys: int, dim: int) -> int:
    """Matmul FLOPs of the decode kernel (2 per multiply-add): ``S = Q K^T`` and ``P V`` for
    ``batch`` rows of ``hq`` query heads over ``keys`` gathered keys each (the keys the chunk
    loop runs; masked keys included), head dim ``dim``. One trace record's share (one chunk
    of one (batch row, KV head)) is ``msa_sparse_decode_flop(1, group, width, dim)``. A thin
    call of :func:`tilesim.shared.msa_decode.cost`; each argument a positive int."""
    keys = check_pos_int(keys, "keys")  # required here (cost's None means topk * by)
    return cost(sized_args(batch, hq, dim), keys=keys)["flop"]  # the one counter of the op


class _Call(NamedTuple):
    """A checked call: host inputs, sizes, chunk bounds, the keep-mask and the V rows read."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    d: Args
    bounds: list
    seeds_compat: bool
    keep: np.ndarray  # bool [B, topk*by]: the key's score counts
    read: np.ndarray  # bool [B, topk*by]: the key's gathered V row is read (else zeroed)
    ranges: list  # [(first, stop), ...] chunk-index ranges of the kv splits


def _check(q, k_blocks, v_blocks, block_ids, seq_len, tiling, soc, seeds_compat, trace) -> _Call:
    """The shared contract (check_meta, check_values, resolve_tiling, host_plan), then the
    host copies and the chunk layout."""
    check_trace(trace)
    seeds_compat = check_bool(seeds_compat, "seeds_compat")
    get_soc(soc)  # TypeError / ValueError naming soc
    d = check_values(check_meta(q, k_blocks, v_blocks, block_ids, seq_len))
    tiling = resolve_tiling(tiling, batch=d.batch, hkv=d.hkv, topk=d.topk, soc=soc)
    sel = d.topk * d.by
    bounds = chunk_bounds(sel, tiling.ntile, seeds_compat=seeds_compat)
    if not bounds:
        raise ValueError(
            f"seeds_compat=True: topk*{d.by} = {sel} keys is less than one NTILE chunk "
            f"({tiling.ntile}); the seeds' kernel runs no chunk and leaves the output unwritten"
        )
    named = (("q", q), ("k_blocks", k_blocks), ("v_blocks", v_blocks))
    hosts = [host_array(x, name) for name, x in named]
    plan = host_plan(d, seeds_compat=seeds_compat)
    ranges = split_ranges(len(bounds), tiling.kv_splits)
    return _Call(*hosts, d, bounds, seeds_compat, plan.keep, plan.read, ranges)


def _chunk_operands(c: _Call, rows: slice):
    """Per chunk ``(c0, w, K_c^T [n, HKV, D, w], V_c [n, HKV, w, D])`` in float64, V rows of
    unread keys zeroed: the kernel's host gather (compact BF16 K/V in slot order), then each
    chunk widened (exactly). The speed path's
    :func:`tilesim.reference._msa_decode_fast.chunk_operands` gives the same values."""
    d, n = c.d, rows.stop - rows.start
    bi = np.arange(rows.start, rows.stop)[:, None, None]
    hi = np.arange(d.hkv)[None, :, None]
    k_cmp = c.k[bi, hi, d.ids[rows, None, :]].reshape(n, d.hkv, d.topk * d.by, d.dim)
    v_cmp = c.v[bi, hi, d.ids[rows, None, :]].reshape(n, d.hkv, d.topk * d.by, d.dim)
    zero_unread_rows(v_cmp, c.read[rows, None, :])  # a fresh gather: zeroed in place
    for c0, w in c.bounds:
        k_c = k_cmp[:, :, c0 : c0 + w].astype(F64)
        yield c0, w, k_c.swapaxes(-1, -2), v_cmp[:, :, c0 : c0 + w].astype(F64)


def _rows(c: _Call, rows: slice) -> tuple[np.ndarray, list]:
    """The kernel for the batch rows ``rows``: FP32 ``O / l`` ``[n, HKV, G, D]`` and each
    chunk's ``(m_c, l_c)`` ``[n, HKV, G]``. Reads shared inputs only (runs on the pool).

    Split-KV (``c.ranges``, :mod:`tilesim.shared.msa_decode`): each range of chunks folds into
    its own ``SoftmaxMerge``; the ranges' FP32 ``(O, l, m)`` states are then folded into range
    0's, in range order, by the same online merge (:func:`_combine`). One range: the plain
    chunk loop."""
    d = c.d
    n = rows.stop - rows.start
    q64 = c.q[rows].astype(F64).reshape(n, d.hkv, d.group, d.dim)  # 16 query rows per KV head
    scale, neg = np.float32(d.dim**-0.5), np.float32(_CFG.decode_mask_neg)
    merges = [SoftmaxMerge("online", exp=exp_fp32_numpy) for _ in c.ranges]
    split_of = [j for j, (a, z) in enumerate(c.ranges) for _ in range(a, z)]
    stats = []
    operands = _fast.chunk_operands if _FAST else _chunk_operands
    for i, (c0, w, k_c, v_c) in enumerate(operands(c, rows)):  # NTILE chunks: online softmax
        # S = Q K_c^T [n, HKV, 16, w] FP32, formed 128 keys at a time: the same dot products
        # (same values) as one matmul, in (b, h) gemms that stay in cache
        s = np.empty((n, d.hkv, d.group, w), dtype=F32)
        with np.errstate(invalid="ignore", over="ignore"):  # NaN/inf in dropped keys: selected
            for n0 in range(0, w, _N_SPLIT):  # away below, so no warning for them
                s[..., n0 : n0 + _N_SPLIT] = matmul_fp32(
                    q64, k_c[..., n0 : n0 + _N_SPLIT], k_tile=K_STEP
                )
        s = s * scale
        # the keep-mask broadcast over KV heads and the 16 rows; a select, NaN-robust
        select_masked(s, c.keep[rows, None, None, c0 : c0 + w], neg)
        m_c, l_c, o_c = softmax_chunk(s, v_c, BF16)
        merges[split_of[i]].update(o_c, l_c, m_c)
        stats.append((m_c[..., 0], l_c[..., 0]))
    return _combine(merges).normalized(), stats


def _combine(merges: list) -> SoftmaxMerge:
    """The split combine: range 0's state, then every later range's ``(O, l, m)`` folded in
    range order with the online merge (the kernel's fixed order). Returns range 0's merge."""
    total = merges[0]
    for part in merges[1:]:
        total.update(part.o, part.l, part.m)
    return total


def _run(c: _Call) -> tuple[np.ndarray, list]:
    """Every batch row: FP32 ``[B, HKV, G, D]`` and per chunk ``(m_c, l_c)`` ``[B, HKV, G]``."""
    d = c.d
    if _FAST:
        results = _fast.run_rows(lambda r: _rows(c, r), d.batch)
    else:  # one batch row at a time, in the calling thread
        results = [_rows(c, slice(b, b + 1)) for b in range(d.batch)]
    out = np.concatenate([o for o, _ in results])
    stats = [
        tuple(np.concatenate([st[i][j] for _, st in results]) for j in (0, 1))
        for i in range(len(c.bounds))
    ]
    return out, stats


def _trace(trace, c: _Call, stats: list) -> None:
    """One record per (batch row, KV head, chunk), in the kernel's order; with several kv
    splits the lane also names the chunk's split (``"kv_split"``)."""
    d = c.d
    split_of = [j for j, (a, z) in enumerate(c.ranges) for _ in range(a, z)]
    for b in range(d.batch):  # kernel order: outer = b*HKV + h, then chunks
        for h in range(d.hkv):
            for i, (c0, w) in enumerate(c.bounds):
                lane = {"batch": b, "kv_head": h}
                if len(c.ranges) > 1:
                    lane["kv_split"] = split_of[i]
                emit(
                    trace,
                    "msa_sparse_decode",
                    lane,
                    i,
                    (c0, c0 + w),
                    keys_used=int(np.count_nonzero(c.keep[b, c0 : c0 + w])),
                    row_max=stats[i][0][b, h].copy(),
                    row_sum=stats[i][1][b, h].copy(),
                    flop=msa_sparse_decode_flop(1, d.group, w, d.dim),
                )


def msa_sparse_decode(
    q,
    k_blocks,
    v_blocks,
    block_ids,
    seq_len,
    *,
    tiling: MsaTiling | None = None,
    soc: str = DEFAULT_SOC,
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
        seq_len: KV length including the current token: one int, or an integer array /
            tensor of ``B`` values, ``1 <= seq_len <= nb*128``.
        tiling: :class:`MsaTiling` (``ntile`` = key chunk width, ``kv_splits`` = split-KV
            ranges, see :mod:`tilesim.shared.msa_decode`); ``None`` means
            ``MsaTiling.from_env()`` at call time (``MSA_NTILE``) with ``kv_splits`` by the
            shared split rule for this shape and ``soc``
            (:func:`tilesim.shared.msa_decode.resolve_tiling`, the device wrapper's rule).
        soc: the SoC the split rule of ``tiling=None`` is taken for (default
            :data:`tilesim.shared.soc.DEFAULT_SOC`, as the device wrapper): the same call
            gives the same bits in both.
        seeds_compat: ``True`` reproduces the seeds' kernel where tilesim deliberately differs:
            the tail ``topk*128 mod NTILE`` keys are dropped (``ValueError`` if no whole chunk
            fits, the kernel would leave the output unwritten) and a fully masked row keeps the
            kernel's arithmetic (mean of the gathered V) instead of zeros.
        trace: called once per (batch row, KV head, chunk), in the kernel's order, with a
            :func:`tilesim.shared.trace.trace_record`: ``lane {"batch", "kv_head"}`` (and
            ``"kv_split"`` when the chunks are in several splits),
            ``step`` = chunk, ``key_range`` = the chunk's ``[start, stop)`` in the gathered
            keys, ``keys_used`` = its kept keys, ``row_max`` / ``row_sum`` = the chunk's FP32
            ``m_c`` / ``l_c`` for the 16 query heads, ``flop`` = its two matmuls.

    Returns:
        BF16 ``[B, 64, 128]`` (same kind, NumPy or torch, as ``q``).

    Rounding points: scores FP32 (correctly rounded dot, BF16 inputs), ``* SCALE`` FP32, mask
    FP32, ``exp`` FP32, P rounded to BF16 before P.V, FP32 accumulation per 128-key K step,
    FP32 merge and division, one final rounding to BF16. With ``kv_splits > 1``: one FP32
    online merge per split, then the splits' states merged in split order (same formulas).
    """
    c = _check(q, k_blocks, v_blocks, block_ids, seq_len, tiling, soc, seeds_compat, trace)
    out, stats = _run(c)
    if not c.seeds_compat:
        # a batch row with no valid key: zeros (the kernel's arithmetic gives mean(V))
        out[~c.keep.any(axis=1)] = 0.0
    if trace is not None:
        _trace(trace, c, stats)
    return same_kind(to_bf16(out).reshape(c.d.batch, c.d.hq, c.d.dim), q)


__all__ = ["msa_sparse_decode", "msa_sparse_decode_flop"]
