"""Helpers of the MSA goldens shared by the block-sparse decode and the main branch.

MSA-specific pieces only:

* :data:`K_STEP` — the K tile of every MSA cube matmul (128);
* :func:`round_p` — the cast of P before the P.V matmul (BF16 / FP16 / FP32);
* :func:`softmax_chunk` — one online-softmax key chunk:
  :func:`tilesim.reference.util.arith.tile_softmax` with NumPy's float32 exp, then ``cast(P) @ V``
  with :func:`tilesim.reference.util.arith.matmul_fp32` in :data:`K_STEP` K tiles;
* :func:`chunk_bounds` — the NTILE chunks of a key range (tail kept, or dropped as the seeds do);
* :func:`select_masked`, :func:`zero_unread_rows` — NaN-robust masking: a masked score is SET
  to the mask constant (a select, never ``S*m + (1-m)*neg``, whose ``0 * NaN`` is NaN), and the
  V rows of masked keys are zeroed before P.V (``P = 0`` times a NaN V row is NaN again).

The arithmetic models are :mod:`tilesim.reference.util.arith`, the argument checks
:mod:`tilesim.shared.validate`, the MSA host rules :mod:`tilesim.shared.msa_indexer`
(indexer selection), :mod:`tilesim.shared.msa_decode` (decode keep-mask) and
:mod:`tilesim.shared.msa_main` (main-branch block mask).
"""

from __future__ import annotations

import numpy as np
from tilesim.reference.util.arith import F64, exp_fp32_numpy, matmul_fp32, tile_softmax
from tilesim.shared.casts import BF16, to_bf16

F16 = np.dtype(np.float16)

#: the K-step of the cube's accumulation (L0 k tile of every MSA matmul)
K_STEP = 128


def round_p(p32: np.ndarray, p_dtype: np.dtype) -> np.ndarray:
    """The cast of P before the P.V matmul, returned widened (exactly) to float64.

    ``p_dtype`` BF16 (decode; main branch ``bf16``), FP16 (main branch ``fp16``, IEEE RNE with
    subnormals) or FP32 (main branch ``fp32``: identity).
    """
    if p_dtype == BF16:
        return to_bf16(p32).astype(F64)
    if p_dtype == F16:
        return p32.astype(F16).astype(F64)
    return p32.astype(F64)


def softmax_chunk(s32: np.ndarray, v64: np.ndarray, p_dtype: np.dtype):
    """One online-softmax chunk on masked, scaled FP32 scores ``s32`` ``[..., rows, w]``
    (overwritten: it holds P afterwards).

    :func:`tilesim.reference.util.arith.tile_softmax` with NumPy's float32 exp gives ``m_c``, P and
    ``l_c`` (over the unrounded P); ``O_c = cast(P) @ V`` (cube, FP32 out, K accumulated in
    :data:`K_STEP` steps). Returns ``(m_c, l_c, O_c)`` in FP32.
    """
    m_c, p32, l_c = tile_softmax(s32, exp=exp_fp32_numpy, inplace=True)
    p64 = round_p(p32, p_dtype)
    if v64.ndim == 2:  # V shared by every row: one 2-D matmul over all rows (big cube M)
        o_c = matmul_fp32(p64.reshape(-1, p64.shape[-1]), v64, k_tile=K_STEP)
        o_c = o_c.reshape(*p64.shape[:-1], v64.shape[-1])
    else:
        o_c = matmul_fp32(p64, v64, k_tile=K_STEP)
    return m_c, l_c, o_c


def select_masked(s32: np.ndarray, keep: np.ndarray, fill: np.float32) -> np.ndarray:
    """Masking by select, in place: ``s32`` keeps its value where ``keep`` (bool, broadcast to
    ``s32``) is True and becomes ``fill`` elsewhere, whatever it held (NaN, inf). Returns ``s32``.

    On finite scores this is bit-identical to the multiply form ``S*m + (1-m)*fill``
    (``m`` = 1.0/0.0): ``S*1 + (-0.0) = S`` and ``S*0 + fill = fill`` exactly in FP32.
    """
    np.copyto(s32, fill, where=~np.asarray(keep, dtype=bool))
    return s32


def zero_unread_rows(v: np.ndarray, read: np.ndarray) -> np.ndarray:
    """Zero, in place, the rows of ``v [..., keys, D]`` whose key is not read (``read`` bool
    ``[..., keys]``, broadcast over the leading axes). Returns ``v``.

    A masked key's ``P`` is exactly 0, so its P.V terms are ``0 * V = ±0`` on finite V and
    NaN on a NaN row; with the row zeroed they are ``+0`` whatever the slot held.

    Nothing is written when every row is read. The zeros are written through an unsigned
    integer view of the same width (all-zero bits are ``+0`` in every float format): a masked
    copy in NumPy's integer loop, where the ml_dtypes types (BF16, FP8) have only a slow
    generic one. Same bits as ``np.copyto(v, 0, where=...)`` on ``v`` itself (tested).
    """
    unread = ~np.asarray(read, dtype=bool)
    if not unread.any():
        return v
    np.copyto(_zero_bits_view(v), 0, where=unread[..., None])
    return v


def _zero_bits_view(v: np.ndarray) -> np.ndarray:
    """``v`` viewed as unsigned integers of its width when its zero is the all-zero bit
    pattern (every float and integer format used here), else ``v`` itself."""
    size = v.dtype.itemsize
    if size in (1, 2, 4, 8) and not any(np.array(0, dtype=v.dtype).tobytes()):
        return v.view(np.dtype(f"u{size}"))
    return v


def chunk_bounds(total: int, ntile: int, *, seeds_compat: bool) -> list[tuple[int, int]]:
    """``[(start, width), ...]`` of the NTILE-wide key chunks over ``total`` keys.

    tilesim processes a last partial chunk when ``total % ntile != 0``; the seeds' kernels
    (``seeds_compat=True``) use ``total // ntile`` chunks and drop the tail.
    """
    full, tail = divmod(total, ntile)
    bounds = [(c * ntile, ntile) for c in range(full)]
    if tail and not seeds_compat:
        bounds.append((full * ntile, tail))
    return bounds


__all__ = [
    "F16",
    "K_STEP",
    "chunk_bounds",
    "round_p",
    "select_masked",
    "softmax_chunk",
    "zero_unread_rows",
]
