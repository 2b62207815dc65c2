"""DeepSeek-V3.2 sparse MLA attention over a quantized (FP8 E4M3 / INT8) latent cache.

Golden of the PyPTO ``sparse_attention_antiquant`` kernels (``op-facts`` §5; the full contract is
``docs/ops/deepseek_sparse_attention.md``). Shapes, with ``T = B * s1`` query tokens::

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
change no numbers: query tokens run on a thread pool (``TILESIM_REF_THREADS`` workers, see
:mod:`tilesim.reference.blas_pool`), one token per thread at a time, and ``trace`` records are
emitted in loop order from the calling thread. A token's keys are gathered and dequantized once
(V0 is exact) and each KV tile reads its rows. Heads are vectorised inside a group tile; the
KV-tile loop is where the arithmetic happens and is emulated step by step.

Per KV tile (FP32 unless stated; rounding points in capitals)::

    K   = [kn | kr] BF16 [n, 576], kn = BF16(fp32(q) * scale_g)      gather + dequant
    S   = FP32(Q @ K^T) * FP32(softmax_scale)                          C1 + V1
    m   = rowmax(S);  P = FP32(exp(S - m));  l = FP32(rowsum(P))       V1 (l from unrounded P)
    online:   O_t = FP32(BF16(P) @ kn)                                 C2
              first tile O, L, M = O_t, l, m; later tiles
              M' = max(M, m); a = exp(M - M'); A = a*L; c = exp(m - M'); L = A + c*l;
              O = O*a + O_t*c;  last tile: out = BF16(O / L)   (one tile: BF16(O_t / l))
    per_tile: O_t = BF16(FP32(BF16(P / l) @ kn))                       C2 with BF16 output
              one tile: out = O_t; more tiles (beyond the seeds) are merged, see below.

``FP32(x)`` of a matmul or row sum means: accumulated in float64, rounded once to FP32 (an
exactly rounded FP32 accumulator, so the golden's bits do not depend on BLAS or the CPU);
``exp`` is evaluated in float64 and rounded once to FP32 (correctly rounded). Every other FP32
operation is a single IEEE FP32 operation, in the kernel's order.

Policies beyond the seeds: ``-1`` entries are skipped (a tile whose columns are all ``-1`` is
skipped entirely: it is neither the first nor the last tile); a query token with no usable entry
(``cur_seq = 0`` or all ``-1``) outputs zeros; in per-tile mode with several tiles the
normalised tile outputs are merged with softmax weights (``M' = max(M, m)``, ``A = exp(M - M')
* L``, ``C = exp(m - M') * l``, ``L' = A + C``, ``O = (O*A + O_t*C) / L'``, all FP32;
``out = BF16(O)``) where the seeds' kernel keeps only the last tile.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import accumulate

import numpy as np
from tilesim.reference.blas_pool import blas_threads, map_in_order
from tilesim.reference.dsa_gather import (
    NO_ROW,
    PackedCache,
    SplitCache,
    plan_physical_rows,
)
from tilesim.shared.casts import BF16, FP8_E4M3, to_bf16
from tilesim.shared.mla_cache import (
    LAYOUTS,
    NOPE,
    PYPTO_ROW_BYTES,
    ROPE,
    check_cache_fields,
)
from tilesim.shared.tiling import SaTileShapeConfig

HEAD_DIM = NOPE + ROPE  # 576
_QUANT_DTYPES = (FP8_E4M3, np.dtype(np.int8))
#: show a progress bar (progress=None) once a call has run this many seconds
PROGRESS_DELAY_S = 3.0


# ----------------------------------------------------------------------------- per-tile math


def exp_fp32(x: np.ndarray) -> np.ndarray:
    """Correctly rounded FP32 ``exp`` of an FP32 array (float64 evaluation, one rounding)."""
    return np.exp(x.astype(np.float64)).astype(np.float32)


def tile_scores(q64: np.ndarray, k64: np.ndarray, scale: np.float32) -> np.ndarray:
    """C1 + the V1 scaling: ``FP32(Q @ K^T) * scale`` -> FP32 ``[g, n]`` (Q, K given as float64
    copies of BF16 data, so every product is exact)."""
    return (q64 @ k64.T).astype(np.float32) * scale


def tile_softmax(s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """V1: ``m = rowmax(S)``, ``P = exp(S - m)``, ``l = rowsum(P)`` (FP32; ``[g,1]``, ``[g,n]``,
    ``[g,1]``)."""
    m = s.max(axis=1, keepdims=True)
    p = exp_fp32(s - m)
    l = p.sum(axis=1, keepdims=True, dtype=np.float64).astype(np.float32)
    return m, p, l


def matmul_fp32(a_bf16: np.ndarray, v64: np.ndarray) -> np.ndarray:
    """C2 with an FP32 accumulator: ``FP32(A @ V)`` for BF16 ``A`` and float64 copy ``V``."""
    return (a_bf16.astype(np.float64) @ v64).astype(np.float32)


class OnlineMerge:
    """The online kernel's V2 stage: first / middle / last branches across KV tiles."""

    def __init__(self) -> None:
        self.o = self.l = self.m = None

    def step(self, o_t: np.ndarray, l: np.ndarray, m: np.ndarray, *, last: bool):
        """Fold one tile in; returns the BF16 output on the last tile, else ``None``."""
        if self.o is None:  # first tile
            if last:
                return to_bf16(o_t / l)
            self.o, self.l, self.m = o_t, l, m
            return None
        m_new = np.maximum(self.m, m)
        a = exp_fp32(self.m - m_new)
        big_a = a * self.l
        c = exp_fp32(m - m_new)
        self.l = big_a + c * l
        self.m = m_new
        tmp = self.o * a + o_t * c
        if last:
            return to_bf16(tmp / self.l)
        self.o = tmp
        return None


