"""Hadamard transforms of the DeepSeek-V3.2 lightning-indexer prolog (``dsa_indexer_prolog``).

The indexer rotates every 128-value index q head and index key by a Hadamard matrix before
quantizing them (``docs/ops/dsa_indexer_prolog.md``). Two forms exist, and both are here:

* :func:`sylvester_hadamard` -- the true (Sylvester) Hadamard matrix ``H_n`` of a power of two
  ``n``: ``H_1 = [1]``, ``H_2m = [[H_m, H_m], [H_m, -H_m]]``. Entries are ``+-1`` (exact in
  every float dtype and in int8), ``H_n`` is symmetric and ``H_n H_n^T = n I``. Entry ``(i,
  j)`` is ``(-1)^popcount(i & j)``. :func:`scaled_hadamard_bf16` is ``BF16(H_n * n^-0.5)``:
  the matrix input pypto-gym's INT8 prolog multiplies by (``hicann/pypto-gym:tests/ops/
  deepseek_v32_exp/test_lightning_indexer_prolog_quant.py`` feeds a ``[128, 128]`` BF16
  matrix; its test draws random stand-ins). ``BF16(128^-0.5) = 0.08837890625``, about
  ``1.07e-4`` (relative) below ``128^-0.5``, so that matrix is ``0.99989`` times an
  orthonormal one.
* :func:`fwht_fp32` -- the fast Walsh-Hadamard transform ``x @ H_n`` of the last axis in
  FP32: ``log2(n)`` butterfly stages with strides ``1, 2, 4, ..., n/2`` (ascending); each
  stage maps ``(a, b)`` at positions ``(j, j + stride)`` to ``(a + b, a - b)``, each one FP32
  operation (one rounding). The optional ``scale`` is then one FP32 multiply by
  ``fp32(scale)``. :func:`hadamard_rotate` is DeepSeek-V3.2's ``rotate_activation``
  (``deepseek-ai/DeepSeek-V3.2-Exp:inference/model.py``, which calls ``fast_hadamard_transform``
  of ``Dao-AILab/fast-hadamard-transform`` with ``scale = 128^-0.5`` on BF16 data): BF16 in,
  widened exactly, the FP32 butterflies, ``* fp32(n^-0.5)``, one BF16 rounding (round to
  nearest even).

Where the bits are promised and where they are a model:

* A butterfly only adds and subtracts, so the transform's exact value is ``x @ H_n``. When
  every partial sum is representable in FP32 (for example integer inputs with ``n * max|x| <
  2^24``, or BF16 inputs whose exponents span fewer than ``24 - 8 - log2(n)`` binades) the
  FP32 butterflies round nothing, and :func:`fwht_fp32` equals ``x @ H_n`` bit for bit in any
  stage order (tested against the matrix product).
* On general FP32 data each stage may round; the stage order then decides the last bit. The
  ascending order is the textbook one, and the one of the CUDA kernel as its design is
  described (per-thread transforms of 8 contiguous values, then exchanges across lanes:
  arXiv 2412.08832, section 2.4, describing ``Dao-AILab/fast-hadamard-transform``); the CUDA
  source's own order is not re-read here. After the BF16 rounding the orders agree on almost
  every element.
* DeepSeek's post-fix reference also carries a pure-PyTorch fallback; tilesim models the true
  transform (the fast kernel's), never that fallback.

NumPy only; arguments follow :mod:`tilesim.shared.validate` (NumPy arrays or torch tensors,
read without writing); results are NumPy arrays.
"""

from __future__ import annotations

import numpy as np
from tilesim.shared.casts import BF16, to_bf16
from tilesim.shared.validate import (
    check_array,
    check_dtype_choice,
    check_float,
    check_int,
    host_data,
    shape_of,
)

#: the index head dimension DeepSeek-V3.2 rotates (``index_head_dim``)
HADAMARD_DIM = 128
#: the matrix dtypes :func:`sylvester_hadamard` builds (``+-1`` is exact in each)
MATRIX_DTYPES = (np.dtype(np.int8), np.dtype(np.float32), np.dtype(np.float64), BF16)


