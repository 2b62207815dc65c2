"""Numerics primitives of the goldens: the rounding points every op uses.

One rule per conversion, shared with :mod:`tilesim.shared.casts` (the same functions):

* :func:`to_bf16` — FP32 -> BF16, round to nearest even; NaN sign kept (``nan="canonical"``
  gives torch's 0x7FC0).
* :func:`to_fp8_e4m3` — FP32 -> FP8 E4M3FN, RNE, clamped to +-448 first by default.
* :func:`widen_to_fp32` — exact widening of BF16/FP16/FP8/INT8.
* :func:`bf16_round_trip` — ``fp32(bf16(x))``, the "cast to BF16 and back" a kernel does
  between two stages that both compute in FP32.

See ``docs/numerics.md`` for the policy and the oracles the tests use.
"""

from __future__ import annotations

import numpy as np
from tilesim.shared.casts import BF16, FP8_E4M3, to_bf16, to_fp8_e4m3, widen_to_fp32


def bf16_round_trip(x) -> np.ndarray:
    """``float32(bf16(x))``: round an FP32 array to BF16 precision, keep it in FP32."""
    return to_bf16(x).astype(np.float32)


def ulp_distance(a, b) -> np.ndarray:
    """Distance in units in the last place between two arrays of the same float dtype.

    Works for float32, float16, bfloat16 and float8_e4m3fn by mapping the bit patterns onto a
    monotonic integer line (+0 and -0 are 0 apart). NaN positions give ``-1``.
    """
    a = np.asarray(a)
    b = np.asarray(b)
    if a.dtype != b.dtype:
        raise TypeError(f"ulp_distance: dtypes differ ({a.dtype} vs {b.dtype})")
    if a.shape != b.shape:
        raise ValueError(f"ulp_distance: shapes differ ({a.shape} vs {b.shape})")
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize]
    nbits = 8 * a.dtype.itemsize

    def ordinal(x: np.ndarray) -> np.ndarray:
        u = x.view(bits).astype(np.int64)
        sign = u >> (nbits - 1)
        mag = u & ((1 << (nbits - 1)) - 1)
        return np.where(sign == 1, -mag, mag)

    d = np.abs(ordinal(a) - ordinal(b))
    nan = np.isnan(a.astype(np.float32)) | np.isnan(b.astype(np.float32))
    return np.where(nan, -1, d)


__all__ = [
    "BF16",
    "FP8_E4M3",
    "bf16_round_trip",
    "to_bf16",
    "to_fp8_e4m3",
    "ulp_distance",
    "widen_to_fp32",
]