class PerTileMerge:
    """Per-tile mode: one tile is the seeds' kernel (its BF16 C2 output is the answer); with more
    tiles the normalised tile outputs are merged with softmax weights (beyond the seeds)."""

    def __init__(self) -> None:
        self.o = self.l = self.m = None

    def step(self, o_t: np.ndarray, l: np.ndarray, m: np.ndarray, *, last: bool):
        o_t32 = o_t.astype(np.float32)
        if self.o is None:
            if last:
                return o_t.copy()
            self.o, self.l, self.m = o_t32, l, m
            return None
        m_new = np.maximum(self.m, m)
        big_a = exp_fp32(self.m - m_new) * self.l
        big_c = exp_fp32(m - m_new) * l
        l_new = big_a + big_c
        self.o = (self.o * big_a + o_t32 * big_c) / l_new
        self.l, self.m = l_new, m_new
        if last:
            return to_bf16(self.o)
        return None


# ----------------------------------------------------------------------------- argument checks


def _to_numpy(x, name: str) -> np.ndarray:
    from tilesim.reference.interop import is_torch_tensor, to_numpy

    if is_torch_tensor(x):
        if x.device.type != "cpu":
            raise ValueError(f"{name}: expected a CPU tensor, got device {x.device}")
        return to_numpy(x)
    if x is None:
        raise TypeError(f"{name}: expected an array, got None")
    return np.asarray(x)


def _check_pos_int(name: str, v) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v <= 0:
        raise ValueError(f"{name}: expected a positive integer, got {v!r}")
    return int(v)


def _check_int_array(name: str, a: np.ndarray, ndim: int) -> np.ndarray:
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected an integer array (int32), got dtype {a.dtype}")
    if a.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(a.shape)}")
    return a


def _check_bf16(name: str, a: np.ndarray, cols: int) -> None:
    if a.dtype != BF16:
        raise TypeError(f"{name}: expected bfloat16, got dtype {a.dtype}")
    if a.ndim != 2 or a.shape[1] != cols:
        raise ValueError(f"{name}: expected shape [T*nq, {cols}], got {tuple(a.shape)}")


def _resolve_tile_config(tile_config) -> SaTileShapeConfig:
    if tile_config is None:
        return SaTileShapeConfig.from_env()
    if not isinstance(tile_config, SaTileShapeConfig):
        raise TypeError(
            f"tile_config: expected a SaTileShapeConfig or None, got {type(tile_config).__name__}"
        )
    return tile_config


