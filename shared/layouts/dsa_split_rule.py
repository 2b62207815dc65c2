"""Split-KV (flash-decoding) for DeepSeek-V3.2 sparse attention (op ``dsa``): which KV tiles
form which split, and the rule that picks the split count.

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
it for a call shape and SoC (:data:`SPLIT_RULE` on :mod:`tilesim.shared.layouts.splitkv`, with the
kernel's merge chain :func:`merge_chain` and its :data:`UNROLL_TILES`), and
:func:`split_tiling` applies it to a tile config. The rule is applied only where asked for (a
tile config is never changed behind the caller's back, so the golden and the kernel always
see the same split). ``docs/ops/dsa.md`` ("Split-KV").
"""

from __future__ import annotations

from tilesim.shared.layouts import splitkv
from tilesim.shared.tiling import SaTileShapeConfig
from tilesim.shared.validate import check_instance, check_pos_int


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
    "SPLIT_RULE",
    "UNROLL_TILES",
    "default_kv_splits",
    "kv_tiles",
    "merge_chain",
    "split_tiling",
    "tiles_per_split",
]
