"""The contract of DeepSeek-V3.2 sparse attention (op ``dsa``), shared by the golden and the
kernel wrapper: :class:`Args`, :func:`check_meta`, :func:`check_values`, :func:`host_plan`,
:func:`cost`. Everything here runs on host data and rounds nothing:

* :func:`check_meta` — shapes, dtypes and static sizes of ``sparse_attention_antiquant`` /
  ``..._kv_split`` (queries, the packed or kv_split cache, ``topk_indices``, ``block_table``,
  ``kv_act_seqs``), reading no value; returns :class:`Args`. :func:`check_values` — the
  checks that read the integer inputs (``kv_act_seqs`` bounds, every used top-k entry). Both
  twins call both, so they accept and reject the same arguments with the same messages;
  :func:`resolve_tiling` is the one rule for ``tiling=None``.
* :func:`host_plan` — :func:`plan_physical_rows`, :func:`stand_in_positions` and the split.
* :func:`cost` — the one FLOP / byte counter (the golden's and the kernel's accounting).
* :func:`cur_seq_lengths` — how many top-k entries each query token uses.
* :func:`plan_physical_rows` — check every used top-k entry and translate it to a physical
  cache row, ``block_table[b, p // block_size] * block_size + p % block_size``.
* :func:`stand_in_positions` — for the kernel's masked build: a readable position per batch
  that a skipped (``-1``) entry may gather instead (its score is masked out).
* :func:`attention_flop` — the matmul FLOPs of one group tile over some keys (C1 + C2).

Entry policy (``docs/ops/dsa.md``): query token ``s`` of batch ``b`` uses
the first ``cur_seq = min(max(act - s1 + 1 + s, 0), topk)`` entries of its row. Among them
``-1`` means "no key" and is skipped; any other negative value, a position ``>= act``, a
logical block outside ``block_table``, a negative block-table entry that is needed, or a
physical row outside the cache raises a ``ValueError`` that names the entry. Entries past
``cur_seq`` are never read, so they are not checked.

Split-KV (flash-decoding) for DeepSeek sparse attention: which KV tiles form which split.

A query token's ``cur_seq`` used top-k entries are cut into KV tiles of ``s_kv_tile`` columns
(``ceil(cur_seq / s_kv_tile)`` of them). With ``tiling.kv_splits = k`` the tiles are grouped
into ranges of ``tiles_per_split(topk, s_kv_tile, k)`` consecutive tiles: split ``j`` holds
tiles ``j*tps .. (j+1)*tps - 1`` of the token (those that exist). Each split folds its tiles
into its own softmax state (FP32 ``O``, ``L``, ``M``, unnormalised), independently of the other
splits; a combine stage then folds the splits' states in split order ``0, 1, ..`` with the
same online-merge formulas and writes ``BF16(O / L)``. The split layout depends on ``topk``
only (not on the token), so a short token simply has fewer (or one) non-empty splits.

``kv_splits = 1`` is the unsplit loop (one range = every tile; no combine). Both the golden
(``tilesim.reference.dsa``) and the kernel (``tilesim.device.dsa``) take the
split from the tile config they are given; :func:`default_kv_splits` is the rule that picks
it for a call shape and SoC, and :func:`split_tiling` applies it to a tile config. The rule is
applied only where asked for (a tile config is never changed behind the caller's back, so the
golden and the kernel always see the same split). ``docs/ops/dsa.md``
("Split-KV").
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from tilesim.shared import splitkv
from tilesim.shared.casts import BF16, FP8_E4M3
from tilesim.shared.mla_cache import LAYOUTS, NOPE, NSCALES, PYPTO_ROW_BYTES, ROPE
from tilesim.shared.tiling import SaTileShapeConfig
from tilesim.shared.validate import (
    INT32_MAX,
    check_array,
    check_bool,
    check_choice,
    check_float,
    check_instance,
    check_int,
    check_int_array,
    check_pos_int,
    check_range,
    check_trace,
    dtype_of,
    host_ints,
    require_values,
    shape_of,
)

HEAD_DIM = NOPE + ROPE  # 576
#: marks an entry that contributes no key (a ``-1`` index, or a column past ``cur_seq``)
NO_ROW = -1
#: storage dtypes of the quantized latent, and their kernel names
QUANT_NAMES = {FP8_E4M3: "fp8", np.dtype(np.int8): "int8"}
#: rows of ``topk_indices`` checked per step (bounds the int64 temporaries)
_PLAN_CHUNK = 1024


class Args(NamedTuple):
    """The checked arguments of one sparse-attention call (:func:`check_meta`).

    ``query_nope`` / ``query_rope`` and ``caches`` are the caller's arrays or tensors (metadata
    checked, data not read). ``topk_indices``, ``block_table`` and ``kv_act_seqs`` are the
    caller's objects after :func:`check_meta` and host int64 copies after
    :func:`check_values` (``values`` tells which). ``caches``: ``(nope_cache,)`` for a packed
    ``layout`` (``"pypto"`` / ``"flashmla"``), ``(kn_quant, kr, kn_scales)`` for
    ``"kv_split"``; ``quant`` ``"fp8"`` or ``"int8"``; ``cache_rows`` its row count."""

    query_nope: object
    query_rope: object
    topk_indices: object
    block_table: object
    kv_act_seqs: object
    nq: int
    topk: int
    block_size: int
    softmax_scale: np.float32
    s1: int
    n_b: int
    rows: int
    tiling: SaTileShapeConfig
    caches: tuple = ()
    layout: str = "pypto"
    quant: str = "int8"
    cache_rows: int = 0
    values: bool = False


class HostPlan(NamedTuple):
    """The host rules of one checked call (:func:`host_plan`): ``phys`` int32 ``[T, topk]``
    physical rows (``NO_ROW`` for skipped ``-1`` entries and columns past ``cur_seq``),
    ``cur_seq`` int64 ``[T]``, ``skipped`` bool ``[T, topk]`` (used ``-1`` entries),
    ``stand_in`` int64 ``[B]`` positions for them (``None`` when there is none; see
    :func:`stand_in_positions`), ``tiles_per_split`` (all of a token's tiles when
    ``kv_splits = 1``)."""

    phys: np.ndarray
    cur_seq: np.ndarray
    skipped: np.ndarray
    stand_in: np.ndarray | None
    tiles_per_split: int


# ----------------------------------------------------------------------------- checks
def tiling_argument(tiling):
    """The ``tiling`` argument of a call: a ``SaTileShapeConfig`` or ``None`` (``TypeError``
    naming ``tiling`` otherwise)."""
    return check_instance(tiling, "tiling", SaTileShapeConfig, optional=True)


def resolve_tiling(tiling) -> SaTileShapeConfig:
    """The tile config of a call (:func:`tiling_argument`); ``None`` reads
    ``SaTileShapeConfig.from_env()`` now (the one rule, for the golden and the kernel)."""
    tiling = tiling_argument(tiling)
    return SaTileShapeConfig.from_env() if tiling is None else tiling


def _check_queries(query_nope, query_rope) -> int:
    check_array(query_nope, "query_nope", dtype=BF16, ndim=2, layout="[T*nq, 512]")
    rows = shape_of(query_nope, "query_nope")[0]
    check_array(query_rope, "query_rope", dtype=BF16)
    check_array(query_nope, "query_nope", shape=(rows, NOPE), layout="[T*nq, 512]")
    check_array(query_rope, "query_rope", shape=(rows, ROPE), layout="[T*nq, 64]")
    return rows


def _check_scalars(nq, n_kv, softmax_scale, topk, block_size, tiling, trace, progress):
    """``(nq, topk, block_size, scale, tiling)`` checked (no array involved)."""
    nq = check_pos_int(nq, "nq")
    if check_pos_int(n_kv, "n_kv") != 1:
        raise ValueError(
            f"n_kv: expected 1 (the latent cache holds one KV head per row, as in DeepSeek-V3.2 "
            f"MQA; the seeds' kernels only index correctly for n_kv = 1), got {n_kv}"
        )
    topk = check_pos_int(topk, "topk")
    block_size = check_int(block_size, "block_size", lo=1, hi=INT32_MAX)
    scale = np.float32(check_float(softmax_scale, "softmax_scale", positive=True, fp32=True))
    cfg = resolve_tiling(tiling)
    if cfg.kv_splits > 1 and cfg.softmax != "online":
        raise ValueError(
            f"tiling.kv_splits: expected 1 with softmax 'per_tile' (split-KV combines "
            f"unnormalised online states), got {cfg.kv_splits}"
        )
    check_trace(trace)
    if progress is not None:
        check_bool(progress, "progress")
    return nq, topk, block_size, scale, cfg


def _check_int_shapes(rows, topk_indices, block_table, kv_act_seqs, *, nq, topk):
    """``(n_b, s1)`` from the integer inputs' shapes (metadata only)."""
    n_b = check_int_array(kv_act_seqs, "kv_act_seqs", ndim=1, layout="[B]")[0]
    if n_b == 0:
        raise ValueError("kv_act_seqs: expected at least one batch, got shape (0,)")
    if rows == 0 or rows % (n_b * nq):
        raise ValueError(
            f"query_nope: expected rows = B*s1*nq > 0 with B = len(kv_act_seqs) = {n_b} and "
            f"nq = {nq}, got {rows} rows"
        )
    s1 = rows // (n_b * nq)
    check_int_array(topk_indices, "topk_indices", shape=(n_b * s1, topk), layout="[T, n_kv*topk]")
    bt = check_int_array(block_table, "block_table", ndim=2, layout="[B, max_blocks]")
    if bt[0] != n_b:
        raise ValueError(
            f"block_table: expected shape ({n_b}, *) (B = len(kv_act_seqs) = {n_b}; "
            f"kv_act_seqs and block_table hold one entry / row per batch), got {bt}"
        )
    return n_b, s1


