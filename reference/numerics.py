"""Numerics primitives of the goldens: the rounding points every op uses.

One rule per conversion, shared with :mod:`tilesim.shared.casts` (the same functions):

* :func:`to_bf16` — FP32 -> BF16, round to nearest even; NaN sign kept (``nan="canonical"``
  gives torch's 0x7FC0).
* :func:`to_fp8_e4m3` — FP32 -> FP8 E4M3FN, RNE, clamped to +-448 first by default.
* :func:`widen_to_fp32` — exact widening of BF16/FP16/FP8/INT8.
* :func:`bf16_round_trip` — ``fp32(bf16(x))``, the "cast to BF16 and back" a kernel does
  between two stages that both compute in FP32.

See ``docs/numerics.md`` for the policy and the oracles the tests use. Arguments follow
:mod:`tilesim.shared.validate` (NumPy arrays or scalars, or torch tensors; NumPy results).
"""

from __future__ import annotations

import numpy as np
from tilesim.shared.casts import (
    BF16,
    FP8_E4M3,
    _as_fp32_source,
    to_bf16,
    to_fp8_e4m3,
    widen_to_fp32,
)
from tilesim.shared.validate import host_data


def bf16_round_trip(x) -> np.ndarray:
    """``float32(bf16(x))``: round an FP32 array to BF16 precision, keep it in FP32."""
    name = "bf16_round_trip(x)"
    return to_bf16(_as_fp32_source(host_data(x, name, scalars=True), name)).astype(np.float32)


#: the float dtypes whose ULP distance :func:`ulp_distance` counts
ULP_DTYPES = (
    np.dtype(np.float64),
    np.dtype(np.float32),
    np.dtype(np.float16),
    BF16,
    FP8_E4M3,
)


def ulp_distance(a, b) -> np.ndarray:
    """Distance in units in the last place between two arrays of the same float dtype.

    Works for float64, float32, float16, bfloat16 and float8_e4m3fn by mapping the bit patterns
    (sign-magnitude) onto a monotonic integer line, so +0 and -0 are 0 apart, the largest finite
    value and inf are 1 apart (formats with inf), and the count crosses zero from the smallest
    negative to the smallest positive subnormal. Returns int64; NaN in either input gives
    ``-1`` (float64 distances above 2**63-1 saturate there).
    """
    a = host_data(a, "ulp_distance(a)", scalars=True)
    b = host_data(b, "ulp_distance(b)", scalars=True)
    if a.dtype not in ULP_DTYPES:
        raise TypeError(
            "ulp_distance(a): expected float64, float32, float16, bfloat16 or float8_e4m3fn, "
            f"got {a.dtype}"
        )
    if a.dtype != b.dtype:
        raise TypeError(f"ulp_distance(b): expected the dtype of a ({a.dtype}), got {b.dtype}")
    if a.shape != b.shape:
        raise ValueError(f"ulp_distance(b): expected the shape of a {a.shape}, got {b.shape}")
    nbits = 8 * a.dtype.itemsize
    ubits = np.dtype(f"u{a.dtype.itemsize}")
    sign_bit = np.uint64(1 << (nbits - 1))

    def sign_mag(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        u = np.ascontiguousarray(x).view(ubits).astype(np.uint64)
        return (u & sign_bit) != 0, u & (sign_bit - np.uint64(1))

    sa, ma = sign_mag(a)
    sb, mb = sign_mag(b)
    # same side of zero: |ma - mb|; opposite sides: ma + mb (both < 2**63, no overflow)
    same = np.where(ma >= mb, ma - mb, mb - ma)
    d = np.where(sa == sb, same, ma + mb)
    d = np.minimum(d, np.uint64(np.iinfo(np.int64).max)).astype(np.int64)
    with np.errstate(invalid="ignore"):
        nan = np.isnan(a.astype(np.float64)) | np.isnan(b.astype(np.float64))
    return np.where(nan, np.int64(-1), d)


__all__ = [
    "ULP_DTYPES",
    "BF16",
    "FP8_E4M3",
    "bf16_round_trip",
    "to_bf16",
    "to_fp8_e4m3",
    "ulp_distance",
    "widen_to_fp32",
]