def _power_of_two(n, name: str) -> int:
    n = check_int(n, name, lo=1, hi=2**14)
    if n & (n - 1):
        raise ValueError(f"{name}: expected a power of two in [1, 16384], got {n}")
    return n


def sylvester_hadamard(n: int = HADAMARD_DIM, *, dtype=np.float32) -> np.ndarray:
    """The Sylvester Hadamard matrix ``H_n`` (``n`` a power of two): ``[n, n]`` of ``+-1`` in
    ``dtype`` (int8, float32, float64 or bfloat16), ``H[i, j] = (-1)^popcount(i & j)``;
    symmetric, ``H H^T = n I``."""
    n = _power_of_two(n, "n")
    dt = check_dtype_choice(dtype, "dtype", MATRIX_DTYPES)
    h = np.ones((1, 1), dtype=np.int8)
    while h.shape[0] < n:  # H_2m = [[H, H], [H, -H]]
        h = np.block([[h, h], [h, -h]])
    return h.astype(dt)


def scaled_hadamard_bf16(n: int = HADAMARD_DIM) -> np.ndarray:
    """``BF16(H_n * fp32(n^-0.5))`` ``[n, n]``: every entry ``+-BF16(n^-0.5)`` (for 128:
    ``+-0.08837890625``), the matrix form of the rotation for a prolog that takes the
    Hadamard matrix as an input (pypto-gym's INT8 prolog)."""
    n = _power_of_two(n, "n")
    h = sylvester_hadamard(n, dtype=np.float32)
    return to_bf16(h * np.float32(n**-0.5))


def fwht_fp32(x, *, scale: float | None = None) -> np.ndarray:
    """The fast Walsh-Hadamard transform of the last axis of ``x [..., n]`` (BF16, FP16 or
    FP32; ``n`` a power of two) in FP32: butterflies with strides ``1, 2, ..., n/2``, every
    add and subtract one FP32 rounding; then, if ``scale`` is given, one FP32 multiply by
    ``fp32(scale)``. Returns FP32 ``[..., n]`` (a new array). Exactly ``x @ H_n`` (times the
    scale) when no partial sum needs rounding (module docstring). A partial sum beyond FP32's
    range is ``inf`` and ``inf - inf`` is NaN, as in IEEE FP32 arithmetic (no warning)."""
    check_array(x, "x", dtype=(BF16, np.float16, np.float32))
    shp = shape_of(x, "x")
    if not shp:
        raise ValueError("x: expected an array [..., n], got a 0-d array")
    n = _power_of_two(shp[-1], "x.shape[-1]")
    s = None if scale is None else np.float32(check_float(scale, "scale", fp32=True))
    y = host_data(x, "x").astype(np.float32)  # exact widening, a fresh array
    lead = y.shape[:-1]
    stride = 1
    with np.errstate(over="ignore", invalid="ignore"):  # IEEE inf / NaN, as the device's
        while stride < n:  # one stage: blocks of 2*stride, (a, b) -> (a + b, a - b)
            v = y.reshape(*lead, n // (2 * stride), 2, stride)
            a, b = v[..., 0, :], v[..., 1, :]
            y = np.stack([a + b, a - b], axis=-2).reshape(*lead, n)
            stride *= 2
        if s is not None:
            y = y * s
    return y


def hadamard_rotate(x) -> np.ndarray:
    """DeepSeek-V3.2's ``rotate_activation``: ``BF16(fwht_fp32(x) * fp32(n^-0.5))`` for BF16
    ``x [..., n]`` (``n`` = 128 in the indexer). Returns BF16 ``[..., n]``."""
    check_array(x, "x", dtype=BF16)
    shp = shape_of(x, "x")
    if not shp:
        raise ValueError("x: expected an array [..., n], got a 0-d array")
    n = _power_of_two(shp[-1], "x.shape[-1]")
    return to_bf16(fwht_fp32(x, scale=n**-0.5))


__all__ = [
    "HADAMARD_DIM",
    "MATRIX_DTYPES",
    "fwht_fp32",
    "hadamard_rotate",
    "scaled_hadamard_bf16",
    "sylvester_hadamard",
]