def check_meta(
    query_nope,
    query_rope,
    caches: tuple,
    topk_indices,
    block_table,
    kv_act_seqs,
    *,
    layout: str,
    nq,
    n_kv,
    softmax_scale,
    topk,
    block_size,
    tiling=None,
    trace=None,
    progress=None,
) -> Args:
    """Shapes, dtypes and static sizes of one call, before any work; reads no value (so it
    runs as it is on FakeTensor / ``meta`` tensors and for ``validate=False``).

    ``caches``: ``(nope_cache,)`` with ``layout`` ``"pypto"`` / ``"flashmla"``, or
    ``(kn_quant, kr, kn_scales)`` with ``layout="kv_split"``. Raises ``ValueError`` /
    ``TypeError`` naming the argument. Returns :class:`Args` (``values=False``)."""
    nq, topk, block_size, scale, cfg = _check_scalars(
        nq, n_kv, softmax_scale, topk, block_size, tiling, trace, progress
    )
    rows = _check_queries(query_nope, query_rope)
    n_b, s1 = _check_int_shapes(rows, topk_indices, block_table, kv_act_seqs, nq=nq, topk=topk)
    if layout == "kv_split":
        cache_rows, quant = check_split_cache(*caches)
    else:
        cache_rows, quant = check_packed_cache(caches[0], layout)
    return Args(
        query_nope, query_rope, topk_indices, block_table, kv_act_seqs, nq, topk, block_size,
        scale, s1, n_b, rows, cfg, tuple(caches), layout, quant, cache_rows, False,
    )  # fmt: skip


