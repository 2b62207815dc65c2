"""The one slot rule of the paged caches the prologs write (vLLM's ``slot_mapping``).

A token's *slot* is the physical cache row its new key / latent row goes to: ``block *
block_size + offset``. Both prologs (:mod:`tilesim.shared.mla_prolog`,
:mod:`tilesim.shared.dsa_indexer_prolog`) and the DeepSeek layer step read slots through this
module only:

* :func:`slots_from_block_table`: the host rule that derives the slots from a block table
  (pypto-gym's ``gen_block_table`` in
  ``hicann/pypto-gym:tests/ops/deepseek_v32_exp/test_lightning_indexer_prolog_quant.py`` and
  vLLM's ``slot_mapping`` in ``vllm-project/vllm:vllm/v1/worker/block_table.py``);
* :func:`check_slot_mapping_meta` (dtype and length, no value read) and
  :func:`check_slot_mapping` (the values) on a caller's ``slot_mapping``.

One edge behaviour everywhere: :data:`NO_SLOT` (``-1``, vLLM's padding) skips the token's
write; any other value outside ``[0, rows)`` is refused, a row given to two tokens is refused
(their write order would be undefined), a mapping whose length is not the token count is
refused, and so is a block table that does not hold a token's position. Every refusal is a
``ValueError`` (``TypeError`` for a non-integer dtype) naming the entry (``docs/index.md``,
"Argument checks").
"""

from __future__ import annotations

import numpy as np
from tilesim.shared.models import DEEPSEEK_V32
from tilesim.shared.validate import (
    INT32_MAX,
    check_int,
    check_int_array,
    check_range,
    host_ints,
    raise_at_first,
)

NO_SLOT = -1  #: a token whose cache write is skipped (vLLM's padding slot)


def check_slot_mapping_meta(slot_mapping, tokens: int) -> None:
    """``slot_mapping`` is an integer ``[tokens]`` array (metadata only: works on ``meta``
    tensors). ``TypeError`` / ``ValueError`` naming ``slot_mapping``, expected and actual."""
    check_int_array(slot_mapping, "slot_mapping", ndim=1, shape=(tokens,), layout="[T]")


def check_slot_mapping(slot_mapping, *, tokens: int, rows: int, rows_of: str) -> np.ndarray:
    """``slot_mapping [tokens]`` (integer) as a host int64 copy: each entry :data:`NO_SLOT`
    (the token is not written) or a cache row in ``[0, rows)`` (``rows_of``: where that count
    comes from, for the message), no row written by two tokens."""
    slots = host_ints(slot_mapping, "slot_mapping", ndim=1, shape=(tokens,), layout="[T]")
    raise_at_first((slots < NO_SLOT) | (slots >= rows), lambda t: (
        f"slot_mapping[{t}]: expected -1 (skip) or a cache row in [0, {rows}) ({rows_of}), got "
        f"{int(slots[t])}"))  # fmt: skip
    uniq, counts = np.unique(slots[slots != NO_SLOT], return_counts=True)
    if (counts > 1).any():
        row = int(uniq[counts > 1][0])
        tokens_at = np.flatnonzero(slots == row).tolist()
        raise ValueError(
            f"slot_mapping[{tokens_at[1]}]: expected a row no other token writes, got {row} "
            f"(each cache row at most once; tokens {tokens_at} write it, in an undefined order)"
        )
    return slots


def _new_positions(lens: np.ndarray, q_lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Batch index and position of every new token, batch-major: batch ``b``'s ``q_lens[b]``
    new tokens are its positions ``lens[b] - q_lens[b] .. lens[b] - 1``."""
    batch = np.repeat(np.arange(lens.size), q_lens)
    first = np.cumsum(q_lens) - q_lens  # each batch's first token index
    pos = lens[batch] - q_lens[batch] + (np.arange(batch.size) - first[batch])
    return batch, pos.astype(np.int64)


def slots_from_block_table(block_table, seq_lens, *, q_lens=None,
                           block_size: int = DEEPSEEK_V32.block_size) -> np.ndarray:  # fmt: skip
    """The slot of every new token, int64 ``[sum(q_lens)]``, batch-major.

    ``block_table [B, max_blocks]`` (integer, ``-1`` = unallocated), ``seq_lens [B]`` (the
    sequence lengths, new tokens included), ``q_lens [B]`` (new tokens per batch; ``None``:
    1 each, decode). Position ``p`` of batch ``b`` goes to ``block_table[b, p // block_size] *
    block_size + p % block_size``. ``ValueError`` naming the entry when ``q_lens[b]`` is
    outside ``[0, seq_lens[b]]`` or a new token's block is unallocated or past the table.
    A caller that wants a token skipped sets its slot to :data:`NO_SLOT` afterwards."""
    bs = check_int(block_size, "block_size", lo=1, hi=INT32_MAX)
    bt = host_ints(block_table, "block_table", ndim=2, layout="[B, max_blocks]")
    nb = bt.shape[0]
    lens = host_ints(seq_lens, "seq_lens", ndim=1, shape=(nb,), layout="[B]")
    check_range(lens, "seq_lens", lo=0)
    ql = (np.ones(nb, np.int64) if q_lens is None
          else host_ints(q_lens, "q_lens", ndim=1, shape=(nb,), layout="[B]"))  # fmt: skip
    raise_at_first((ql < 0) | (ql > lens), lambda b: (
        f"q_lens[{b}]: expected a value in [0, seq_lens[{b}] = {int(lens[b])}], "
        f"got {int(ql[b])}"))  # fmt: skip
    batch, pos = _new_positions(lens, ql)
    col = np.minimum(pos // bs, bt.shape[1])  # past the table -> the -1 column appended
    blk = np.concatenate([bt, np.full((nb, 1), NO_SLOT, np.int64)], axis=1)[batch, col]
    raise_at_first(blk < 0, lambda t: (
        f"block_table[{int(batch[t])}, {int(pos[t] // bs)}]: expected an allocated block "
        f"(>= 0) for position {int(pos[t])} of batch {int(batch[t])}, got "
        f"{'past the table' if col[t] == bt.shape[1] else int(blk[t])}"))  # fmt: skip
    return (blk * bs + pos % bs).astype(np.int64)


__all__ = [
    "NO_SLOT",
    "check_slot_mapping",
    "check_slot_mapping_meta",
    "slots_from_block_table",
]
