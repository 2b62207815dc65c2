"""Arithmetic and input checks shared by the three MSA goldens (indexer, decode, main branch).

The arithmetic model (see ``docs/ops/msa.md``):

* **Cube matmul, FP32 out** (:func:`cube_matmul`): the products are formed exactly and summed
  in float64 over one K tile (``k_step`` columns) and rounded once to FP32; the tile partials
  are added in FP32, tile after tile (the L0C accumulation over K steps).
  For BF16/FP16 operands every product and (for O(1) data) every 128-term float64 sum is exact,
  so a K tile is the correctly rounded FP32 value of its dot product, whatever order the BLAS
  uses. For FP32 operands the float64 sum carries ~2^-53 relative error before the FP32
  rounding, so rare elements may differ by one FP32 ulp between BLAS builds.
* **exp** (:func:`exp_fp32`): NumPy's float32 ``exp`` (SIMD on x86-64; within 2 FP32 ulp of the
  correctly rounded value on the softmax domain, checked by the tests). The device's exp is not
  bit-reproducible either (anchors §0.7), so P carries a stated budget, not a bit promise.
* **Row sum** (:func:`rowsum_fp32`): float64 sum of the FP32 values rounded once to FP32.
* **Row max** is exact. Every other vector step (scale multiply, mask arithmetic, subtraction,
  online-softmax merge, final division) is one FP32 operation with FP32 rounding, in the
  kernel's order.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable

import numpy as np
from tilesim.reference.arith import exp_fp32_numpy, matmul_fp32, tile_softmax
from tilesim.reference.interop import is_torch_tensor, to_numpy, to_torch
from tilesim.shared.casts import BF16, to_bf16

F64 = np.dtype(np.float64)
F16 = np.dtype(np.float16)

#: the K-step of the cube's accumulation (L0 k tile of every MSA matmul)
K_STEP = 128

Trace = Callable[[dict], None] | None


# ----------------------------------------------------------------------------- input handling
def as_array(x, name: str) -> tuple[np.ndarray, bool]:
    """``(numpy array, came_from_torch)``; torch CPU tensors are viewed without a copy."""
    if is_torch_tensor(x):
        return to_numpy(x), True
    if isinstance(x, np.ndarray):
        return x, False
    raise TypeError(f"{name}: expected a numpy array or a torch CPU tensor, got {type(x).__name__}")


def back(a: np.ndarray, torch_out: bool):
    """Return ``a`` as a torch tensor when the caller passed torch tensors."""
    return to_torch(a) if torch_out else a


def check_dtype(a: np.ndarray, name: str, allowed: tuple) -> None:
    allowed = tuple(np.dtype(d) for d in allowed)
    if a.dtype not in allowed:
        names = " or ".join(str(d) for d in allowed)
        raise TypeError(f"{name}: expected dtype {names}, got {a.dtype}")


def check_ndim(a: np.ndarray, name: str, ndim: int, layout: str) -> None:
    if a.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array {layout}, got shape {a.shape}")


def check_int_array(a: np.ndarray, name: str) -> None:
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected an integer dtype, got {a.dtype}")


def check_pos_int(v, name: str) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral) or v <= 0:
        raise ValueError(f"{name}: expected a positive int, got {v!r}")
    return int(v)


def check_trace(trace) -> None:
    if trace is not None and not callable(trace):
        raise TypeError(f"trace: expected a callable or None, got {type(trace).__name__}")


# ----------------------------------------------------------------------------- arithmetic
def widen64(a: np.ndarray) -> np.ndarray:
    """Exact widening of BF16 / FP16 / FP32 data to float64."""
    return np.asarray(a).astype(F64)


def cube_matmul(a64: np.ndarray, b64: np.ndarray, k_step: int = K_STEP) -> np.ndarray:
    """``a @ b`` as the cube computes it (:func:`tilesim.reference.arith.matmul_fp32` with
    ``k_tile=k_step``): FP32 result, FP32 accumulation over K tiles."""
    return matmul_fp32(a64, b64, k_tile=k_step)


exp_fp32 = exp_fp32_numpy


def round_p(p32: np.ndarray, p_dtype: np.dtype) -> np.ndarray:
    """The cast of P before the P.V matmul, returned widened to float64 for :func:`cube_matmul`.

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

    :func:`tilesim.reference.arith.tile_softmax` with NumPy's float32 exp gives ``m_c``, P and
    ``l_c`` (over the unrounded P); ``O_c = cast(P) @ V`` (cube, FP32 out, K accumulated in
    :data:`K_STEP` steps). Returns ``(m_c, l_c, O_c)`` in FP32.
    """
    m_c, p32, l_c = tile_softmax(s32, exp=exp_fp32_numpy, inplace=True)
    p64 = round_p(p32, p_dtype)
    if v64.ndim == 2:  # V shared by every row: one 2-D matmul over all rows (big cube M)
        o_c = cube_matmul(p64.reshape(-1, p64.shape[-1]), v64)
        o_c = o_c.reshape(*p64.shape[:-1], v64.shape[-1])
    else:
        o_c = cube_matmul(p64, v64)
    return m_c, l_c, o_c


def online_merge(state, m_c, l_c, o_c):
    """Merge one chunk into the running ``(m, l, O)`` (FP32, the kernel's formulas).

    Chunk 0 (``state is None``) stores ``(m_c, l_c, O_c)``. Later chunks:
    ``m' = max(m, m_c)``, ``a = exp(m - m')``, ``b = exp(m_c - m')``, ``l = a*l + b*l_c``,
    ``O = O*a + O_c*b``.
    """
    if state is None:
        return m_c, l_c, o_c
    m, l, o = state
    m_new = np.maximum(m, m_c)
    with np.errstate(invalid="ignore", over="ignore"):
        a = exp_fp32(m - m_new)
        b = exp_fp32(m_c - m_new)
        l_new = a * l + b * l_c
        o_new = o * a + o_c * b
    return m_new, l_new, o_new


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
