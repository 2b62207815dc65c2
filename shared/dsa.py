"""Host glue of DeepSeek-V3.2 sparse attention, shared by the golden and the kernel wrapper.

Everything here runs on host NumPy data and rounds nothing:

* :func:`check_dsa_args` — the argument checks of ``sparse_attention_antiquant`` and
  ``..._kv_split`` (reference and device call the same function, so they accept and reject the
  same arguments with the same messages), returning a :class:`DsaArgs` named tuple;
  :func:`check_packed_cache` / :func:`check_split_cache` check the cache forms;
  :func:`resolve_tiling` handles ``tiling=`` and its deprecated alias ``tile_config=``.
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

import warnings
from typing import NamedTuple

import numpy as np
from tilesim.shared import splitkv
from tilesim.shared.casts import BF16, FP8_E4M3
from tilesim.shared.mla_cache import LAYOUTS, NOPE, NSCALES, PYPTO_ROW_BYTES, ROPE
from tilesim.shared.soc import get_soc
from tilesim.shared.tiling import SaTileShapeConfig
from tilesim.shared.validate import (
    INT32_MAX,
    check_array,
    check_bool,
    check_choice,
    check_float,
    check_instance,
    check_int,
    check_pos_int,
    check_range,
    check_trace,
    dtype_of,
    host_ints,
    shape_of,
)

HEAD_DIM = NOPE + ROPE  # 576
#: marks an entry that contributes no key (a ``-1`` index, or a column past ``cur_seq``)
NO_ROW = -1
#: storage dtypes of the quantized latent, and their kernel names
QUANT_NAMES = {FP8_E4M3: "fp8", np.dtype(np.int8): "int8"}
#: rows of ``topk_indices`` checked per step (bounds the int64 temporaries)
_PLAN_CHUNK = 1024


class DsaArgs(NamedTuple):
    """The checked arguments of one sparse-attention call.

    ``query_nope`` / ``query_rope`` are the caller's arrays or tensors (metadata checked, data
    not read); the integer inputs are host int64 copies."""

    query_nope: object
    query_rope: object
    topk_indices: np.ndarray
    block_table: np.ndarray
    kv_act_seqs: np.ndarray
    nq: int
    topk: int
    block_size: int
    softmax_scale: np.float32
    s1: int
    n_b: int
    rows: int
    tiling: SaTileShapeConfig


# ----------------------------------------------------------------------------- checks
def tiling_argument(tiling, tile_config=None, *, stacklevel: int = 4):
    """The ``tiling`` argument of a call, or its deprecated alias ``tile_config`` (a
    ``DeprecationWarning``; both given: ``TypeError``): a ``SaTileShapeConfig`` or ``None``."""
    name = "tiling"
    if tile_config is not None:
        if tiling is not None:
            raise TypeError("tiling: got tiling= and its deprecated alias tile_config=; pass one")
        warnings.warn(
            "tile_config= is deprecated, use tiling= (same meaning)", DeprecationWarning, stacklevel
        )
        tiling, name = tile_config, "tile_config"
    return check_instance(tiling, name, SaTileShapeConfig, optional=True)


def resolve_tiling(tiling, tile_config=None) -> SaTileShapeConfig:
    """The tile config of a call (:func:`tiling_argument`); ``None`` reads
    ``SaTileShapeConfig.from_env()`` now."""
    tiling = tiling_argument(tiling, tile_config)
    return SaTileShapeConfig.from_env() if tiling is None else tiling


def _check_queries(query_nope, query_rope) -> int:
    check_array(query_nope, "query_nope", dtype=BF16, ndim=2, layout="[T*nq, 512]")
    rows = shape_of(query_nope, "query_nope")[0]
    check_array(query_rope, "query_rope", dtype=BF16)
    check_array(query_nope, "query_nope", shape=(rows, NOPE), layout="[T*nq, 512]")
    check_array(query_rope, "query_rope", shape=(rows, ROPE), layout="[T*nq, 64]")
    return rows


def check_dsa_args(
    query_nope,
    query_rope,
    topk_indices,
    block_table,
    kv_act_seqs,
    *,
    nq,
    n_kv,
    softmax_scale,
    topk,
    block_size,
    tiling=None,
    tile_config=None,
    trace=None,
    progress=None,
) -> DsaArgs:
    """Check the arguments shared by both ops (see :class:`DsaArgs`), before any work."""
    nq = check_pos_int(nq, "nq")
    if check_pos_int(n_kv, "n_kv") != 1:
        raise ValueError(
            f"n_kv: expected 1 (the latent cache holds one KV head per row, as in DeepSeek-V3.2 "
            f"MQA; the seeds' kernels only index correctly for n_kv = 1), got {n_kv}"
        )
    topk = check_pos_int(topk, "topk")
    block_size = check_int(block_size, "block_size", lo=1, hi=INT32_MAX)
    scale = np.float32(check_float(softmax_scale, "softmax_scale", positive=True, fp32=True))
    cfg = resolve_tiling(tiling, tile_config)
    if cfg.kv_splits > 1 and cfg.softmax != "online":
        raise ValueError(
            f"tiling.kv_splits: expected 1 with softmax 'per_tile' (split-KV combines "
            f"unnormalised online states), got {cfg.kv_splits}"
        )
    check_trace(trace)
    if progress is not None:
        check_bool(progress, "progress")
    rows = _check_queries(query_nope, query_rope)
    acts = host_ints(kv_act_seqs, "kv_act_seqs", ndim=1, layout="[B]")
    n_b = acts.shape[0]
    if n_b == 0:
        raise ValueError("kv_act_seqs: expected at least one batch, got shape (0,)")
    check_range(acts, "kv_act_seqs", lo=0)
    if rows == 0 or rows % (n_b * nq):
        raise ValueError(
            f"query_nope: expected rows = B*s1*nq > 0 with B = len(kv_act_seqs) = {n_b} and "
            f"nq = {nq}, got {rows} rows"
        )
    s1 = rows // (n_b * nq)
    ti = host_ints(topk_indices, "topk_indices", shape=(n_b * s1, topk), layout="[T, n_kv*topk]")
    bt = host_ints(block_table, "block_table", ndim=2, layout="[B, max_blocks]")
    if bt.shape[0] != n_b:
        raise ValueError(
            f"block_table: expected shape ({n_b}, *) (B = len(kv_act_seqs) = {n_b}; "
            f"kv_act_seqs and block_table hold one entry / row per batch), got {tuple(bt.shape)}"
        )
    # a length past the table's capacity would address keys no block holds (and wrap in the
    # kernel's INT32 arithmetic)
    check_range(acts, "kv_act_seqs", lo=0, hi=bt.shape[1] * block_size)
    return DsaArgs(
        query_nope, query_rope, ti, bt, acts, nq, topk, block_size, scale, s1, n_b, rows, cfg
    )


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


def effective_kv_splits(topk: int, s_kv_tile: int, kv_splits: int) -> int:
    """How many splits can be non-empty: ``ceil(kv_tiles / tiles_per_split)`` (<= kv_splits).
    E.g. 4 tiles and ``kv_splits = 3`` give 2 tiles per split, so 2 splits."""
    return splitkv.effective_kv_splits(kv_tiles(topk, s_kv_tile), kv_splits)


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


def default_kv_splits(*, tokens: int, nq: int, topk: int, tiling: SaTileShapeConfig,
                      soc: str) -> int:  # fmt: skip
    """The split count for a call: a pure function of the shape and the SoC's cube cores.

    ``items = tokens * (nq / g_tile)`` independent (token, group tile) work items. When they
    fill the cube cores (``items >= aic_cores``), or a token has one KV tile, or the softmax
    mode is ``per_tile`` (the split is built for the online merge), the answer is 1.
    Otherwise the smallest ``k <= min(kv_tiles, aic_cores // items, UNROLL_TILES)`` (every
    range can have a core) with the shortest dependent chain :func:`merge_chain`, in whole
    ranges. Decode preset: 2048 keys = 4 tiles and 4096 keys = 8 tiles -> 1 (the unsplit fold
    is one stage); 8192 keys (16 tiles) B 1 -> 8 (chain 2: one merge per split, then the fold,
    instead of 15 loop merges).
    """
    check_instance(tiling, "tiling", SaTileShapeConfig)
    items = check_pos_int(tokens, "tokens") * max(check_pos_int(nq, "nq") // tiling.g_tile, 1)
    units = kv_tiles(topk, tiling.s_kv_tile)
    if tiling.softmax != "online":
        return 1
    return splitkv.default_kv_splits(
        items=items,
        units=units,
        cores=get_soc(soc).aic_cores,
        chain=merge_chain,
        max_splits=UNROLL_TILES,
    )


def split_tiling(tiling: SaTileShapeConfig, *, tokens: int, nq: int, topk: int,
                 soc: str) -> SaTileShapeConfig:  # fmt: skip
    """``tiling`` with ``kv_splits`` set by :func:`default_kv_splits` (pass the result to both
    the golden and the kernel)."""
    k = default_kv_splits(tokens=tokens, nq=nq, topk=topk, tiling=tiling, soc=soc)
    return tiling.replace(kv_splits=k)


__all__ = [
    "DsaArgs",
    "HEAD_DIM",
    "NO_ROW",
    "QUANT_NAMES",
    "UNROLL_TILES",
    "attention_flop",
    "check_dsa_args",
    "check_packed_cache",
    "check_split_cache",
    "cur_seq_lengths",
    "default_kv_splits",
    "effective_kv_splits",
    "kv_tiles",
    "merge_chain",
    "plan_physical_rows",
    "resolve_tiling",
    "split_tiling",
    "stand_in_positions",
    "tiles_per_split",
    "tiling_argument",
]
