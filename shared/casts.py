"""The conversion rules every layer uses: FP32 -> BF16, FP32 -> FP8 E4M3FN, and exact widening.

Rules (see ``docs/numerics.md``; public sources in docs/sources.md#casts-and-dtypes):

* FP32 -> BF16: round to nearest, ties to even (torch, ml_dtypes and the Ascend default
  ``CAST_RINT`` agree). Overflow rounds to +-inf, subnormals are kept, -0 stays -0.
  NaN: ml_dtypes keeps the sign bit and gives the quiet NaN 0x7FC0 / 0xFFC0 (payload dropped).
  torch canonicalises the sign away, and its bits depend on the CPU kernel path (0x7FC0 on the
  scalar path, 0xFFFF on the AVX2/AVX512 path of torch 2.13.0). tilesim follows ml_dtypes by
  default; ``nan="canonical"`` gives 0x7FC0 (torch's scalar rule).
* FP32 -> FP8 E4M3FN: round to nearest even. With ``saturate=True`` (default, the rule of every
  producer that matters: DeepSeek ``act_quant``, vLLM's ds_mla writer, FlashInfer, and torch
  >= 2.12 eager casts) values are clamped to +-448 first, so finite overflow and +-inf give
  +-448; NaN stays NaN with its sign (0x7F / 0xFF). With ``saturate=False`` the plain ml_dtypes
  rule applies: |x| <= 464 rounds to 448, |x| > 464 and +-inf give NaN (0x7F / 0xFF).
* Only float32 (and the narrower float types, which widen exactly) are accepted as the source
  of a rounding: a float64 source would round once from double, which no kernel does.
* Arguments follow :mod:`tilesim.shared.validate`: NumPy arrays or scalars, or torch tensors
  (read through ``detach()`` and integer views, other devices copied to the host); the result
  is always a NumPy array. Lists, Python numbers and ``None`` raise ``TypeError``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
FP32 = np.dtype(np.float32)

FP8_E4M3_MAX = 448.0
INT8_QMAX = 127.0

_NARROW_FLOATS = (BF16, FP8_E4M3, np.dtype(np.float16))
_EXACT_TO_FP32 = (BF16, FP8_E4M3, np.dtype(np.float16), np.dtype(np.int8), np.dtype(np.uint8))


def _validate():
    # imported here: validate imports this module (for BF16 / FP8_E4M3) through interop
    from tilesim.shared import validate

    return validate


def _host(x, name: str) -> np.ndarray:
    return _validate().host_data(x, name, scalars=True)


def _as_fp32_source(x, name: str) -> np.ndarray:
    a = _host(x, name)
    if a.dtype == FP32:
        return a
    if a.dtype in _NARROW_FLOATS:
        return a.astype(np.float32)
    raise TypeError(
        f"{name}: expected a float32 array (or bfloat16/float16/float8_e4m3fn, widened "
        f"exactly), got dtype {a.dtype}; convert float64 data to float32 yourself so the "
        f"single rounding the kernel performs happens from FP32"
    )


def to_bf16(x, *, nan: str = "keep") -> np.ndarray:
    """Round FP32 to BF16 (RNE). Returns an ``ml_dtypes.bfloat16`` array of the same shape.

    ``nan="keep"`` keeps the NaN sign (ml_dtypes); ``nan="canonical"`` maps every NaN to
    0x7FC0 (torch). The input is never modified.
    """
    _validate().check_choice(nan, "nan", ("keep", "canonical"))
    a = _as_fp32_source(x, "to_bf16(x)")
    with np.errstate(invalid="ignore", over="ignore"):
        out = a.astype(BF16)
    if nan == "canonical":
        out.view(np.uint16)[np.isnan(a)] = 0x7FC0
    return out


def to_fp8_e4m3(x, *, saturate: bool = True) -> np.ndarray:
    """Round FP32 to FP8 E4M3FN (RNE). Returns an ``ml_dtypes.float8_e4m3fn`` array.

    ``saturate=True`` clamps to +-448 before the cast (inf -> +-448, NaN stays NaN);
    ``saturate=False`` follows ml_dtypes (|x| > 464 or inf -> NaN).
    """
    _validate().check_bool(saturate, "saturate")
    a = _as_fp32_source(x, "to_fp8_e4m3(x)")
    with np.errstate(invalid="ignore", over="ignore"):
        if saturate:
            # np.clip keeps NaN (with its sign) and -0.0
            a = np.clip(a, np.float32(-FP8_E4M3_MAX), np.float32(FP8_E4M3_MAX))
        return a.astype(FP8_E4M3)


def widen_to_fp32(x) -> np.ndarray:
    """Exact widening of BF16 / FP16 / FP8 E4M3FN / INT8 / UINT8 / FP32 data to FP32.

    Every finite value, +-0 and +-inf widen exactly. BF16 NaNs keep sign and payload (the bits
    move up 16 places, as in torch); FP8 NaNs widen to the quiet NaN 0x7FC00000 / 0xFFC00000
    (torch 2.13 gives 0x7FF00000 / 0xFFF00000). A float32 input is returned as is (no copy).
    """
    a = _host(x, "widen_to_fp32(x)")
    if a.dtype == FP32:
        return a
    if a.dtype in _EXACT_TO_FP32:
        with np.errstate(invalid="ignore"):
            return a.astype(np.float32)
    raise TypeError(
        "widen_to_fp32(x): expected bfloat16, float16, float8_e4m3fn, int8, uint8 or float32, "
        f"got dtype {a.dtype}"
    )
