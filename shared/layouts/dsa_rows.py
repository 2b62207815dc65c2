"""DeepSeek-V3.2 sparse attention (op ``dsa``): the top-k entries a query token uses and the
cache rows they name, in NumPy on host data (rounds nothing). The contract
(:mod:`tilesim.shared.dsa`) checks and plans with these rules; the golden reads their rows.

* :func:`cur_seq_lengths` — how many top-k entries each query token uses.
* :func:`plan_physical_rows` — check every used top-k entry and translate it to a physical
  cache row, ``block_table[b, p // block_size] * block_size + p % block_size``.
* :func:`stand_in_positions` — for the kernel's masked build: a readable position per batch
  that a skipped (``-1``) entry may gather instead (its score is masked out).

Entry policy (``docs/ops/dsa.md``): query token ``s`` of batch ``b`` uses
the first ``cur_seq = min(max(act - s1 + 1 + s, 0), topk)`` entries of its row. Among them
``-1`` means "no key" and is skipped; any other negative value, a position ``>= act``, a
logical block outside ``block_table``, a negative block-table entry that is needed, or a
physical row outside the cache raises a ``ValueError`` that names the entry. Entries past
``cur_seq`` are never read, so they are not checked.
"""

from __future__ import annotations

import numpy as np

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


__all__ = [
    "NO_ROW",
    "cur_seq_lengths",
    "plan_physical_rows",
    "stand_in_positions",
]