# the inputs of the two ops, written once for the golden and the wrapper (op_signature)
def packed_inputs(query_nope, query_rope, nope_cache, topk_indices, block_table, kv_act_seqs):
    """The arrays of ``sparse_attention_antiquant`` (golden and kernel), in order: BF16
    ``query_nope [T*nq, 512]`` and ``query_rope [T*nq, 64]``; the packed FP8 E4M3 / INT8
    ``nope_cache [rows, 656]``; int ``topk_indices [T, n_kv*topk]`` (``-1`` = skipped),
    ``block_table [B, max_blocks]``, ``kv_act_seqs [B]``."""


def kv_split_inputs(
    query_nope, query_rope, kn_quant, kr, kn_scales, topk_indices, block_table, kv_act_seqs
):
    """The arrays of ``sparse_attention_antiquant_kv_split``: as :func:`packed_inputs` with
    the kv_split cache ``kn_quant [rows, 512]`` FP8 E4M3 / INT8, ``kr [rows, 64]`` BF16,
    ``kn_scales [rows, 4]`` FP32 in place of ``nope_cache``."""


def model_keywords(
    *,
    nq: int = 128,
    n_kv: int = 1,
    softmax_scale: float,
    topk: int = 2048,
    block_size: int = 128,
    tiling: SaTileShapeConfig | None = None,
):
    """The sizes both ops take after their arrays (DeepSeek-V3.2's by default): query heads
    ``nq``, KV heads ``n_kv`` (must be 1), ``softmax_scale``, ``topk`` entries per token, the
    cache's ``block_size``, and the tile config (``None``: :func:`resolve_tiling`)."""


def check_inputs(ins, layout: str, *, trace=None, progress=None) -> Args:
    """:func:`check_meta` on the inputs of a call (the namespace of
    :func:`tilesim.shared.validate.op_signature` over :func:`packed_inputs` or
    :func:`kv_split_inputs` and :func:`model_keywords`); ``layout="kv_split"`` reads the
    kv_split cache, any other the packed one."""
    if layout == "kv_split":
        caches = (ins.kn_quant, ins.kr, ins.kn_scales)
    else:
        caches = (ins.nope_cache,)
    return check_meta(
        ins.query_nope, ins.query_rope, caches, ins.topk_indices, ins.block_table,
        ins.kv_act_seqs, layout=layout, nq=ins.nq, n_kv=ins.n_kv,
        softmax_scale=ins.softmax_scale, topk=ins.topk, block_size=ins.block_size,
        tiling=ins.tiling, trace=trace, progress=progress,
    )  # fmt: skip