def _check_common(query_nope, query_rope, topk_indices, block_table, kv_act_seqs, **kw):
    qn = _to_numpy(query_nope, "query_nope")
    qr = _to_numpy(query_rope, "query_rope")
    ti = _check_int_array("topk_indices", _to_numpy(topk_indices, "topk_indices"), 2)
    bt = _check_int_array("block_table", _to_numpy(block_table, "block_table"), 2)
    ks = _check_int_array("kv_act_seqs", _to_numpy(kv_act_seqs, "kv_act_seqs"), 1)
    nq = _check_pos_int("nq", kw["nq"])
    n_kv = _check_pos_int("n_kv", kw["n_kv"])
    topk = _check_pos_int("topk", kw["topk"])
    block_size = _check_pos_int("block_size", kw["block_size"])
    scale = kw["softmax_scale"]
    if (
        isinstance(scale, (bool, np.bool_))
        or not isinstance(scale, (int, float, np.floating, np.integer))
        or not math.isfinite(float(scale))
        or float(scale) <= 0
    ):
        raise ValueError(f"softmax_scale: expected a finite positive number, got {scale!r}")
    if n_kv != 1:
        raise ValueError(
            f"n_kv: expected 1 (the latent cache holds one KV head per row, as in DeepSeek-V3.2 "
            f"MQA; the seeds' kernels only index correctly for n_kv = 1), got {n_kv}"
        )
    _check_bf16("query_nope", qn, NOPE)
    _check_bf16("query_rope", qr, ROPE)
    if qr.shape[0] != qn.shape[0]:
        raise ValueError(
            f"query_rope: expected {qn.shape[0]} rows like query_nope, got {qr.shape[0]}"
        )
    n_b = ks.shape[0]
    if n_b == 0:
        raise ValueError("kv_act_seqs: expected at least one batch, got shape (0,)")
    if (ks < 0).any():
        i = int(np.argmax(ks < 0))
        raise ValueError(f"kv_act_seqs[{i}]: expected a length >= 0, got {int(ks[i])}")
    if qn.shape[0] % (n_b * nq):
        raise ValueError(
            f"query_nope: expected rows = B*s1*nq with B = len(kv_act_seqs) = {n_b} and nq = "
            f"{nq}, got {qn.shape[0]} rows"
        )
    s1 = qn.shape[0] // (n_b * nq)
    if s1 == 0:
        raise ValueError("query_nope: expected at least one query token, got 0 rows")
    if ti.shape != (n_b * s1, n_kv * topk):
        raise ValueError(
            f"topk_indices: expected shape [T, n_kv*topk] = {(n_b * s1, n_kv * topk)}, "
            f"got {tuple(ti.shape)}"
        )
    if bt.shape[0] != n_b:
        raise ValueError(
            f"block_table: expected {n_b} rows (one per batch), got shape {tuple(bt.shape)}"
        )
    return qn, qr, ti, bt, ks, nq, topk, block_size, np.float32(scale), s1


# ----------------------------------------------------------------------------- the loop nest


def progress_bar(total: int, progress, desc: str, unit: str = "token"):
    """A tqdm bar (``progress``: True now, None after ``PROGRESS_DELAY_S``, False never), or
    ``None`` when disabled or tqdm is missing (it is optional)."""
    if progress is False or total == 0:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is optional
        return None
    delay = 0.0 if progress else PROGRESS_DELAY_S
    return tqdm(total=total, desc=desc, unit=unit, delay=delay, leave=False)


def token_keys(cache, rows: np.ndarray) -> np.ndarray:
    """V0 for all kept entries of one query token: gather + dequantize physical ``rows`` ->
    float64 ``[n, 576]`` copy of ``[kn | kr]`` (BF16 values, widened exactly). The entries of
    one KV tile are a contiguous run of rows, so a tile's ``K`` and ``V`` are views of it."""
    kn, kr = cache.keys(rows)
    k64 = np.empty((rows.size, HEAD_DIM))
    k64[:, :NOPE] = kn
    k64[:, NOPE:] = kr
    return k64


