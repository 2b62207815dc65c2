"""DeepSeek-V3.2 sparse MLA attention over a quantized (FP8 E4M3 / INT8) latent cache.

Golden of the PyPTO ``sparse_attention_antiquant`` kernels of the seeds (``hicann/pypto-gym``);
the full contract is ``docs/ops/dsa.md``. Shapes, with ``T = B * s1``
query tokens::

    query_nope   [T*nq, 512] BF16     row (b*s1 + s)*nq + head
    query_rope   [T*nq, 64]  BF16
    nope_cache   [rows, 656] FP8 E4M3 or INT8, ``layout`` "pypto" or "flashmla"
      (kv_split: kn_quant [rows, 512] FP8/INT8, kr [rows, 64] BF16, kn_scales [rows, 4] FP32)
    topk_indices [T, n_kv*topk] int   logical positions within sequence b
    block_table  [B, max_blocks] int  logical block -> physical block
    kv_act_seqs  [B] int              sequence lengths
    -> out       [T*nq, 512] BF16

Loop nest (the kernel's): batch ``b`` -> query token ``s`` (``cur_seq``) -> KV head -> group tile
of ``g_tile`` heads -> KV tile ``t`` of ``s_kv_tile`` top-k columns. The batch and token loops
change no numbers. A token's keys are gathered and dequantized once (V0 is exact) and each KV
tile reads its rows. Heads are vectorised inside a group tile; the KV-tile loop is where the
arithmetic happens and is emulated step by step with the models of
:mod:`tilesim.reference.util.arith`.

Per KV tile (FP32 unless stated; rounding points in capitals)::

    K   = [kn | kr] BF16 [n, 576], kn = BF16(fp32(q) * scale_g)      gather + dequant
    S   = FP32(Q @ K^T) * FP32(softmax_scale)                          C1 + V1
    m   = rowmax(S);  P = FP32(exp(S - m));  l = FP32(rowsum(P))       V1 (l from unrounded P)
    online:   O_t = FP32(BF16(P) @ kn)                                 C2
              SoftmaxMerge("online"): first tile O, L, M = O_t, l, m; later tiles
              M' = max(M, m); a = exp(M - M'); c = exp(m - M'); L = a*L + c*l;
              O = O*a + O_t*c;  out = BF16(O / L)   (one tile: BF16(O_t / l))
    per_tile: O_t = BF16(FP32(BF16(P / l) @ kn))                       C2 with BF16 output
              one tile: out = O_t; more tiles (beyond the seeds): SoftmaxMerge("per_tile").

``FP32(x)`` of a matmul is :func:`~tilesim.reference.util.arith.matmul_fp32` with one K tile (the
products summed in float64, rounded once to FP32, so the bits do not depend on BLAS or the
CPU); row sums are :func:`~tilesim.reference.util.arith.rowsum_fp32`; ``exp`` is
:func:`~tilesim.reference.util.arith.exp_fp32_correctly_rounded`. Every other FP32 operation is a
single IEEE FP32 operation, in the kernel's order.

Split-KV (``tiling.kv_splits > 1``, online mode; :mod:`tilesim.shared.dsa`): the
token's tiles are grouped into splits of ``tiles_per_split`` consecutive tiles, each split
folded by its own ``SoftmaxMerge("online")`` (state ``O, L, M`` unnormalised), and the
non-empty splits' states folded in split order by a combine ``SoftmaxMerge("online")``, whose
``normalized()`` is rounded to BF16 -- the kernel's split and combine, step for step.
``kv_splits = 1`` is the unsplit loop above (same bits).

Accumulation (``accumulation=``, a golden-only keyword): ``"exact"`` (the default, the
formulas above: every C1 / C2 K range and every row sum summed exactly and rounded once) or
``"k_steps"``, the arithmetic of the kernel as PyPTO's CPU interpreter runs it, step for step
(docs/ops/dsa.md, "Accumulation"): C1 sums its 576-deep K in steps of the tiling's C1 ``kL1``
and C2 its keys in steps of the C2 ``kL1`` (``c1_tile[3]``, ``c2_tile[3]``), each step summed
exactly and rounded once to FP32, the steps added in FP32 in ascending K order
(:func:`~tilesim.reference.util.arith.matmul_fp32` with ``k_tile``); the row sum ``l`` is
:func:`~tilesim.reference.util.arith.rowsum_fp32_cascade` (the interpreter's FP32 order); a
KV tile keeps its top-k columns in place (a ``-1`` column is a zero ``P`` and a zero V row, as
in the kernel's masked build), so the K steps of C2 and the row sum see the kernel's columns.
The named tilings' kernels were measured bit-exact against it (``tests/device/test_dsa_sim.py``).

Policies beyond the seeds: ``-1`` entries are skipped (a tile whose columns are all ``-1`` is
skipped entirely: it is neither the first nor the last tile); a query token with no usable entry
(``cur_seq = 0`` or all ``-1``) outputs zeros; in per-tile mode with several tiles the
normalised tile outputs are merged with softmax weights (``M' = max(M, m)``, ``A = exp(M - M')
* L``, ``C = exp(m - M') * l``, ``L' = A + C``, ``O = (O*A + O_t*C) / L'``, all FP32;
``out = BF16(O)``) where the seeds' kernel keeps only the last tile.

Speed path: with ``_POOL = True`` (the default, the one switch) query tokens run on the worker
pool of :mod:`tilesim.reference.util.blas_pool` (``TILESIM_REF_THREADS`` workers; the pooled loop is
:mod:`tilesim.reference._dsa_fast`), one token per thread at a time, and the trace records are
emitted in loop order from the calling thread; ``_POOL = False`` runs the readable loop here,
the tokens one after the other in the calling thread. Same bits, same records.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate
from typing import NamedTuple

import numpy as np
from tilesim.reference.util.arith import (
    SoftmaxMerge,
    exp_fp32_correctly_rounded,
    matmul_fp32,
    rowsum_fp32_cascade,
    tile_softmax,
)
from tilesim.reference.util.blas_pool import blas_threads
from tilesim.reference.util.dsa_gather import PackedCache, SplitCache
from tilesim.reference.util.progress import progress_bar
from tilesim.shared.casts import BF16, to_bf16
from tilesim.shared.dsa import (
    HEAD_DIM,
    Args,
    attention_flop,
    check_meta,
    check_values,
    cost_of_indices,
    host_plan,
)
from tilesim.shared.layouts.dsa_rows import NO_ROW
from tilesim.shared.layouts.mla_cache import KV_SPLIT, KV_SPLIT_NAMES, NOPE
from tilesim.shared.models import DEEPSEEK_V32
from tilesim.shared.tiling import SaTileShapeConfig
from tilesim.shared.trace import trace_record
from tilesim.shared.validate import check_choice, host_array, same_kind

#: the speed path: query tokens on the worker pool (``False``: serial in the calling thread)
_POOL = True
_N_KV = 1  # the latent cache holds one KV head (checked by check_meta)
#: the golden's ``accumulation`` models (module docstring): the default first
ACCUMULATIONS = ("exact", "k_steps")


def token_keys(cache, rows: np.ndarray) -> np.ndarray:
    """V0 for all kept entries of one query token: gather + dequantize physical ``rows`` ->
    float64 ``[n, 576]`` copy of ``[kn | kr]`` (BF16 values, widened exactly). The entries of
    one KV tile are a contiguous run of rows, so a tile's ``K`` and ``V`` are views of it."""
    kn, kr = cache.keys(rows)
    k64 = np.empty((rows.size, HEAD_DIM))
    k64[:, :NOPE] = kn
    k64[:, NOPE:] = kr
    return k64


