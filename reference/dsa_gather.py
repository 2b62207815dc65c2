"""Paged gather of the DeepSeek-V3.2 latent cache for :mod:`tilesim.reference.dsa`.

Two jobs, both exact (no rounding happens here apart from the dequantization rule of
:func:`tilesim.shared.quant.dequantize_latent`):

* :func:`plan_physical_rows` — check every top-k entry a query token uses and translate it to a
  physical cache row, ``block_table[b, p // block_size] * block_size + p % block_size``.
* :class:`PackedCache` / :class:`SplitCache` — fetch rows of a packed (``pypto`` / ``flashmla``)
  or kv_split cache and dequantize them: ``kn = bf16(fp32(q) * scale_g)`` (BF16 ``[n, 512]``),
  ``kr`` BF16 ``[n, 64]`` as stored.

Entry policy (``docs/ops/deepseek_sparse_attention.md``): query token ``s`` of batch ``b`` uses
the first ``cur_seq = min(max(act - s1 + 1 + s, 0), topk)`` entries of its row. Among them
``-1`` means "no key" and is skipped; any other negative value, a position ``>= act``, a
logical block outside ``block_table``, a ``-1`` (or other negative) block-table entry that is
needed, or a physical row outside the cache raises a ``ValueError`` that names the entry.
Entries past ``cur_seq`` are never read, so they are not checked.
"""

from __future__ import annotations

import numpy as np
from tilesim.shared.mla_cache import LAYOUTS, PYPTO_ROW_BYTES, MlaCacheRows, unpack_rows
from tilesim.shared.quant import dequantize_latent

#: marks an entry that contributes no key (a ``-1`` index, or a column past ``cur_seq``)
NO_ROW = -1
#: rows of ``topk_indices`` checked per step (bounds the int64 temporaries)
_PLAN_CHUNK = 1024


def cur_seq_lengths(kv_act_seqs: np.ndarray, s1: int, topk: int) -> np.ndarray:
    """``cur_seq`` of every query token, int64 ``[B * s1]`` (row ``b * s1 + s``).

    ``cur_seq = min(max(act_b - s1 + 1 + s, 0), topk)``: token ``s`` of a multi-token decode
    sees keys up to its own position, capped at ``topk``.
    """
    acts = np.asarray(kv_act_seqs, dtype=np.int64)
    s = np.arange(s1, dtype=np.int64)
    cur = np.clip(acts[:, None] - s1 + 1 + s[None, :], 0, topk)
    return cur.reshape(-1)


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
    n_blocks = block_table.shape[1]
    acts = np.asarray(kv_act_seqs, dtype=np.int64)
    cur = cur_seq_lengths(acts, s1, topk)
    phys = np.full((n_rows, topk), NO_ROW, dtype=np.int32)
    cols = np.arange(topk, dtype=np.int64)
    for r0 in range(0, n_rows, _PLAN_CHUNK):
        r1 = min(r0 + _PLAN_CHUNK, n_rows)
        idx = topk_indices[r0:r1, :topk].astype(np.int64)
        used = cols[None, :] < cur[r0:r1, None]
        b_of_row = np.arange(r0, r1, dtype=np.int64) // s1
        act = acts[b_of_row][:, None]
        live = used & (idx != -1)
        if not live.any():
            continue

        def fail(mask: np.ndarray, why: str, idx=idx, r0=r0) -> None:
            rr, cc = np.argwhere(mask)[0]
            row = r0 + int(rr)
            b = row // s1
            raise ValueError(
                f"topk_indices[{row}, {int(cc)}] = {int(idx[rr, cc])} (batch {b}, query token "
                f"{row % s1}, kv_act_seqs[{b}] = {int(acts[b])}): {why}"
            )

        bad = live & (idx < 0)
        if bad.any():
            fail(bad, "expected a position >= 0 or -1 (skipped)")
        bad = live & (idx >= act)
        if bad.any():
            fail(bad, "position is outside the sequence (expected < kv_act_seqs[b])")
        blk = np.where(live, idx // block_size, 0)
        bad = live & (blk >= n_blocks)
        if bad.any():
            fail(bad, f"logical block is outside block_table (it has {n_blocks} columns)")
        entry = np.where(live, block_table[b_of_row[:, None], blk].astype(np.int64), 0)
        bad = live & (entry < 0)
        if bad.any():
            rr, cc = np.argwhere(bad)[0]
            b = (r0 + int(rr)) // s1
            fail(
                bad,
                f"needs block_table[{b}, {int(blk[rr, cc])}] = {int(entry[rr, cc])} "
                "(expected a physical block >= 0)",
            )
        row = entry * block_size + idx % block_size
        bad = live & (row >= cache_rows)
        if bad.any():
            rr, cc = np.argwhere(bad)[0]
            fail(
                bad,
                f"physical row {int(row[rr, cc])} is outside the cache ({cache_rows} rows)",
            )
        phys[r0:r1] = np.where(live, row, NO_ROW).astype(np.int32)
    return phys, cur


class PackedCache:
    """A packed ``[rows, 656]`` cache (FP8 E4M3 or INT8) in the ``pypto`` or ``flashmla`` order."""

    def __init__(self, cache: np.ndarray, layout: str):
        if layout not in LAYOUTS:
            raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
        self.cache = cache
        self.layout = layout
        self.rows = cache.shape[0]
        self.dtype = cache.dtype

    def fields(self, phys: np.ndarray) -> MlaCacheRows:
        """The fields of physical rows ``phys`` (fresh arrays)."""
        return unpack_rows(self.cache[phys], self.layout)

    def keys(self, phys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(kn bf16 [n, 512], kr bf16 [n, 64])`` of physical rows ``phys``."""
        f = self.fields(phys)
        return dequantize_latent(f.nope, f.scales), f.rope


class SplitCache:
    """The kv_split triple ``kn_quant [rows, 512]``, ``kr [rows, 64]``, ``kn_scales [rows, 4]``."""

    def __init__(self, kn_quant: np.ndarray, kr: np.ndarray, kn_scales: np.ndarray):
        self.kn_quant = kn_quant
        self.kr = kr
        self.kn_scales = kn_scales
        self.rows = kn_quant.shape[0]
        self.dtype = kn_quant.dtype

    def fields(self, phys: np.ndarray) -> MlaCacheRows:
        return MlaCacheRows(self.kn_quant[phys], self.kr[phys], self.kn_scales[phys])

    def keys(self, phys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        f = self.fields(phys)
        return dequantize_latent(f.nope, f.scales), f.rope


__all__ = [
    "NO_ROW",
    "PYPTO_ROW_BYTES",
    "PackedCache",
    "SplitCache",
    "cur_seq_lengths",
    "plan_physical_rows",
]