def check_values(args: Args) -> Args:
    """The checks that read the integer inputs (host int64 copies, returned in the
    :class:`Args`, ``values=True``): ``kv_act_seqs`` in ``[0, max_blocks * block_size]``
    and every used top-k entry (:func:`plan_physical_rows`: ``-1`` or a position inside the
    sequence, an allocated block, a row inside the cache). ``ValueError`` naming the entry."""
    acts = host_ints(args.kv_act_seqs, "kv_act_seqs", ndim=1, layout="[B]")
    check_range(acts, "kv_act_seqs", lo=0)
    ti = host_ints(args.topk_indices, "topk_indices", ndim=2, layout="[T, n_kv*topk]")
    bt = host_ints(args.block_table, "block_table", ndim=2, layout="[B, max_blocks]")
    _check_capacity(acts, bt.shape[1], args.block_size, args.cache_rows)
    checked = args._replace(topk_indices=ti, block_table=bt, kv_act_seqs=acts, values=True)
    _physical_rows(checked)
    return checked


def _check_capacity(acts: np.ndarray, max_blocks: int, block_size: int, cache_rows: int) -> None:
    """Every ``kv_act_seqs[b] <= max_blocks * block_size``: a length past the block table's
    capacity would address keys no block holds (and wrap in the kernel's INT32 arithmetic).
    The ``ValueError`` names where the bound comes from (the table's width and
    ``block_size``) and the cache's row count, since a ``block_size`` that does not match the
    cache's layout is the usual cause."""
    cap = max_blocks * block_size
    bad = np.flatnonzero(acts > cap)
    if bad.size:
        b = int(bad[0])
        fit = "" if cache_rows % block_size == 0 else ", not a multiple of block_size"
        raise ValueError(
            f"kv_act_seqs[{b}]: expected a value in [0, {cap}] (block_table width {max_blocks} "
            f"blocks * block_size {block_size}; the cache holds {cache_rows} rows{fit}: check "
            f"block_size against the cache's block layout), got {int(acts[b])}"
        )


def _physical_rows(a: Args) -> tuple[np.ndarray, np.ndarray]:
    return plan_physical_rows(
        a.topk_indices, a.block_table, a.kv_act_seqs,
        s1=a.s1, topk=a.topk, block_size=a.block_size, cache_rows=a.cache_rows,
    )  # fmt: skip


def host_plan(args: Args) -> HostPlan:
    """The host rules of a checked call (:func:`check_values` first): the physical rows
    (:func:`plan_physical_rows`), the used ``-1`` entries and their stand-in positions
    (:func:`stand_in_positions`, only when there is one), and the split
    (:func:`tiles_per_split` of ``args.tiling``). NumPy; the device path's torch twin for
    ``validate=False`` is :func:`kernel_indices_torch`."""
    require_values(args, Args, "host_plan")
    phys, cur = _physical_rows(args)
    skipped = (np.arange(args.topk)[None, :] < cur[:, None]) & (phys == NO_ROW)
    stand_in = None
    if skipped.any():
        stand_in = stand_in_positions(
            skipped, args.block_table,
            s1=args.s1, block_size=args.block_size, cache_rows=args.cache_rows,
        )  # fmt: skip
    cfg = args.tiling
    tps = tiles_per_split(args.topk, cfg.s_kv_tile, cfg.kv_splits)
    return HostPlan(phys, cur, skipped, stand_in, tps)