# ----------------------------------------------------------------------------- one KV tile
def tile_attention(q64: np.ndarray, k64: np.ndarray, scale: np.float32, mode: str):
    """C1, V1 and C2 of one KV tile: ``(O_t, l, m)`` for :class:`SoftmaxMerge` ``mode``.

    ``q64 [g, 576]`` / ``k64 [n, 576]`` are float64 copies of BF16 data; V = ``k64[:, :512]``.
    ``online``: ``O_t = FP32(BF16(P) @ V)``; ``per_tile``: ``O_t = BF16(FP32(BF16(P/l) @ V))``.
    """
    s = matmul_fp32(q64, k64.T, k_tile=None) * scale  # C1 + the V1 scaling
    m, p, l = tile_softmax(s, exp=exp_fp32_correctly_rounded)  # V1
    v64 = k64[:, :NOPE]
    if mode == "online":
        return matmul_fp32(to_bf16(p), v64, k_tile=None), l, m  # C2
    return to_bf16(matmul_fp32(to_bf16(p / l), v64, k_tile=None)), l, m


def tile_attention_k_steps(
    q64: np.ndarray,
    k64: np.ndarray,
    kept: np.ndarray,
    scale: np.float32,
    mode: str,
    k_steps: tuple[int, int],
):
    """:func:`tile_attention` with ``accumulation="k_steps"`` (module docstring): C1 in K steps
    of ``k_steps[0]`` columns, C2 in K steps of ``k_steps[1]`` keys, ``l`` in the cascade
    order. ``k64 [n, 576]``: the tile's kept keys; ``kept`` bool ``[w]``: which of the tile's
    ``w`` top-k columns they are (``n`` of them true). The skipped columns stay in place as the
    kernel's masked build has them: ``P = 0`` there (the kernel selects ``-3e38`` as their
    score) and a zero V row, so C2's K steps and the row sum run over the ``w`` columns."""
    c1, c2 = k_steps
    s = matmul_fp32(q64, k64.T, k_tile=c1) * scale  # C1 (K = 576) + the V1 scaling
    m = s.max(axis=-1, keepdims=True)
    with np.errstate(under="ignore"):
        p_kept = exp_fp32_correctly_rounded(s - m)
    if kept.all():
        p, v64 = p_kept, k64[:, :NOPE]
    else:  # the masked build's tile: skipped columns in place, P = 0 and V = 0 there
        p = np.zeros((s.shape[0], kept.size), dtype=np.float32)
        p[:, kept] = p_kept
        v64 = np.zeros((kept.size, NOPE))
        v64[kept] = k64[:, :NOPE]
    l = rowsum_fp32_cascade(p)
    if mode == "online":
        return matmul_fp32(to_bf16(p), v64, k_tile=c2), l, m  # C2
    return to_bf16(matmul_fp32(to_bf16(p / l), v64, k_tile=c2)), l, m


