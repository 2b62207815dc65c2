"""Host rules and argument checks of the MiniMax-M3 MSA lightning indexer (``msa_indexer``,
``msa_indexer_scores``), written once for the golden and the device wrapper.

Host rules of the MiniMax-M3 MSA ops, written once for the goldens and the kernel wrappers.

NumPy on host data; both :mod:`tilesim.reference` (``msa_indexer``, ``msa_decode``)
and :mod:`tilesim.device` (the same module names) call these functions, so the golden and the
device's host tail apply literally the same rule (``docs/ops/msa.md``):

* **Indexer selection** (:func:`select_blocks`, :func:`select_from_head_max`): key rows at or
  beyond ``seq_len`` take no part; head max = max over a block's keys, block score = max over
  the index heads; ``nb <= 16`` gives ``arange(nb)``; otherwise the 15 best of the non-local
  blocks ``0 .. nb-2`` (score descending, equal scores: the LOWER block id first, a stable sort)
  followed by the local block ``nb - 1``. ``head_reduce="none"``: one selection per index head.
* **Decode keep-mask** (:func:`decode_keep_mask`): ``cur = (seq_len-1)//by``; a slot holding
  block ``cur`` keeps its first ``seq_len - by*cur`` keys, a slot holding a later block is
  dropped, earlier blocks are kept whole (key ``t`` of block ``b`` is kept iff
  ``by*b + t < seq_len``). The current block is recognised by id, so slot order is free.
  Masking is NaN-robust: a dropped key's score is SET to the mask constant (a select) and its
  V row is zeroed before P.V (:func:`decode_read_mask` says which gathered V rows are read), so
  whatever a dropped slot holds (NaN, inf, garbage) never reaches the output.
* **Argument checks** (:func:`check_indexer`, :func:`check_decode_inputs`) with the policy of
  :mod:`tilesim.shared.validate`; they read only metadata, except the value checks (block ids,
  ``seq_len``, finite index data below ``seq_len``), which copy those arrays to the host.

Functions taking an array return the kind (NumPy or torch) of their first array argument.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from tilesim.shared.casts import BF16
from tilesim.shared.models import MINIMAX_M3
from tilesim.shared.validate import (
    check_array,
    check_choice,
    check_finite,
    check_int,
    host_array,
    same_kind,
)

_CFG = MINIMAX_M3.msa
BY = _CFG.block_size  # 128 keys per block
NIDX = _CFG.num_index_heads  # 4 index heads
DIM = _CFG.index_dim  # 128
TOPK = _CFG.topk_blocks  # 16 selected blocks
HEAD_REDUCES = ("max", "none")


class IndexerArgs(NamedTuple):
    """The checked arguments of an indexer call."""

    nb: int  #: key blocks
    valid: int  #: keys that count (``seq_len``, or ``nb*128``)
    head_reduce: str


def check_indexer_seq_len(seq_len, nb: int) -> int:
    """``None`` -> ``nb*128``; else an int (``TypeError`` otherwise) with
    ``(nb-1)*128 < seq_len <= nb*128``."""
    if seq_len is None:
        return nb * BY
    lo, hi = (nb - 1) * BY, nb * BY
    seq_len = check_int(seq_len, "seq_len")  # TypeError for a float, a bool, a str
    if not lo < seq_len <= hi:
        raise ValueError(
            f"seq_len: expected an int with {lo} < seq_len <= {hi} "
            f"(nb = ceil(seq_len/{BY}) = {nb} blocks), got {seq_len!r}"
        )
    return seq_len


def check_indexer(idx_q, idx_k, nb, *, seq_len=None, head_reduce="max") -> IndexerArgs:
    """Checks of ``msa_indexer`` / ``msa_indexer_scores`` (reference and device).

    ``idx_q`` BF16 ``[4, 128]``, ``idx_k`` BF16 ``[nb*128, 128]``, ``nb >= 1``, finite index
    data where it counts (a NaN/inf makes the ranking void: ``idx_q`` and the key rows below
    ``seq_len``; rows at or beyond it are never read by the selection, so they may hold
    anything), ``seq_len`` (:func:`check_indexer_seq_len`) and ``head_reduce`` in
    :data:`HEAD_REDUCES`.
    """
    check_array(idx_q, "idx_q", dtype=BF16, shape=(NIDX, DIM), layout="[index heads, dim]")
    check_array(idx_k, "idx_k", dtype=BF16)
    nb = check_int(nb, "nb", lo=1)
    check_array(idx_k, "idx_k", shape=(nb * BY, DIM), layout=f"[nb*{BY} keys, dim] for nb={nb}")
    valid = check_indexer_seq_len(seq_len, nb)
    check_choice(head_reduce, "head_reduce", HEAD_REDUCES)
    check_finite(host_array(idx_q, "idx_q"), "idx_q")
    check_finite(host_array(idx_k, "idx_k")[:valid], "idx_k")  # rows read by the selection
    return IndexerArgs(nb, valid, head_reduce)


def block_head_max(scores, nb: int, valid: int) -> np.ndarray:
    """FP32 ``[heads, nb]``: per head, the max over each block's keys below ``valid``
    (``-inf`` for a block with no such key). ``scores``: ``[heads, nb*128]`` (host copy)."""
    s = np.array(host_array(scores, "scores"), dtype=np.float32)  # a copy: masked below
    s[:, valid:] = -np.inf  # keys at or beyond seq_len take no part in the max
    return s.reshape(s.shape[0], nb, BY).max(axis=2)


def top_blocks(score: np.ndarray, nb: int, ksel: int) -> np.ndarray:
    """INT32: the ``ksel - 1`` best of blocks ``0 .. nb-2`` (score descending, lower id first
    on ties: a stable sort of ``-score``), then the local block ``nb - 1``."""
    order = np.argsort(-np.asarray(score)[: nb - 1], kind="stable")
    return np.concatenate([order[: ksel - 1], [nb - 1]]).astype(np.int32)


def _select(head_max: np.ndarray, nb: int, head_reduce: str) -> np.ndarray:
    heads = head_max.shape[0]
    ksel = min(TOPK, nb)
    if nb <= TOPK:  # the short-context guard: nothing to rank
        sel = np.arange(nb, dtype=np.int32)
        return sel[None, :] if head_reduce == "max" else np.tile(sel, (heads, 1))
    if head_reduce == "max":
        return top_blocks(head_max.max(axis=0), nb, ksel)[None, :]
    return np.stack([top_blocks(head_max[h], nb, ksel) for h in range(heads)])


def select_from_head_max(head_max, nb: int, *, head_reduce: str = "max"):
    """The ranking on FP32 per-head block maxima ``[4, nb]`` -> INT32 ``[1, k]`` (``"max"``)
    or ``[4, k]`` (``"none"``), ``k = min(16, nb)`` (see the module docstring)."""
    check_choice(head_reduce, "head_reduce", HEAD_REDUCES)
    hm = np.asarray(host_array(head_max, "head_max"), dtype=np.float32)
    return same_kind(np.ascontiguousarray(_select(hm, nb, head_reduce)), head_max)


def select_blocks(scores, nb: int, *, seq_len=None, head_reduce: str = "max"):
    """The indexer's host tail on FP32 scores ``[4, nb*128]`` -> INT32 ids ``[1 or 4, k]``:
    :func:`block_head_max` with ``seq_len``, then :func:`select_from_head_max`."""
    hm = block_head_max(scores, nb, check_indexer_seq_len(seq_len, nb))
    check_choice(head_reduce, "head_reduce", HEAD_REDUCES)
    return same_kind(np.ascontiguousarray(_select(hm, nb, head_reduce)), scores)


def selection_slots(head_max: np.ndarray, nb: int) -> np.ndarray:
    """INT64 ``[nb]``: each block's position in the ``head_reduce="max"`` selection, -1 when
    not selected (the indexer trace's ``slot``)."""
    slots = np.full(nb, -1, dtype=np.int64)
    sel = _select(np.asarray(head_max, dtype=np.float32), nb, "max")[0]
    slots[sel] = np.arange(sel.size)
    return slots


__all__ = [
    "BY",
    "HEAD_REDUCES",
    "IndexerArgs",
    "TOPK",
    "block_head_max",
    "check_indexer",
    "check_indexer_seq_len",
    "select_blocks",
    "select_from_head_max",
    "selection_slots",
    "top_blocks",
]
