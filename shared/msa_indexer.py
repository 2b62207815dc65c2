"""The contract of the MiniMax-M3 MSA lightning indexer (``msa_indexer``,
``msa_indexer_scores``), written once for the golden and the device wrapper.

NumPy on host data; :mod:`tilesim.reference.msa_indexer` and :mod:`tilesim.device.msa_indexer`
call these functions, so both apply literally the same rule (``docs/ops/msa_indexer.md``):

* :class:`Args`, :func:`check_meta` (shapes, dtypes, ``nb``, ``seq_len``, ``head_reduce``;
  no value read), :func:`check_values` (finite index data where it counts: a host copy);
* :func:`host_plan` (NumPy) / :func:`host_plan_torch` (its torch twin, on the inputs'
  device): the key mask of ``seq_len`` and the tie ids of the device ranking;
* the selection (:func:`select_blocks`, :func:`select_from_head_max`): key rows at or beyond
  ``seq_len`` take no part; head max = max over a block's keys, block score = max over the
  index heads; ``nb <= 16`` gives ``arange(nb)``; otherwise the 15 best of the non-local
  blocks ``0 .. nb-2`` (score descending, equal scores: the LOWER block id first, a stable
  sort) followed by the local block ``nb - 1``. ``head_reduce="none"``: one selection per
  index head;
* :func:`cost`: the op's one FLOP / byte counter.

Functions taking an array return the kind (NumPy or torch) of their first array argument.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from tilesim.shared.casts import BF16
from tilesim.shared.models import MINIMAX_M3
from tilesim.shared.ranking import top_k
from tilesim.shared.registry.op_record import Call, OpRecord, Output
from tilesim.shared.validate import (
    check_array,
    check_bool,
    check_choice,
    check_finite,
    check_int,
    host_array,
    same_kind,
)

_CFG = MINIMAX_M3.msa
BY = _CFG.block_size  # 128 keys per block
NIDX = _CFG.num_index_heads  # 4 index heads
NPAD = _CFG.index_heads_padded  # 16 cube rows
DIM = _CFG.index_dim  # 128
TOPK = _CFG.topk_blocks  # 16 selected blocks
HEAD_REDUCES = ("max", "none")


class Args(NamedTuple):
    """The checked arguments of an indexer call (:func:`check_meta`)."""

    nb: int  #: key blocks
    valid: int  #: keys that count (``seq_len``, or ``nb*128``)
    head_reduce: str
    idx_q: object = None  #: the caller's ``[4, 128]`` BF16 array / tensor (not copied)
    idx_k: object = None  #: the caller's ``[nb*128, 128]`` BF16 array / tensor (not copied)


class Plan(NamedTuple):
    """The host plan of a call (:func:`host_plan`): the selection's sizes and masks."""

    rows: int  #: selections: 1 (``head_reduce="max"``) or 4 (``"none"``)
    k: int  #: blocks per selection, ``min(16, nb)``
    key_keep: np.ndarray  #: bool ``[1, nb*128]``: True below ``seq_len``
    order: np.ndarray  #: FP32 ``[1, nb]`` tie ids: ``0 .. nb-2``, then NOT_CANDIDATE


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


def indexer_inputs(idx_q, idx_k, nb, *, seq_len=None, head_reduce="max"):
    """The arguments of ``msa_indexer`` that the golden, the kernel wrapper and
    :func:`check_meta` write out (``tests/test_op_records.py`` holds them equal): BF16 ``idx_q
    [4, 128]`` and ``idx_k [nb*128, 128]``, the key blocks ``nb``, then ``seq_len`` (``None``:
    every key counts) and ``head_reduce`` (:data:`HEAD_REDUCES`); checked by
    :func:`check_meta`."""


def scores_inputs(idx_q, idx_k, nb):
    """The arguments of ``msa_indexer_scores`` that the golden and the kernel wrapper share:
    those of :func:`indexer_inputs` without the selection's ``seq_len`` and ``head_reduce``."""


def check_meta(idx_q, idx_k, nb, *, seq_len=None, head_reduce="max") -> Args:
    """Metadata checks of ``msa_indexer`` / ``msa_indexer_scores`` (no value read: works on
    torch ``meta`` / FakeTensors), on the arguments of :func:`indexer_inputs`: ``idx_q`` BF16
    ``[4, 128]``, ``idx_k`` BF16 ``[nb*128, 128]``, ``nb >= 1``, ``seq_len``
    (:func:`check_indexer_seq_len`, a static int) and ``head_reduce`` in :data:`HEAD_REDUCES`."""
    check_array(idx_q, "idx_q", dtype=BF16, shape=(NIDX, DIM), layout="[index heads, dim]")
    check_array(idx_k, "idx_k", dtype=BF16)
    nb = check_int(nb, "nb", lo=1)
    check_array(idx_k, "idx_k", shape=(nb * BY, DIM), layout=f"[nb*{BY} keys, dim] for nb={nb}")
    valid = check_indexer_seq_len(seq_len, nb)
    check_choice(head_reduce, "head_reduce", HEAD_REDUCES)
    return Args(nb, valid, head_reduce, idx_q, idx_k)


def check_data_values(args: Args) -> Args:
    """Value checks (host copies): finite index data where it counts -- ``idx_q`` and the key
    rows below ``seq_len`` (a NaN/inf makes the ranking void); rows at or beyond it are never
    read by the selection, so they may hold anything. Returns ``args``."""
    check_finite(host_array(args.idx_q, "idx_q"), "idx_q")
    check_finite(host_array(args.idx_k, "idx_k")[: args.valid], "idx_k")
    return args