class _TokenPlan(NamedTuple):
    """The KV tiles of one query token: ``valid[t]`` kept entries, tile t = rows
    ``start[t]:start[t+1]`` of the token's gathered keys, ``live`` = tiles with entries;
    ``kept`` bool ``[cur]``: which of the token's first ``cur`` top-k columns are not ``-1``."""

    cur: int
    rows: np.ndarray
    valid: list[int]
    start: list[int]
    live: list[int]
    kept: np.ndarray


def _branch(t: int, live: list[int]) -> str:
    first, last = t == live[0], t == live[-1]
    if first and last:
        return "first_last"
    return "first" if first else "last" if last else "middle"


class _Nest:
    """The loop nest of one call on checked arguments (``token(r)`` is loops L2..L4)."""

    def __init__(self, op: str, a: Args, cache, tracing: bool, accumulation: str = "exact"):
        self.op, self.a, self.cache, self.tracing = op, a, cache, tracing
        self.accumulation = accumulation
        self.qn = host_array(a.query_nope, "query_nope")
        self.qr = host_array(a.query_rope, "query_rope")
        self.cfg = a.tiling
        plan = host_plan(a)
        self.phys, self.cur_seq = plan.phys, plan.cur_seq
        self.out = np.zeros((a.rows, NOPE), dtype=BF16)
        #: KV tiles per split (all of a token's tiles when kv_splits = 1)
        self.tps = plan.tiles_per_split

    def plan(self, r: int) -> _TokenPlan:
        s_kv = self.cfg.s_kv_tile
        cur = int(self.cur_seq[r])
        used = self.phys[r, :cur]
        kept = used != NO_ROW
        n_tiles = -(-cur // s_kv)
        valid = [int(np.count_nonzero(kept[t * s_kv : (t + 1) * s_kv])) for t in range(n_tiles)]
        live = [t for t in range(n_tiles) if valid[t]]
        return _TokenPlan(cur, used[kept], valid, list(accumulate(valid, initial=0)), live, kept)

    def token(self, r: int) -> list[dict]:
        """Query token ``r = b*s1 + s``: writes its ``nq`` output rows and returns its trace
        records (empty when not tracing). Reads shared inputs only."""
        nq, g_tile = self.a.nq, self.cfg.g_tile
        plan = self.plan(r)
        q_tok = k64 = None
        if plan.live:
            k64 = token_keys(self.cache, plan.rows)  # V0 of every tile (exact, so done once)
            rows = slice(r * nq, (r + 1) * nq)
            q_tok = np.concatenate([self.qn[rows], self.qr[rows]], axis=1).astype(np.float64)
        records: list[dict] = []
        group = nq // _N_KV
        for kv in range(_N_KV):  # L2
            for g in range(-(-group // g_tile)):  # L3
                h0 = kv * group + g * g_tile
                h1 = min(h0 + g_tile, (kv + 1) * group)
                self.group_tile(r, kv, g, (h0, h1), q_tok, k64, plan, records)
        return records

    def group_tile(self, r, kv, g, heads, q_tok, k64, plan: _TokenPlan, records) -> None:
        """L4 (KV tiles) of one group tile of heads ``[h0, h1)``; writes its output rows.

        With ``kv_splits > 1`` the tiles are folded split by split (each split its own
        :class:`SoftmaxMerge`), then the splits' unnormalised states are folded in split order
        by a combine :class:`SoftmaxMerge` (:mod:`tilesim.shared.dsa`)."""
        h0, h1 = heads
        n_tiles, tps = len(plan.valid), self.tps
        splits = []
        for t0 in range(0, n_tiles, tps):
            tiles = range(t0, min(t0 + tps, n_tiles))
            merge = SoftmaxMerge(self.cfg.softmax, exp=exp_fp32_correctly_rounded)
            live = [t for t in tiles if plan.valid[t]]
            for t in tiles:
                m = l = None
                if plan.valid[t]:
                    o_t, l, m = self.tile(q_tok[h0:h1], k64, plan, t, merge.mode)
                    merge.update(o_t, l, m)  # V2
                if self.tracing:
                    branch = _branch(t, live) if plan.valid[t] else "skip"
                    records.append(self.record(r, (kv, g, heads), t, plan, (m, l), branch))
            splits.append(merge)
        done = [mg for mg in splits if not mg.empty]
        if not done:
            return
        if len(splits) == 1:
            result = done[0].normalized()
        else:  # the combine stage: fold the splits' (O, L, M) in split order
            combine = SoftmaxMerge("online", exp=exp_fp32_correctly_rounded)
            for mg in done:
                combine.update(mg.o, mg.l, mg.m)
            result = combine.normalized()
        base = r * self.a.nq
        self.out[base + h0 : base + h1] = to_bf16(result)

    def tile(self, q64, k64, plan: _TokenPlan, t: int, mode: str):
        """C1, V1, C2 of KV tile ``t`` (``k64``: the token's kept keys) in the call's
        ``accumulation``: :func:`tile_attention` or :func:`tile_attention_k_steps`."""
        k_t = k64[plan.start[t] : plan.start[t + 1]]  # K = [kn | kr] of the tile
        if self.accumulation == "exact":
            return tile_attention(q64, k_t, self.a.softmax_scale, mode)
        s_kv = self.cfg.s_kv_tile
        kept = plan.kept[t * s_kv : (t + 1) * s_kv]
        steps = (self.cfg.c1_tile[3], self.cfg.c2_tile[3])  # the cube tiles' kL1
        return tile_attention_k_steps(q64, k_t, kept, self.a.softmax_scale, mode, steps)

    def record(self, r, where, t, plan: _TokenPlan, ml, branch) -> dict:
        """The trace record of KV tile ``t`` of a group tile (``where = (kv, g, heads)``)."""
        kv, g, heads = where
        m, l = ml
        s_kv = self.cfg.s_kv_tile
        b, s = divmod(r, self.a.s1)
        extra = {"kv_split": t // self.tps} if self.cfg.kv_splits > 1 else {}
        return trace_record(
            self.op,
            {"b": b, "s": s, "kv_head": kv, "group": g},
            t,
            (t * s_kv, min((t + 1) * s_kv, plan.cur)),
            keys_used=plan.valid[t],
            row_max=None if m is None else m[:, 0].copy(),
            row_sum=None if l is None else l[:, 0].copy(),
            flop=attention_flop(heads[1] - heads[0], plan.valid[t]),
            heads=heads,
            branch=branch,
            n_tiles=len(plan.valid),
            softmax=self.cfg.softmax,
            s_kv_tile=s_kv,
            **extra,
        )


def _run(op: str, a: Args, cache, trace, progress, accumulation: str) -> np.ndarray:
    """Loops L0 (batch) x L1 (query token), in (b, s) order; they change no numbers. With
    ``_POOL`` the same tokens run on the worker pool instead
    (:func:`tilesim.reference._dsa_fast.run_tokens`), the records still consumed in this
    order from the calling thread."""
    nest = _Nest(op, a, cache, trace is not None, accumulation)
    n_tokens = a.n_b * a.s1
    bar = progress_bar(n_tokens, progress, op)

    def emit(records: list[dict]) -> None:
        for rec in records:
            trace(rec)
        if bar is not None:
            bar.update(1)

    try:
        with blas_threads():  # numbers do not depend on it, speed on a busy machine does
            if _POOL:
                from tilesim.reference._dsa_fast import run_tokens

                run_tokens(nest.token, n_tokens, emit)
            else:
                for r in range(n_tokens):  # L0 x L1: r = b * s1 + s
                    emit(nest.token(r))
    finally:
        if bar is not None:
            bar.close()
    return nest.out


# ----------------------------------------------------------------------------- public ops
def sparse_attention_antiquant(
    query_nope,
    query_rope,
    nope_cache,
    topk_indices,
    block_table,
    kv_act_seqs,
    *,
    nq: int = DEEPSEEK_V32.num_q_heads,
    n_kv: int = DEEPSEEK_V32.num_kv_heads,
    softmax_scale: float,
    topk: int = DEEPSEEK_V32.topk,
    block_size: int = DEEPSEEK_V32.block_size,
    tiling: SaTileShapeConfig | None = None,
    layout: str = "pypto",
    accumulation: str = "exact",
    trace: Callable[[dict], None] | None = None,
    progress: bool | None = None,
):
    """Sparse MLA attention over a packed quantized latent cache -> BF16 ``[T*nq, 512]``.

    Args (the op's inputs are declared once, for the golden and the kernel wrapper, in
    :func:`tilesim.shared.dsa.packed_inputs` and :func:`~tilesim.shared.dsa.model_keywords`;
    the defaults are DeepSeek-V3.2's, :data:`tilesim.shared.models.DEEPSEEK_V32`):
        query_nope: BF16 ``[T*nq, 512]``; query_rope: BF16 ``[T*nq, 64]`` (``T = B*s1``).
        nope_cache: FP8 E4M3 or INT8 ``[rows, 656]`` packed in ``layout`` (``"pypto"``: nope |
            rope | scales; ``"flashmla"``: nope | scales | rope).
        topk_indices: int ``[T, n_kv*topk]`` logical positions; ``-1`` = skipped.
        block_table: int ``[B, max_blocks]``; kv_act_seqs: int ``[B]``.
        nq, n_kv, softmax_scale, topk, block_size: as in the kernel (``n_kv`` must be 1).
        tiling: :class:`~tilesim.shared.tiling.SaTileShapeConfig`; ``None`` reads
            ``SaTileShapeConfig.from_env()`` at call time (decode preset by default); its
            ``kv_splits`` selects split-KV (module docstring).
        trace: called once per (token, group tile, KV tile) with a
            :func:`tilesim.shared.trace.trace_record` (lane ``{"b", "s", "kv_head", "group"}``,
            ``step`` = KV tile, ``key_range`` = the tile's top-k columns, ``keys_used`` = its
            valid entries, ``row_max`` / ``row_sum`` per head, ``flop``; ``extra``: ``heads``,
            ``branch``, ``n_tiles``, ``softmax``, ``s_kv_tile``), in loop order and from the
            calling thread whatever ``TILESIM_REF_THREADS`` is.
        accumulation: ``"exact"`` (default) or ``"k_steps"``: the kernel's K steps and row-sum
            order as the CPU interpreter runs them (module docstring); golden-only.
        progress: ``True`` always shows a tqdm bar, ``False`` never, ``None`` after 3 s.

    Returns:
        BF16 ``[T*nq, 512]`` (a NumPy array, or a CPU torch tensor when ``query_nope`` is one).
        Inputs are never modified. See the module docstring for the arithmetic.
    """
    check_choice(accumulation, "accumulation", ACCUMULATIONS)
    a = check_values(check_meta(
        query_nope, query_rope, (nope_cache,), topk_indices, block_table, kv_act_seqs,
        layout=layout, nq=nq, n_kv=n_kv, softmax_scale=softmax_scale, topk=topk,
        block_size=block_size, tiling=tiling, trace=trace, progress=progress,
    ))  # fmt: skip
    cache = PackedCache(host_array(nope_cache, "nope_cache"), layout)
    out = _run("sparse_attention_antiquant", a, cache, trace, progress, accumulation)
    return same_kind(out, query_nope)


def sparse_attention_antiquant_kv_split(
    query_nope,
    query_rope,
    kn_quant,
    kr,
    kn_scales,
    topk_indices,
    block_table,
    kv_act_seqs,
    *,
    nq: int = DEEPSEEK_V32.num_q_heads,
    n_kv: int = DEEPSEEK_V32.num_kv_heads,
    softmax_scale: float,
    topk: int = DEEPSEEK_V32.topk,
    block_size: int = DEEPSEEK_V32.block_size,
    tiling: SaTileShapeConfig | None = None,
    accumulation: str = "exact",
    trace: Callable[[dict], None] | None = None,
    progress: bool | None = None,
):
    """:func:`sparse_attention_antiquant` over the kv_split cache: ``kn_quant [rows, 512]`` FP8
    E4M3 or INT8, ``kr [rows, 64]`` BF16, ``kn_scales [rows, 4]`` FP32. Same arithmetic, same
    bits as the packed op on the same data."""
    check_choice(accumulation, "accumulation", ACCUMULATIONS)
    caches = (kn_quant, kr, kn_scales)
    a = check_values(check_meta(
        query_nope, query_rope, caches, topk_indices, block_table, kv_act_seqs,
        layout=KV_SPLIT, nq=nq, n_kv=n_kv, softmax_scale=softmax_scale, topk=topk,
        block_size=block_size, tiling=tiling, trace=trace, progress=progress,
    ))  # fmt: skip
    cache = SplitCache(*(host_array(x, n) for n, x in zip(KV_SPLIT_NAMES, caches, strict=True)))
    out = _run("sparse_attention_antiquant_kv_split", a, cache, trace, progress, accumulation)
    return same_kind(out, query_nope)


# ----------------------------------------------------------------------------- FLOP counter
def sparse_attention_cost(
    topk_indices,
    kv_act_seqs,
    *,
    nq: int = DEEPSEEK_V32.num_q_heads,
    topk: int = DEEPSEEK_V32.topk,
    s1: int | None = None,
) -> dict:
    """FLOP and byte counts of one call: :func:`tilesim.shared.dsa.cost` (the op's one
    counter; ``flop`` is the sum of the trace records' ``flop`` fields) -- its ``flop``,
    ``attended``, ``bytes`` and ``unique_kv_bytes``."""
    c = cost_of_indices(topk_indices, kv_act_seqs, nq=nq, topk=topk, s1=s1)
    return {k: c[k] for k in ("flop", "attended", "bytes", "unique_kv_bytes")}


__all__ = [
    "ACCUMULATIONS",
    "sparse_attention_antiquant",
    "sparse_attention_antiquant_kv_split",
    "sparse_attention_cost",
    "tile_attention",
    "tile_attention_k_steps",
    "token_keys",
]
