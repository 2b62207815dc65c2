"""Host rules of the MiniMax-M3 MSA main branch (NumPy on host data), used by the reference
(:mod:`tilesim.reference.msa_main`) and the device wrapper (:mod:`tilesim.device.msa_main`).

* :func:`build_msa_block_mask` — the host's FP32 additive block mask
  ``[ceil(n/bk), topk, bk, bk]`` built from the selected block ids.
* :func:`kernel_mask` — the wrapper's ``[max_n, topk*bk]`` FP32 kernel mask made from it.
* :func:`read_keys` — the keys some query row sees; the K and V rows of the others (padding
  slots, token positions past ``n``) are zeroed before the kernel, whatever they held (NaN).
* :func:`check_msa_main_args` — the argument rules the reference and the wrapper share
  (dtypes, the shape relations between query, key/value blocks and block mask, ``dtype``,
  ``max_n``, ``tiling``), returning a :class:`MainBranchArgs`.

The rules are described in ``docs/ops/msa.md`` ("Main branch / prefill").
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from tilesim.shared.casts import BF16, FP32
from tilesim.shared.models import MINIMAX_M3
from tilesim.shared.tiling import MSA_DTYPES, MsaTiling
from tilesim.shared.validate import (
    check_choice,
    check_dtype,
    check_finite,
    check_instance,
    check_int,
    check_ndim,
    check_pos_int,
    check_range,
    host_array,
    host_ints,
    same_kind,
    shape_of,
)

#: the mask value of a key a query row must not see (-1e9, exact in FP32)
MASK_NEG = np.float32(MINIMAX_M3.msa.prefill_mask_neg)
#: the largest prefill row count (``n``, ``max_n``) accepted: far above any model's context, so
#: that a typo fails with a bound check instead of a multi-GiB allocation
MAX_PREFILL_ROWS = 1 << 20
#: dtypes accepted for query, key_blocks and value_blocks (widened exactly before the cast)
MAIN_INPUT_DTYPES = (FP32, np.dtype(np.float16), BF16)


def build_msa_block_mask(n, topk_indices, *, bk=128, topk=16):
    """The host's additive block mask of the main branch.

    Args:
        n: query (= key) length of the sequence, ``>= 1``.
        topk_indices: 1-D integer ids of the ``ksel <= topk`` selected blocks in slot order,
            unique, each in ``[0, ceil(n/bk))`` (NumPy array or torch tensor).
        bk: block size; topk: slots (slots ``>= ksel`` are zero padding).

    Returns:
        FP32 ``[ceil(n/bk), topk, bk, bk]``: entry ``[qb, i, r, c]`` is 0 when slot ``i`` is
        real, query row ``qb*bk + r < n`` and block ``topk_indices[i]`` is before ``qb``, or
        equals ``qb`` with ``c <= r``; -1e9 otherwise. Same kind as ``topk_indices``.
    """
    n = check_pos_int(n, "n")
    bk = check_pos_int(bk, "bk")
    topk = check_pos_int(topk, "topk")
    ids = host_ints(topk_indices, "topk_indices", ndim=1, layout="[ksel] of selected block ids")
    nbq = math.ceil(n / bk)
    ksel = ids.shape[0]
    if not 1 <= ksel <= topk:
        raise ValueError(f"topk_indices: expected 1..topk={topk} ids, got {ksel}")
    check_range(ids, "topk_indices", 0, nbq - 1)
    if np.unique(ids).size != ksel:
        raise ValueError(f"topk_indices: expected unique ids, got {ids.tolist()}")

    last_valid = n - (nbq - 1) * bk  # rows of the last query block
    mask = np.full((nbq, topk, bk, bk), MASK_NEG, dtype=FP32)
    r = np.arange(bk)[:, None]
    c = np.arange(bk)[None, :]
    for qb in range(nbq):
        qb_valid = last_valid if qb == nbq - 1 else bk
        for i in range(ksel):
            kv = int(ids[i])
            if kv > qb:
                continue  # future block: stays masked
            allowed = (c <= r) if kv == qb else np.ones((bk, bk), dtype=bool)  # diagonal: causal
            mask[qb, i][allowed & (r < qb_valid)] = 0.0
    return same_kind(mask, topk_indices)


def kernel_mask(block_mask, max_n: int) -> np.ndarray:
    """The wrapper's FP32 kernel mask ``[max_n, topk*bk]`` (a new host NumPy array).

    ``block_mask [nbq, topk, bk, bk]`` (array or tensor) is transposed to
    ``[nbq, bk, topk, bk]`` and reshaped, so entry ``[qb*bk + r, i*bk + c]`` is
    ``block_mask[qb, i, r, c]``; rows ``nbq*bk .. max_n-1`` are -1e9.
    """
    bm = host_array(block_mask, "block_mask")
    nbq, topk, bk, _ = bm.shape
    m2 = bm.transpose(0, 2, 1, 3).reshape(nbq * bk, topk * bk)
    pad = np.full((max_n - nbq * bk, topk * bk), MASK_NEG, dtype=FP32)
    return np.concatenate([m2, pad], axis=0)


def read_keys(mask_rows: np.ndarray) -> np.ndarray:
    """bool ``[topk*bk]``: the keys that some query row sees (an entry > -1e9 in its column)
    of the kernel mask rows ``mask_rows [n, topk*bk]`` (the rows ``< n``).

    The other keys are read by nobody: a padding slot, a token position past ``n`` in the last
    block. Reference and wrapper zero their K and V rows (a select, so NaN or garbage there
    cannot reach a score or P.V); their scores are then ``0*scale + mask = mask`` exactly.
    """
    return (np.asarray(mask_rows) > MASK_NEG).any(axis=0)


class MainBranchArgs(NamedTuple):
    """The checked arguments of a main-branch call (shapes from the inputs' metadata)."""

    n: int  #: query rows
    hq: int  #: query heads
    hkv: int  #: KV heads
    dh: int  #: head dim
    nbq: int  #: query blocks, ``ceil(n/bk)``
    topk: int  #: slots
    bk: int  #: block size
    kv_len: int  #: ``topk*bk`` keys
    dtype: str  #: ``"fp32"`` / ``"fp16"`` / ``"bf16"``
    max_n: int  #: rows of the kernel mask
    tiling: MsaTiling
    block_mask: np.ndarray  #: the FP32 block mask as a host NumPy array (finite)


def _check_shapes(query, key_blocks, value_blocks, block_mask) -> tuple[int, ...]:
    """``(n, hq, hkv, dh, nbq, topk, bk, kv_len)`` after the shape relations are checked."""
    n, hq, dh = check_ndim(query, "query", 3, "[n, HQ, dh]")
    if min(n, hq, dh) < 1:
        raise ValueError(f"query: expected a non-empty [n, HQ, dh] array, got shape {(n, hq, dh)}")
    kshape = check_ndim(key_blocks, "key_blocks", 3, "[topk*bk, HKV, dh]")
    nbq, topk, bk, bk2 = check_ndim(block_mask, "block_mask", 4, "[ceil(n/bk), topk, bk, bk]")
    if bk2 != bk or bk < 1 or topk < 1 or nbq != math.ceil(n / bk):
        raise ValueError(
            f"block_mask: expected shape ({math.ceil(n / max(bk, 1))}, topk, bk, bk) for "
            f"n={n}, got {(nbq, topk, bk, bk2)}"
        )
    kv_len, hkv, kdh = kshape
    if kv_len != topk * bk or kdh != dh or hkv < 1:
        raise ValueError(
            f"key_blocks: expected shape ({topk * bk}, HKV, {dh}) (topk*bk rows, query's dh), "
            f"got {kshape}"
        )
    if hq % hkv:
        raise ValueError(f"query: expected HQ a multiple of HKV={hkv}, got HQ={hq}")
    vshape = shape_of(value_blocks, "value_blocks")
    if vshape != kshape:
        raise ValueError(f"value_blocks: expected the shape of key_blocks {kshape}, got {vshape}")
    return n, hq, hkv, dh, nbq, topk, bk, kv_len


def check_msa_main_args(
    query, key_blocks, value_blocks, block_mask, *, dtype=None, max_n=None, tiling=None
) -> MainBranchArgs:
    """The argument rules of the main branch shared by the reference and the wrapper.

    ``tiling=None`` is ``MsaTiling.from_env()`` (read now); ``dtype=None`` / ``max_n=None``
    take ``tiling.dtype`` / ``tiling.max_n``. ``max_n`` must be a multiple of bk and
    ``>= ceil(n/bk)*bk``; the block mask must be finite (masked keys carry -1e9, not -inf).
    Raises ``TypeError`` / ``ValueError`` naming the argument.
    """
    tiling = MsaTiling.from_env() if tiling is None else tiling
    check_instance(tiling, "tiling", MsaTiling)
    dtype = check_choice(tiling.dtype if dtype is None else dtype, "dtype", MSA_DTYPES)
    for name, x in (("query", query), ("key_blocks", key_blocks), ("value_blocks", value_blocks)):
        check_dtype(x, name, MAIN_INPUT_DTYPES)
    check_dtype(block_mask, "block_mask", FP32)
    n, hq, hkv, dh, nbq, topk, bk, kv_len = _check_shapes(
        query, key_blocks, value_blocks, block_mask
    )
    max_n = check_int(tiling.max_n if max_n is None else max_n, "max_n", lo=1, hi=MAX_PREFILL_ROWS)
    if max_n % bk or max_n < nbq * bk:
        raise ValueError(
            f"max_n: expected a multiple of bk={bk} and >= ceil(n/bk)*bk = {nbq * bk}, got {max_n}"
        )
    bm = host_array(block_mask, "block_mask")
    check_finite(bm, "block_mask")
    return MainBranchArgs(n, hq, hkv, dh, nbq, topk, bk, kv_len, dtype, max_n, tiling, bm)


__all__ = [
    "MAIN_INPUT_DTYPES",
    "MASK_NEG",
    "MainBranchArgs",
    "build_msa_block_mask",
    "check_msa_main_args",
    "kernel_mask",
    "read_keys",
]