def _run(
    op: str,
    qn: np.ndarray,
    qr: np.ndarray,
    cache,
    ti: np.ndarray,
    bt: np.ndarray,
    ks: np.ndarray,
    *,
    nq: int,
    topk: int,
    block_size: int,
    scale: np.float32,
    s1: int,
    cfg: SaTileShapeConfig,
    trace: Callable[[dict], None] | None,
    progress,
) -> np.ndarray:
    n_b = ks.shape[0]
    n_kv = 1
    group = nq // n_kv
    g_tile = cfg.g_tile
    g_loops = -(-group // g_tile)
    s_kv = cfg.s_kv_tile
    merge_cls = OnlineMerge if cfg.softmax == "online" else PerTileMerge
    phys, cur_seq = plan_physical_rows(
        ti, bt, ks, s1=s1, topk=topk, block_size=block_size, cache_rows=cache.rows
    )
    out = np.zeros((qn.shape[0], NOPE), dtype=BF16)

    def token(r: int) -> list[dict]:
        """L2..L4 of query token ``r = b*s1 + s``: writes its ``nq`` output rows and returns its
        trace records (empty without ``trace``). Reads shared inputs only."""
        b, s = divmod(r, s1)
        records: list[dict] = []
        cur = int(cur_seq[r])
        n_tiles = -(-cur // s_kv)
        used = phys[r, :cur]
        kept = used != NO_ROW
        valid = [int(np.count_nonzero(kept[t * s_kv : (t + 1) * s_kv])) for t in range(n_tiles)]
        start = list(accumulate(valid, initial=0))  # tile t = rows start[t]:start[t+1] of k64
        live = [t for t in range(n_tiles) if valid[t]]
        if live:
            k64 = token_keys(cache, used[kept])  # V0 of every tile (exact, so done once)
            q_tok = np.concatenate([qn[r * nq : (r + 1) * nq], qr[r * nq : (r + 1) * nq]], axis=1)
            q_tok = q_tok.astype(np.float64)
        for kv in range(n_kv):  # L2
            for g in range(g_loops):  # L3
                h0 = kv * group + g * g_tile
                h1 = min(h0 + g_tile, (kv + 1) * group)
                rows = slice(r * nq + h0, r * nq + h1)
                merge = merge_cls()
                for t in range(n_tiles):  # L4: KV tiles
                    info = None
                    if trace is not None:
                        info = {
                            "op": op,
                            "b": b,
                            "s": s,
                            "kv_head": kv,
                            "g": g,
                            "heads": (h0, h1),
                            "tile": t,
                            "n_tiles": n_tiles,
                            "cols": (t * s_kv, min((t + 1) * s_kv, cur)),
                            "valid": valid[t],
                            "softmax": cfg.softmax,
                            "s_kv_tile": s_kv,
                        }
                    if not valid[t]:
                        if info is not None:
                            records.append({**info, "branch": "skip", "flop": 0})
                        continue
                    first, last = t == live[0], t == live[-1]
                    k_t = k64[start[t] : start[t + 1]]  # K = [kn | kr] of the tile's entries
                    v64 = k_t[:, :NOPE]  # V = the dequantized nope
                    sc = tile_scores(q_tok[h0:h1], k_t, scale)  # C1
                    m, p, l = tile_softmax(sc)  # V1
                    if cfg.softmax == "online":
                        o_t = matmul_fp32(to_bf16(p), v64)  # C2
                    else:
                        o_t = to_bf16(matmul_fp32(to_bf16(p / l), v64))
                    res = merge.step(o_t, l, m, last=last)  # V2
                    if res is not None:
                        out[rows] = res
                    if info is not None:
                        branch = (
                            "first_last"
                            if first and last
                            else "first"
                            if first
                            else "last"
                            if last
                            else "middle"
                        )
                        records.append(
                            {
                                **info,
                                "branch": branch,
                                "flop": 2 * (h1 - h0) * valid[t] * (HEAD_DIM + NOPE),
                                "row_max": m[:, 0].copy(),
                                "row_sum": l[:, 0].copy(),
                            }
                        )
        return records

    # L0 (batch) x L1 (query token) change no numbers: tokens run on a thread pool (NumPy drops
    # the GIL in matmuls and ufuncs), each token in one thread, writing only its own rows; the
    # results are consumed in (b, s) order, so trace records keep the kernel's order.
    n_tokens = n_b * s1
    bar = progress_bar(n_tokens, progress, op)
    done = map_in_order(token, range(n_tokens))
    try:
        for records in done:
            for rec in records:
                trace(rec)
            if bar is not None:
                bar.update(1)
    finally:
        done.close()  # on an error: cancel the tokens not started, wait for the running ones
        if bar is not None:
            bar.close()
    return out


def _run_op(op: str, common: tuple, cache, cfg: SaTileShapeConfig, trace, progress) -> np.ndarray:
    """:func:`_run` on the checked arguments of :func:`_check_common` and a checked ``cache``."""
    qn, qr, ti, bt, ks, nq, topk, block_size, scale, s1 = common
    with blas_threads():  # numbers do not depend on it, speed on a busy machine does
        return _run(
            op,
            qn,
            qr,
            cache,
            ti,
            bt,
            ks,
            nq=nq,
            topk=topk,
            block_size=block_size,
            scale=scale,
            s1=s1,
            cfg=cfg,
            trace=trace,
            progress=progress,
        )


def _wrap_output(out: np.ndarray, like):
    from tilesim.reference.interop import is_torch_tensor, to_torch

    return to_torch(out) if is_torch_tensor(like) else out


def sparse_attention_antiquant(
    query_nope,
    query_rope,
    nope_cache,
    topk_indices,
    block_table,
    kv_act_seqs,
    *,
    nq: int = 128,
    n_kv: int = 1,
    softmax_scale: float,
    topk: int = 2048,
    block_size: int = 128,
    tile_config: SaTileShapeConfig | None = None,
    layout: str = "pypto",
    trace: Callable[[dict], None] | None = None,
    progress: bool | None = None,
):
    """Sparse MLA attention over a packed quantized latent cache -> BF16 ``[T*nq, 512]``.

    Args:
        query_nope: BF16 ``[T*nq, 512]``; query_rope: BF16 ``[T*nq, 64]`` (``T = B*s1``).
        nope_cache: FP8 E4M3 or INT8 ``[rows, 656]`` packed in ``layout`` (``"pypto"``: nope |
            rope | scales; ``"flashmla"``: nope | scales | rope).
        topk_indices: int ``[T, n_kv*topk]`` logical positions; ``-1`` = skipped.
        block_table: int ``[B, max_blocks]``; kv_act_seqs: int ``[B]``.
        nq, n_kv, softmax_scale, topk, block_size: as in the kernel (``n_kv`` must be 1).
        tile_config: :class:`~tilesim.shared.tiling.SaTileShapeConfig`; ``None`` reads
            ``SaTileShapeConfig.from_env()`` at call time (decode preset by default).
        trace: called once per (token, group tile, KV tile) with a dict (keys ``op``, ``b``,
            ``s``, ``g``, ``tile``, ``branch``, ``valid``, ``flop``, and for computed tiles
            ``row_max`` / ``row_sum``: the tile's FP32 ``m`` and ``l`` per head, ...), in loop
            order and from the calling thread whatever ``TILESIM_REF_THREADS`` is.
        progress: ``True`` always shows a tqdm bar, ``False`` never, ``None`` after 3 s.

    Returns:
        BF16 ``[T*nq, 512]`` (a NumPy array, or a CPU torch tensor when ``query_nope`` is one).
        Inputs are never modified. See the module docstring for the arithmetic.
    """
    common = _check_common(
        query_nope,
        query_rope,
        topk_indices,
        block_table,
        kv_act_seqs,
        nq=nq,
        n_kv=n_kv,
        topk=topk,
        block_size=block_size,
        softmax_scale=softmax_scale,
    )
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    nc = _to_numpy(nope_cache, "nope_cache")
    if nc.dtype not in _QUANT_DTYPES:
        raise TypeError(f"nope_cache: expected float8_e4m3fn or int8, got dtype {nc.dtype}")
    if nc.ndim != 2 or nc.shape[1] != PYPTO_ROW_BYTES:
        raise ValueError(
            f"nope_cache: expected shape [rows, {PYPTO_ROW_BYTES}], got {tuple(nc.shape)}"
        )
    out = _run_op(
        "sparse_attention_antiquant",
        common,
        PackedCache(nc, layout),
        _resolve_tile_config(tile_config),
        trace,
        progress,
    )
    return _wrap_output(out, query_nope)


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
    nq: int = 128,
    n_kv: int = 1,
    softmax_scale: float,
    topk: int = 2048,
    block_size: int = 128,
    tile_config: SaTileShapeConfig | None = None,
    trace: Callable[[dict], None] | None = None,
    progress: bool | None = None,
):
    """:func:`sparse_attention_antiquant` over the kv_split cache: ``kn_quant [rows, 512]`` FP8
    E4M3 or INT8, ``kr [rows, 64]`` BF16, ``kn_scales [rows, 4]`` FP32. Same arithmetic, same
    bits as the packed op on the same data."""
    common = _check_common(
        query_nope,
        query_rope,
        topk_indices,
        block_table,
        kv_act_seqs,
        nq=nq,
        n_kv=n_kv,
        topk=topk,
        block_size=block_size,
        softmax_scale=softmax_scale,
    )
    kq, kra, ksc = check_cache_fields(
        _to_numpy(kn_quant, "kn_quant"),
        _to_numpy(kr, "kr"),
        _to_numpy(kn_scales, "kn_scales"),
        names=("kn_quant", "kr", "kn_scales"),
    )
    out = _run_op(
        "sparse_attention_antiquant_kv_split",
        common,
        SplitCache(kq, kra, ksc),
        _resolve_tile_config(tile_config),
        trace,
        progress,
    )
    return _wrap_output(out, query_nope)


def sparse_attention_cost(
    topk_indices, kv_act_seqs, *, nq: int = 128, topk: int = 2048, s1: int | None = None
) -> dict:
    """FLOP and byte counts of one call (FlashMLA's accounting, ``anchors`` §1.1).

    ``flop = 2 * nq * attended * (576 + 512)`` summed over query tokens, where ``attended`` is the
    number of used entries that are not ``-1``; ``bytes`` = Q (BF16 576 per head) + gathered
    cache rows x 656 + O (BF16 512 per head). ``unique_kv_bytes`` counts each (batch, position)
    once, the lower bound if tokens of one batch shared their gathers.
    """
    ti = np.asarray(topk_indices)
    ks = np.asarray(kv_act_seqs, dtype=np.int64)
    n_t = ti.shape[0]
    if s1 is None:
        s1 = n_t // ks.shape[0]
    from tilesim.reference.dsa_gather import cur_seq_lengths

    cur = cur_seq_lengths(ks, s1, topk)
    used = np.arange(topk)[None, :] < cur[:, None]
    live = used & (ti[:, :topk] != -1)
    attended = int(live.sum())
    unique = 0
    for b in range(ks.shape[0]):
        sel = ti[b * s1 : (b + 1) * s1, :topk][live[b * s1 : (b + 1) * s1]]
        unique += int(np.unique(sel).size)
    q_bytes = n_t * nq * HEAD_DIM * 2
    o_bytes = n_t * nq * NOPE * 2
    return {
        "flop": 2 * nq * attended * (HEAD_DIM + NOPE),
        "attended": attended,
        "bytes": q_bytes + attended * PYPTO_ROW_BYTES + o_bytes,
        "unique_kv_bytes": q_bytes + unique * PYPTO_ROW_BYTES + o_bytes,
    }


__all__ = [
    "OnlineMerge",
    "PerTileMerge",
    "exp_fp32",
    "sparse_attention_antiquant",
    "sparse_attention_antiquant_kv_split",
    "sparse_attention_cost",
    "tile_scores",
    "tile_softmax",
]