def check_values(args: Args) -> Args:
    """Every value check of the op (the golden runs them all): :func:`check_data_values`; the
    op reads no integer input on the host."""
    return check_data_values(args)


#: tie id of the local block (and of the device ranking's padding): never a candidate
NOT_CANDIDATE = float(1 << 23)


def host_plan(args: Args) -> Plan:
    """The host rules of a call in NumPy: selections and their size, the bool key mask of
    ``seq_len`` ``[1, nb*128]`` and the FP32 tie ids ``[1, nb]`` of the ranking (block id,
    :data:`NOT_CANDIDATE` for the local block ``nb - 1``). Reads no data."""
    keep = np.zeros((1, args.nb * BY), dtype=bool)
    keep[0, : args.valid] = True  # keys at or beyond seq_len take no part in the max
    order = np.arange(args.nb, dtype=np.float32)[None, :]
    order[0, -1] = NOT_CANDIDATE
    rows = 1 if args.head_reduce == "max" else NIDX
    return Plan(rows, min(TOPK, args.nb), keep, order)


def host_plan_torch(args: Args, device, width: int | None = None):
    """The torch twin of :func:`host_plan`, built on ``device`` (no host copy): ``(key_keep
    bool [1, nb*128], order FP32 [1, width])`` (``width`` >= ``nb``, default ``nb``; the
    padding is :data:`NOT_CANDIDATE`). Same values as the NumPy plan (tested)."""
    import torch  # lazily: importing this module needs no torch

    width = args.nb if width is None else width
    keep = torch.zeros(1, args.nb * BY, dtype=torch.bool, device=device)
    keep[0, : args.valid] = True
    order = torch.full((1, width), NOT_CANDIDATE, dtype=torch.float32, device=device)
    order[0, : args.nb - 1] = torch.arange(args.nb - 1, dtype=torch.float32, device=device)
    return keep, order


def cost(args: Args, *, padded: bool = True) -> dict:
    """``{"flop", "bytes"}`` of the score kernel over ``args.nb`` key blocks.

    ``flop``: 2 per multiply-add of ``S = q @ K^T``; ``padded=True`` as the cube runs it, 16
    rows (4 index heads + 12 zero rows) per block; ``False``: the 4 real heads only.
    ``bytes``: HBM bytes read + written: the BF16 query (16 or 4 rows x 128), the BF16 keys
    ``nb*128 x 128`` and the FP32 scores written (16 or 4 rows x ``nb*128``).
    """
    rows = NPAD if check_bool(padded, "padded") else NIDX
    keys = args.nb * BY
    flop = 2 * rows * keys * DIM
    return {"flop": flop, "bytes": rows * DIM * 2 + keys * DIM * 2 + rows * keys * 4}


def sized_args(nb: int, head_reduce: str = "max") -> Args:
    """:class:`Args` of a call with ``nb`` blocks and every key counting, no arrays (for
    :func:`cost` from sizes alone)."""
    nb = check_int(nb, "nb", lo=1)
    return Args(nb, nb * BY, head_reduce)


def block_head_max(scores, nb: int, valid: int) -> np.ndarray:
    """FP32 ``[heads, nb]``: per head, the max over each block's keys below ``valid``
    (``-inf`` for a block with no such key). ``scores``: ``[heads, nb*128]`` (host copy)."""
    s = np.array(host_array(scores, "scores"), dtype=np.float32)  # a copy: masked below
    s[:, valid:] = -np.inf  # keys at or beyond seq_len take no part in the max
    return s.reshape(s.shape[0], nb, BY).max(axis=2)


def top_blocks(score: np.ndarray, nb: int, ksel: int) -> np.ndarray:
    """INT32: the ``ksel - 1`` best of blocks ``0 .. nb-2`` (score descending, lower id first
    on ties, NaN last: :func:`tilesim.shared.ranking.top_k`), then the local block ``nb - 1``."""
    best = top_k(np.asarray(score)[: nb - 1], ksel - 1, name="block scores")
    return np.concatenate([best, [nb - 1]]).astype(np.int32)


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


# ----------------------------------------------------------------------------- record
#: the op's record in the registry of ops (:mod:`tilesim.shared.registry.ops`)
RECORD = OpRecord(
    name="msa_indexer",
    family="msa",
    calls=(
        Call("msa_indexer", "msa_indexer", (Output("out", "ids", ("row",)),),
             signature=(indexer_inputs,), judge_kind="msa_indexer", device=True),
        Call("msa_indexer_scores", "msa_indexer", (Output("out", "float", ("head",)),),
             signature=(scores_inputs,), judge_kind="msa_indexer_scores", golden=False,
             device=True),
    ),
    cost=cost,
    scan_checks=check_data_values,
    names={"msa_indexer_flop": "msa_indexer", "MSA_CASES": "cases.msa"},
)  # fmt: skip


__all__ = [
    "RECORD",
    "indexer_inputs",
    "scores_inputs",
    "BY",
    "HEAD_REDUCES",
    "NOT_CANDIDATE",
    "Args",
    "Plan",
    "TOPK",
    "block_head_max",
    "check_indexer_seq_len",
    "check_meta",
    "check_values",
    "check_data_values",
    "cost",
    "host_plan",
    "host_plan_torch",
    "select_blocks",
    "select_from_head_max",
    "selection_slots",
    "sized_args",
    "top_blocks",
]