def kernel_indices(a: Args, plan: HostPlan | None = None) -> tuple[np.ndarray, int | None]:
    """``(indices, mask_col0)``: the INT32 index tensor the kernel reads, from the host plan
    (:func:`host_plan` of ``a``, the :func:`check_values` arguments, unless ``plan`` is
    given). The columns are zero-padded to whole KV tiles so that the last tile's
    ``[1, s_kv_tile]`` view stays inside the tensor (only ``cur_seq`` columns are read; the
    entries past ``cur_seq`` are written 0, whatever the caller left there). When some used
    entry is ``-1`` (the masked build), it is replaced by a stand-in position of its batch
    (:func:`stand_in_positions`) and as many columns again follow, 1 at every skipped entry,
    0 elsewhere (one tensor, not two: PyPTO 0.2.0's cost-model machine crashes with ten
    kernel arguments); ``mask_col0`` is where they start, else ``None``."""
    plan = host_plan(a) if plan is None else plan
    st = a.tiling.s_kv_tile
    cols = -(-a.topk // st) * st
    skipped, filler = plan.skipped, plan.stand_in
    n = a.topk_indices.shape[0]
    used = np.arange(a.topk)[None, :] < plan.cur_seq[:, None]
    entries = np.where(used, a.topk_indices[:, : a.topk], 0)  # past cur_seq: never read, 0
    if filler is None:
        idx = np.zeros((n, cols), dtype=np.int32)
        idx[:, : a.topk] = entries
        return idx, None
    idx = np.zeros((n, 2 * cols), dtype=np.int32)
    idx[:, : a.topk] = entries
    rows, c = np.nonzero(skipped)
    idx[rows, c] = filler[rows // a.s1]
    idx[rows, cols + c] = 1
    return idx, cols


def kernel_indices_torch(ti, bt, acts, *, s1: int, topk: int, block_size: int, s_kv_tile: int,
                         cache_rows: int):  # fmt: skip
    """The torch twin of :func:`kernel_indices`: its masked form built where the tensors live
    (torch ops on the inputs' device, no host copy; the ``validate=False`` path), with no
    value check: INT32 ``[T, 2*cols]``, the entries (0 past ``cur_seq``, a used ``-1``
    replaced by its batch's stand-in position, the first one whose block is allocated and
    inside the cache: :func:`stand_in_positions`), then the 0/1 skip columns from ``cols``.
    Always the masked layout: whether a ``-1`` is used is not known without reading the data.
    A batch with a used ``-1`` and no allocated block gets position 0 (undefined, as every
    unchecked bad entry is). Tested equal to :func:`kernel_indices`."""
    import torch  # lazily: importing this module needs no torch

    dev = ti.device
    cols = -(-topk // s_kv_tile) * s_kv_tile
    s = torch.arange(s1, device=dev, dtype=torch.int64)
    cur = (acts.to(torch.int64)[:, None] - s1 + 1 + s[None, :]).clamp(0, topk).reshape(-1)
    used = torch.arange(topk, device=dev)[None, :] < cur[:, None]
    t = ti[:, :topk].to(torch.int64)
    skipped = used & (t == -1)
    table = bt.to(torch.int64)
    ok = (table >= 0) & ((table + 1) * block_size <= cache_rows)
    filler = (ok.to(torch.int32).argmax(dim=1) * block_size).repeat_interleave(s1)
    entries = torch.where(skipped, filler[:, None], torch.where(used, t, 0))
    idx = torch.zeros((t.shape[0], 2 * cols), dtype=torch.int32, device=dev)
    idx[:, :topk] = entries.to(torch.int32)
    idx[:, cols : cols + topk] = skipped.to(torch.int32)
    return idx, cols


def check_packed_cache(nope_cache, layout) -> tuple[int, str]:
    """``(rows, quant)`` of a packed ``[rows, 656]`` FP8 E4M3 / INT8 cache in ``layout``."""
    check_choice(layout, "layout", LAYOUTS)
    check_array(nope_cache, "nope_cache", dtype=tuple(QUANT_NAMES), ndim=2, layout="[rows, 656]")
    shp = check_array(
        nope_cache, "nope_cache", shape=(None, PYPTO_ROW_BYTES), layout="[rows, 656]"
    ).shape
    return int(shp[0]), QUANT_NAMES[dtype_of(nope_cache, "nope_cache")]


def check_split_cache(kn_quant, kr, kn_scales) -> tuple[int, str]:
    """``(rows, quant)`` of the kv_split triple ``kn_quant [rows, 512]`` FP8 E4M3 / INT8,
    ``kr [rows, 64]`` BF16, ``kn_scales [rows, 4]`` FP32."""
    check_array(kn_quant, "kn_quant", dtype=tuple(QUANT_NAMES), ndim=2, layout="[rows, 512]")
    rows = shape_of(kn_quant, "kn_quant")[0]
    check_array(kn_quant, "kn_quant", shape=(rows, NOPE), layout="[rows, 512]")
    check_array(kr, "kr", dtype=BF16, shape=(rows, ROPE), layout="[rows, 64]")
    check_array(kn_scales, "kn_scales", dtype=np.float32, shape=(rows, NSCALES), layout="[rows, 4]")
    return rows, QUANT_NAMES[dtype_of(kn_quant, "kn_quant")]


# ----------------------------------------------------------------------------- planning
def cur_seq_lengths(kv_act_seqs: np.ndarray, s1: int, topk: int) -> np.ndarray:
    """``cur_seq`` of every query token, int64 ``[B * s1]`` (row ``b * s1 + s``).

    ``cur_seq = min(max(act_b - s1 + 1 + s, 0), topk)``: token ``s`` of a multi-token decode
    sees keys up to its own position, capped at ``topk``.
    """
    acts = np.asarray(kv_act_seqs, dtype=np.int64)
    s = np.arange(s1, dtype=np.int64)
    cur = np.clip(acts[:, None] - s1 + 1 + s[None, :], 0, topk)
    return cur.reshape(-1)


def attention_flop(heads: int, keys: int) -> int:
    """Matmul FLOPs of ``heads`` query heads over ``keys`` keys: ``2 * heads * keys * (576 +
    512)`` (C1 ``Q K^T`` over 576 columns, C2 ``P V`` over 512; 2 per multiply-add)."""
    return 2 * int(heads) * int(keys) * (HEAD_DIM + NOPE)


def cost(args: Args) -> dict:
    """The one FLOP / byte counter of the op (reads ``topk_indices`` and ``kv_act_seqs``).

    FlashMLA's accounting (``docs/sources.md``), with ``attended`` = the used entries that are
    not ``-1``: ``flop = attention_flop(nq, attended)`` (the sum of the golden's trace
    records' ``flop``), ``bytes`` = Q (BF16 576 per head) + ``attended`` gathered rows x 656 +
    O (BF16 512 per head); ``unique_kv_bytes`` counts each (batch, position) once. The
    kernel's traffic (``g_tile = args.tiling.g_tile``, ``nq / g_tile`` group tiles, each
    gathering all ``keys`` = ``sum(cur_seq)`` used entries, masked ``-1`` ones included):
    ``kernel_flop = (nq / g_tile) * attention_flop(g_tile, keys)`` and ``kernel_bytes`` = Q
    + O + ``(nq / g_tile) * keys`` x (656 + 4: the row and its INT32 index)."""
    ti = host_ints(args.topk_indices, "topk_indices", ndim=2)
    acts = host_ints(args.kv_act_seqs, "kv_act_seqs", ndim=1)
    n_t, nq, topk, s1 = ti.shape[0], args.nq, args.topk, args.s1
    cur = cur_seq_lengths(acts, s1, topk)
    live = (np.arange(topk)[None, :] < cur[:, None]) & (ti[:, :topk] != -1)
    attended, keys = int(live.sum()), int(cur.sum())
    unique = 0
    for b in range(acts.shape[0]):
        rows = slice(b * s1, (b + 1) * s1)
        unique += int(np.unique(ti[rows, :topk][live[rows]]).size)
    qo_bytes = n_t * nq * (HEAD_DIM + NOPE) * 2
    g_tile = args.tiling.g_tile
    g_loops = nq // g_tile
    return {
        "flop": attention_flop(nq, attended),
        "bytes": qo_bytes + attended * PYPTO_ROW_BYTES,
        "attended": attended,
        "unique_kv_bytes": qo_bytes + unique * PYPTO_ROW_BYTES,
        "keys": keys,
        "kernel_flop": g_loops * attention_flop(g_tile, keys),
        "kernel_bytes": g_loops
        * (n_t * g_tile * (HEAD_DIM + NOPE) * 2 + keys * (PYPTO_ROW_BYTES + 4)),  # fmt: skip
    }


def cost_args(topk_indices, kv_act_seqs, *, nq: int, topk: int, s1: int | None = None,
              g_tile: int | None = None) -> Args:  # fmt: skip
    """The :class:`Args` :func:`cost` reads, from the counters' old arguments (no queries or
    cache): ``s1`` defaults to ``len(topk_indices) // len(kv_act_seqs)``, ``g_tile`` to
    ``nq`` (one group tile)."""
    nq, topk = check_pos_int(nq, "nq"), check_pos_int(topk, "topk")
    ti = host_ints(topk_indices, "topk_indices", ndim=2)
    acts = host_ints(kv_act_seqs, "kv_act_seqs", ndim=1)
    s1 = ti.shape[0] // max(acts.shape[0], 1) if s1 is None else check_pos_int(s1, "s1")
    g = nq if g_tile is None else check_pos_int(g_tile, "g_tile")
    cfg = SaTileShapeConfig.decode().replace(g_tile=g)
    return Args(None, None, ti, None, acts, nq, topk, 1, np.float32(1), s1, acts.shape[0],
                ti.shape[0] * nq, cfg, values=True)  # fmt: skip


def _fail_first(mask, idx, r0, s1, acts, why: str) -> None:
    """``ValueError`` naming the first ``True`` entry of ``mask`` (a chunk of rows from r0)."""
    if not mask.any():
        return
    rr, cc = (int(v) for v in np.argwhere(mask)[0])
    row = r0 + rr
    b = row // s1
    text = why(rr, cc) if callable(why) else why
    raise ValueError(
        f"topk_indices[{row}, {cc}] = {int(idx[rr, cc])} (batch {b}, query token {row % s1}, "
        f"kv_act_seqs[{b}] = {int(acts[b])}): {text}"
    )


def _plan_chunk(idx, live, act, b_of_row, block_table, *, r0, s1, acts, block_size, cache_rows):
    """Physical rows of one chunk of ``topk_indices`` rows (checks every live entry)."""
    n_blocks = block_table.shape[1]

    def fail(mask, why):
        _fail_first(mask, idx, r0, s1, acts, why)

    fail(live & (idx < 0), "expected a position >= 0 or -1 (skipped)")
    fail(live & (idx >= act), "position is outside the sequence (expected < kv_act_seqs[b])")
    blk = np.where(live, idx // block_size, 0)
    fail(
        live & (blk >= n_blocks),
        f"logical block is outside block_table (it has {n_blocks} columns)",
    )
    entry = np.where(live, block_table[b_of_row[:, None], blk], 0)
    fail(
        live & (entry < 0),
        lambda rr, cc: (
            f"needs block_table[{(r0 + rr) // s1}, {int(blk[rr, cc])}] = {int(entry[rr, cc])} "
            "(expected a physical block >= 0)"
        ),
    )
    # a physical block at or past the cache's last one is outside it; checked before the
    # multiply below, so a huge block_table entry cannot wrap around in int64
    fail(
        live & (entry >= -(-cache_rows // block_size)),
        lambda rr, cc: (
            f"needs block_table[{(r0 + rr) // s1}, {int(blk[rr, cc])}] = {int(entry[rr, cc])} "
            f"(expected a physical block < {-(-cache_rows // block_size)}: the cache has "
            f"{cache_rows} rows)"
        ),
    )
    row = np.where(live, entry, 0) * block_size + idx % block_size
    fail(
        live & (row >= cache_rows),
        lambda rr, cc: f"physical row {int(row[rr, cc])} is outside the cache ({cache_rows} rows)",
    )
    return np.where(live, row, NO_ROW).astype(np.int32)


def plan_physical_rows(
    topk_indices: np.ndarray,
    block_table: np.ndarray,
    kv_act_seqs: np.ndarray,
    *,
    s1: int,
    topk: int,
    block_size: int,
    cache_rows: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Validate the used top-k entries and map them to physical cache rows.

    Args:
        topk_indices: integer ``[B*s1, >= topk]`` logical positions (row ``b*s1 + s``).
        block_table: integer ``[B, max_blocks]`` logical block -> physical block.
        kv_act_seqs: integer ``[B]`` sequence lengths.
        s1, topk, block_size, cache_rows: as named; ``cache_rows`` is the cache's row count.

    Returns:
        ``(phys, cur_seq)``: ``phys`` int32 ``[B*s1, topk]`` holding the physical row of every
        used entry and ``NO_ROW`` (-1) for skipped ``-1`` entries and columns past ``cur_seq``;
        ``cur_seq`` int64 ``[B*s1]``.

    Raises:
        ValueError: naming the first offending ``topk_indices[row, col]`` entry.
    """
    n_rows = topk_indices.shape[0]
    acts = np.asarray(kv_act_seqs, dtype=np.int64)
    table = np.asarray(block_table, dtype=np.int64)
    cur = cur_seq_lengths(acts, s1, topk)
    phys = np.full((n_rows, topk), NO_ROW, dtype=np.int32)
    cols = np.arange(topk, dtype=np.int64)
    for r0 in range(0, n_rows, _PLAN_CHUNK):
        r1 = min(r0 + _PLAN_CHUNK, n_rows)
        idx = np.asarray(topk_indices[r0:r1, :topk], dtype=np.int64)
        b_of_row = np.arange(r0, r1, dtype=np.int64) // s1
        live = (cols[None, :] < cur[r0:r1, None]) & (idx != -1)
        if live.any():
            phys[r0:r1] = _plan_chunk(
                idx, live, acts[b_of_row][:, None], b_of_row, table,
                r0=r0, s1=s1, acts=acts, block_size=block_size, cache_rows=cache_rows,
            )  # fmt: skip
    return phys, cur


def stand_in_positions(
    skipped: np.ndarray, block_table: np.ndarray, *, s1: int, block_size: int, cache_rows: int
) -> np.ndarray:
    """int64 ``[B]``: for each batch with a used ``-1`` entry (``skipped [B*s1, topk]`` bool),
    the first position whose block is allocated and inside the cache (0 for other batches).

    The kernel's masked build gathers that row for a skipped entry and masks its score out,
    so which row it is does not matter, only that reading it is legal."""
    n_b = block_table.shape[0]
    filler = np.zeros(n_b, dtype=np.int64)
    for b in np.unique(np.nonzero(skipped)[0] // s1):
        table = block_table[b]
        # a whole block inside the cache (no multiply: huge entries cannot wrap around)
        ok = np.nonzero((table >= 0) & (table < cache_rows // block_size))[0]
        if ok.size == 0:
            r, c = (int(v[0]) for v in np.nonzero(skipped[b * s1 :]))
            raise ValueError(
                f"topk_indices[{b * s1 + r}, {c}]: -1 entries of batch {b} need one allocated "
                f"block in block_table[{b}] to stand in for them; it has none"
            )
        filler[b] = int(ok[0]) * block_size
    return filler


def kv_tiles(topk: int, s_kv_tile: int) -> int:
    """KV tiles of a token that uses all ``topk`` entries: ``ceil(topk / s_kv_tile)``."""
    return -(-check_pos_int(topk, "topk") // check_pos_int(s_kv_tile, "s_kv_tile"))


def tiles_per_split(topk: int, s_kv_tile: int, kv_splits: int) -> int:
    """Tiles per split: ``ceil(kv_tiles(topk, s_kv_tile) / kv_splits)`` (at least 1)."""
    return splitkv.units_per_split(kv_tiles(topk, s_kv_tile), kv_splits)


#: online, unsplit: tokens of up to this many KV tiles run their tiles unrolled and fold the
#: tiles' states in ONE dependent stage after the last tile (the kernel's ``unrolled_tiles``);
#: longer tokens merge tile by tile in a loop. It is also the most splits the rule picks: the
#: kernel's combine is the same fold, measured up to 8 states.
UNROLL_TILES = 8


def merge_chain(n_tiles: int, kv_splits: int) -> int:
    """Dependent merge stages on one token's longest chain in the kernel
    (``tilesim.device._dsa_kernel``). Unsplit: 0 for one tile, 1 (the fold after the
    unrolled tiles) up to :data:`UNROLL_TILES` tiles, else ``n_tiles - 1`` loop merges. Split:
    ``tps - 1`` loop merges inside a split, then the combine, one fold stage over the splits'
    states."""
    tps = -(-n_tiles // kv_splits)
    splits = -(-n_tiles // tps)
    if splits > 1:
        return (tps - 1) + 1
    if n_tiles <= UNROLL_TILES:
        return min(n_tiles - 1, 1)
    return n_tiles - 1


#: the DeepSeek split policy: :func:`merge_chain`, at most :data:`UNROLL_TILES` splits
SPLIT_RULE = splitkv.SplitRule(chain=merge_chain, max_splits=UNROLL_TILES)


def default_kv_splits(*, tokens: int, nq: int, topk: int, tiling: SaTileShapeConfig,
                      soc: str) -> int:  # fmt: skip
    """The split count for a call: a pure function of the shape and the SoC's cube cores
    (:data:`SPLIT_RULE`, 1 for the ``per_tile`` softmax).

    ``items = tokens * (nq / g_tile)`` independent (token, group tile) work items. When they
    fill the cube cores (``items >= aic_cores``), or a token has one KV tile, or the softmax
    mode is ``per_tile`` (the split is built for the online merge), the answer is 1.
    Otherwise the smallest ``k <= min(kv_tiles, aic_cores // items, UNROLL_TILES)`` (every
    range can have a core) with the shortest dependent chain :func:`merge_chain`, in whole
    ranges. Decode preset: 2048 keys = 4 tiles and 4096 keys = 8 tiles -> 1 (the unsplit fold
    is one stage); 8192 keys (16 tiles) B 1 -> 8 (chain 2: one merge per split, then the fold,
    instead of 15 loop merges).
    """
    return split_tiling(tiling, tokens=tokens, nq=nq, topk=topk, soc=soc).kv_splits


def split_tiling(tiling: SaTileShapeConfig, *, tokens: int, nq: int, topk: int,
                 soc: str) -> SaTileShapeConfig:  # fmt: skip
    """``tiling`` with ``kv_splits`` set by :func:`default_kv_splits` (pass the result to both
    the golden and the kernel)."""
    check_instance(tiling, "tiling", SaTileShapeConfig)
    items = check_pos_int(tokens, "tokens") * max(check_pos_int(nq, "nq") // tiling.g_tile, 1)
    units = kv_tiles(topk, tiling.s_kv_tile)
    if tiling.softmax != "online":
        return tiling.replace(kv_splits=1)
    return SPLIT_RULE.split_tiling(tiling, items=items, units=units, soc=soc)


__all__ = [
    "Args",
    "HEAD_DIM",
    "HostPlan",
    "NO_ROW",
    "QUANT_NAMES",
    "SPLIT_RULE",
    "UNROLL_TILES",
    "attention_flop",
    "check_inputs",
    "check_meta",
    "check_packed_cache",
    "check_split_cache",
    "check_values",
    "cost",
    "cost_args",
    "cur_seq_lengths",
    "default_kv_splits",
    "host_plan",
    "kernel_indices",
    "kernel_indices_torch",
    "kv_split_inputs",
    "kv_tiles",
    "merge_chain",
    "model_keywords",
    "packed_inputs",
    "plan_physical_rows",
    "resolve_tiling",
    "split_tiling",
    "stand_in_positions",
    "tiles_per_split",
    "tiling_argument",
]
