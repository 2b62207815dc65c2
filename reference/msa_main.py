"""MiniMax-M3 MSA main branch: prefill attention over the selected blocks.

Public names:

* :func:`msa_main_branch` — the kernel behind its wrapper. Wrapper: the kernel mask
  (:func:`tilesim.shared.msa_main.kernel_mask`) and the cast of q, k, v to FP16/BF16 unless
  ``dtype="fp32"``. Kernel loop nest::

      for hg in 64 query heads (h_kv = hg // 16), all query rows on the cube M axis:
          for c in NTILE-wide key chunks:                        (online softmax)
              raw = fp32(Q_h @ K_c^T)                 cube, FP32 out
              S   = raw * scale + mask[:, chunk]      FP32 (scale = fp32(dh^-0.5))
              m_c = rowmax(S); P = exp(S - m_c); l_c = rowsum(P)      FP32
              PV  = fp32(cast(P) @ V_c)               cast: identity / FP16 / BF16; FP32
                                                      accumulation in 128-key K steps
              merge (m, l, O)                         FP32
          out = O / l                                 FP32 (output stays FP32)

* :func:`build_msa_block_mask`, :func:`kernel_mask` — the host rules, defined in
  :mod:`tilesim.shared.msa_main` and re-exported here.
* :func:`msa_main_flop_count` / :func:`msa_main_live_flop_count` — the kernel's matmul FLOPs
  and the share of them no golden can avoid (the trace's ``flop`` field; the bench).

Arithmetic: :mod:`tilesim.reference.util.arith` (``matmul_fp32`` with 128-column K tiles, NumPy's
float32 exp, ``SoftmaxMerge("online")``). Both paths batch the 16 heads of a KV group into one
matmul per chunk. The speed path (:mod:`tilesim.reference._msa_main_fast`, chosen by
:data:`_FAST`, or ``_fast=`` per call) adds blocks of :data:`ROW_BLOCK` query rows run as
(KV head, row block) items on the reference worker pool and skips the K steps no row of a row
block sees when that provably changes no bit. The plain path (this module, the golden)
runs one item per KV head over all rows, serially, every key. Both give the same bits and,
with a trace hook, the same records. The path is chosen by the switch alone, never by
``trace``: when the speed path skipped dead keys (which leaves out the per-chunk ``m_c`` /
``l_c`` of the rows it skips), a trace hook adds a statistics pass of the plain path over all
keys, so tracing costs about one more run.

Deliberate differences from the seeds' kernel (``docs/ops/msa_main.md``): a last partial chunk is
processed when ``topk*bk`` is not a multiple of NTILE (``seeds_compat=True`` drops it, as the
kernel does), and a query row that sees no selected key returns zeros (the kernel's
arithmetic gives the mean of V there).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from tilesim.reference import _msa_main_fast
from tilesim.reference._msa_main_fast import DEAD_KEY_SCORE_BOUND, ROW_BLOCK, live_key_steps
from tilesim.reference.util.arith import F64, SoftmaxMerge, exp_fp32_numpy, matmul_fp32
from tilesim.reference.util.msa_common import K_STEP, chunk_bounds, softmax_chunk, zero_unread_rows
from tilesim.shared.casts import BF16, FP32, to_bf16, widen_to_fp32
from tilesim.shared.msa_main import (
    MASK_NEG,
    Args,
    build_msa_block_mask,
    check_meta,
    check_values,
    cost,
    host_plan,
    kernel_mask,
)
from tilesim.shared.tiling import MsaTiling
from tilesim.shared.trace import Trace, emit
from tilesim.shared.validate import check_bool, check_trace, host_array, same_kind

OP = "msa_main_branch"
F16 = np.dtype(np.float16)
_P_DTYPES = {"fp32": FP32, "fp16": F16, "bf16": BF16}

#: the one speed switch: :mod:`tilesim.reference._msa_main_fast` (row blocks on the worker
#: pool, dead-key skipping) instead of the golden loop below; ``_fast=`` overrides it per call
_FAST = True


# ----------------------------------------------------------------------------- FLOP counts
def _count_args(n: int, hq: int, dh: int, kv_len: int, block_mask=None) -> Args:
    """An :class:`~tilesim.shared.msa_main.Args` carrying just what ``cost`` reads."""
    nbq, topk, bk = (1, 1, kv_len) if block_mask is None else tuple(block_mask.shape[:3])
    return Args(int(n), int(hq), 1, int(dh), nbq, topk, bk, int(kv_len), "fp32", 0, None,
                block_mask)  # fmt: skip


def msa_main_flop_count(n: int, hq: int, dh: int, kv_len: int) -> int:
    """The kernel's matmul FLOPs (2 per multiply-add): ``S = Q K^T`` and ``P V`` for ``n``
    rows of ``hq`` heads over ``kv_len`` keys, masked keys included (one trace record:
    ``hq=1`` and the chunk's width). A thin call of :func:`tilesim.shared.msa_main.cost`."""
    return cost(_count_args(n, hq, dh, kv_len))["flop"]


def msa_main_live_flop_count(n: int, hq: int, dh: int, block_mask) -> int:
    """The part of :func:`msa_main_flop_count` any golden has to do: the ``(query block,
    slot)`` pairs in which some entry of ``block_mask [nbq, topk, bk, bk]`` is visible
    (> -1e9), each with the query block's real rows (< ``n``) and ``bk`` keys. Future blocks
    and padding slots are dead work. A thin call of :func:`tilesim.shared.msa_main.cost`."""
    mask = host_array(block_mask, "block_mask")
    return cost(_count_args(n, hq, dh, mask.shape[1] * mask.shape[2], mask))["live_flop"]


# ----------------------------------------------------------------------------- checks
class _Call(NamedTuple):
    """The checked arguments of one call."""

    args: Args
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    bounds: list[tuple[int, int]]  #: ``(start, width)`` of the NTILE chunks
    seeds_compat: bool
    fast: bool
    trace: Trace


def _check(inputs: dict, seeds_compat, trace, fast) -> _Call:
    """Every argument check, before any work; ``inputs``: the call's inputs by name
    (:func:`~tilesim.shared.msa_main.main_inputs`, the parameters of ``check_meta``)."""
    check_trace(trace)
    seeds_compat = check_bool(seeds_compat, "seeds_compat")
    fast = _FAST if fast is None else check_bool(fast, "_fast")
    a = check_values(check_meta(**inputs))
    bounds = chunk_bounds(a.kv_len, a.tiling.ntile, seeds_compat=seeds_compat)
    if not bounds:
        raise ValueError(
            f"seeds_compat=True: kv_len = topk*bk = {a.kv_len} is less than one NTILE chunk "
            f"({a.tiling.ntile}); the seeds' kernel runs no chunk (0/0 output)"
        )
    q, k, v = (host_array(inputs[n], n) for n in ("query", "key_blocks", "value_blocks"))
    return _Call(a, q, k, v, bounds, seeds_compat, fast, trace)


# ----------------------------------------------------------------------------- the wrapper
def _cast_inputs(a: np.ndarray, dtype: str) -> np.ndarray:
    """The wrapper's cast of q / k / v, widened exactly to float64 (FP32 mode: no rounding)."""
    a32 = widen_to_fp32(a)
    if dtype == "fp16":
        with np.errstate(over="ignore"):
            a32 = a32.astype(F16)
    elif dtype == "bf16":
        a32 = to_bf16(a32)
    return a32.astype(F64)


class _Plan(NamedTuple):
    """The kernel's operands after the wrapper, in the layouts the loop reads."""

    q64: np.ndarray  #: ``[HKV, n*16, dh]``: a block of query rows is one contiguous slab
    k64: np.ndarray  #: ``[HKV, dh, kv_len]``
    k_chunks: list  #: ``[HKV][chunk]`` -> ``[dh, w]`` (contiguous copies of ``k64``)
    v64: np.ndarray  #: ``[HKV, kv_len, dh]``
    mask2d: np.ndarray  #: ``[n, kv_len]`` FP32 rows of the kernel mask
    visible: np.ndarray  #: ``mask2d > -1e9``
    bounds: list
    scale: np.float32
    p_dtype: np.dtype
    group: int  #: query heads per KV head


def _plan(call: _Call) -> _Plan:
    """The wrapper: kernel mask rows ``< n`` (the rest never reach the output) and casts."""
    a = call.args
    n, hkv, dh = a.n, a.hkv, a.dh
    group = a.hq // hkv
    mask2d, read, _ = host_plan(a)  # mask rows < n; keys no row sees (padding, past n)
    q64 = _cast_inputs(call.q, a.dtype).reshape(n, hkv, group, dh)
    q64 = np.ascontiguousarray(q64.transpose(1, 0, 2, 3)).reshape(hkv, n * group, dh)
    k_kv, v_kv = (
        zero_unread_rows(_cast_inputs(x, a.dtype).transpose(1, 0, 2), read)
        for x in (call.k, call.v)
    )  # [HKV, kv, dh] views of new arrays
    k64 = np.ascontiguousarray(k_kv.transpose(0, 2, 1))  # [HKV, dh, kv]
    v64 = np.ascontiguousarray(v_kv)  # [HKV, kv, dh]
    k_chunks = [
        [np.ascontiguousarray(k64[h, :, c0 : c0 + w]) for c0, w in call.bounds] for h in range(hkv)
    ]
    scale = np.float32(dh**-0.5)
    return _Plan(
        q64,
        k64,
        k_chunks,
        v64,
        mask2d,
        mask2d > MASK_NEG,
        call.bounds,
        scale,
        _P_DTYPES[a.dtype],
        group,
    )


# ----------------------------------------------------------------------------- the loop nest
def _chunk_operands(plan: _Plan, h_kv: int, c: int, r0: int, r1: int, skip_dead: bool):
    """``(K_c [dh, keys], V_c [keys, dh], mask_c [rows, keys])`` of chunk ``c`` for rows
    ``r0:r1``: every key, or only the live K steps; ``None`` when no row sees a key of it."""
    c0, w = plan.bounds[c]
    cols = _msa_main_fast.live_key_steps(plan.visible[r0:r1], c0, w) if skip_dead else None
    if cols is None:  # the whole chunk, as the kernel computes it
        return plan.k_chunks[h_kv][c], plan.v64[h_kv, c0 : c0 + w], plan.mask2d[r0:r1, c0 : c0 + w]
    if cols.size == 0:
        return None  # the chunk's merge weight is 0 for every row of the block
    return plan.k_chunks[h_kv][c][:, cols], plan.v64[h_kv, c0 + cols], plan.mask2d[r0:r1, c0 + cols]


def _rows_item(plan: _Plan, out: np.ndarray, stats, skip_dead: bool, item) -> None:
    """The chunk loop of KV head ``h_kv`` (its 16 query heads) for query rows ``r0:r1``;
    writes only those rows of ``out [n, HKV, 16, dh]`` and of ``stats`` (``(m_c, l_c)``
    arrays ``[chunk, n, HKV, 16]`` or ``None``)."""
    h_kv, r0, r1 = item
    g = plan.group
    q_blk = plan.q64[h_kv, r0 * g : r1 * g]  # [(r1-r0)*16, dh]
    merge = SoftmaxMerge("online", exp=exp_fp32_numpy)
    for c in range(len(plan.bounds)):  # NTILE chunks: online softmax
        operands = _chunk_operands(plan, h_kv, c, r0, r1, skip_dead)
        if operands is None:
            continue
        k_c, v_c, mask_c = operands
        s = matmul_fp32(q_blk, k_c, k_tile=K_STEP).reshape(r1 - r0, g, -1)  # a view
        np.multiply(s, plan.scale, out=s)  # the FP32 steps run in place
        np.add(s, mask_c[:, None, :], out=s)  # one mask row, 16 heads
        m_c, l_c, o_c = softmax_chunk(s, v_c, plan.p_dtype)
        merge.update(o_c, l_c, m_c)
        if stats is not None:
            stats[0][c, r0:r1, h_kv] = m_c[..., 0]
            stats[1][c, r0:r1, h_kv] = l_c[..., 0]
    if not merge.empty:  # else: the block's rows see no key at all (zeros)
        out[r0:r1, h_kv] = merge.normalized()


def _run(call: _Call, plan: _Plan, *, want_stats: bool):
    """The kernel's loop nest: ``(out [n, HQ, dh], stats)``. The golden: one item per KV head
    over all rows, serially, every key; with ``call.fast`` the items are row blocks on the
    worker pool, dead keys skipped where provably exact (:mod:`tilesim.reference._msa_main_fast`).

    ``stats`` (the per-chunk ``(m_c, l_c)`` of every row) when ``want_stats`` and no chunk was
    skipped, else ``None``: dead-key skipping leaves out the statistics of the rows it skips.
    """
    a = call.args
    n, hkv, g = a.n, a.hkv, plan.group
    out = np.zeros((n, hkv, g, a.dh), dtype=FP32)
    if call.fast:
        stats = _msa_main_fast.run(call, plan, out, _rows_item, want_stats=want_stats)
    else:
        stats = _new_stats(plan, n, hkv) if want_stats else None
        for h in range(hkv):  # KV heads, all rows at once
            _rows_item(plan, out, stats, False, (h, 0, n))
    out = out.reshape(n, a.hq, a.dh)
    if not call.seeds_compat:
        out[~plan.visible.any(axis=1)] = 0.0  # a row that sees no key: zeros
    return out, stats


def _new_stats(plan: _Plan, n: int, hkv: int) -> tuple[np.ndarray, np.ndarray]:
    """Empty FP32 ``(m_c, l_c)`` arrays ``[chunk, n, HKV, 16]`` for the trace records."""
    return tuple(np.empty((len(plan.bounds), n, hkv, plan.group), dtype=FP32) for _ in range(2))


def _emit_records(call: _Call, plan: _Plan, stats) -> None:
    """One record per (query head, chunk), in the kernel's order (head-major)."""
    a = call.args
    g = plan.group
    seen_cols = plan.visible.any(axis=0)  # keys some query row sees
    for hg in range(a.hq):
        for c, (c0, w) in enumerate(plan.bounds):
            emit(
                call.trace,
                OP,
                {"head": hg, "kv_head": hg // g},
                c,
                (c0, c0 + w),
                keys_used=int(seen_cols[c0 : c0 + w].sum()),
                row_max=stats[0][c, :, hg // g, hg % g].copy(),
                row_sum=stats[1][c, :, hg // g, hg % g].copy(),
                flop=msa_main_flop_count(a.n, 1, a.dh, w),
            )


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
    _fast: bool | None = None,
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
        trace: called once per (query head, chunk), in the kernel's order, with a
            :func:`tilesim.shared.trace.trace_record`: lane ``{"head", "kv_head"}``, step = the
            chunk, ``key_range`` its keys, ``keys_used`` those some query row sees, ``row_max``
            / ``row_sum`` the chunk's FP32 ``m_c`` / ``l_c`` for the ``n`` rows, ``flop``
            :func:`msa_main_flop_count` of the chunk for one head.
        _fast: private: the speed path (``None``: :data:`_FAST`); same bits and records.

    Returns:
        FP32 ``[n, HQ, dh]`` (same kind, NumPy or torch, as ``query``).

    Rounding points: inputs cast to ``dtype``; scores FP32 (float64 sum of exact products,
    rounded once); scale multiply and mask add FP32; exp FP32; P cast to ``dtype``; P.V FP32
    accumulation per 128-key K step; merge and final division FP32.
    """
    inputs = dict(query=query, key_blocks=key_blocks, value_blocks=value_blocks,
                  block_mask=block_mask, dtype=dtype, max_n=max_n, tiling=tiling)  # fmt: skip
    call = _check(inputs, seeds_compat, trace, _fast)
    plan = _plan(call)
    out, stats = _run(call, plan, want_stats=trace is not None)
    if trace is not None:
        if stats is None:  # the speed path skipped dead keys: a statistics pass over all keys
            _, stats = _run(call._replace(fast=False), plan, want_stats=True)
        _emit_records(call, plan, stats)
    return same_kind(out, query)


__all__ = [
    "DEAD_KEY_SCORE_BOUND",
    "MASK_NEG",
    "ROW_BLOCK",
    "build_msa_block_mask",
    "kernel_mask",
    "live_key_steps",
    "msa_main_branch",
    "msa_main_flop_count",
    "msa_main_live_flop_count",
]
