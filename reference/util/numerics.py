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

import functools
import warnings

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


# ----------------------------------------------------------------------------- overflow
class NumericsWarning(UserWarning):
    """A golden met an overflow, a division by zero or an invalid operation on legal input
    (finite arguments that passed every check): it returns what the arithmetic gives -- what
    the device computes -- and says where (``docs/numerics.md``, "Overflow on legal input").
    The message names the op, the stage, the arguments the stage reads and what became NaN,
    inf or zero, and the token rows."""


def quiet_numpy(fn):
    """Decorator: ``fn`` runs with NumPy's floating-point warnings off (``np.errstate(all=
    "ignore")``); the golden reports what matters itself (:func:`warn_stage`)."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)

    return run


def _token_rows(v, tokens: int) -> np.ndarray:
    """FP32 ``[tokens, -1]`` view of a stage value whose first axis is the token."""
    with np.errstate(invalid="ignore"):  # integer codes widen to finite values
        return np.asarray(v).reshape(tokens, -1).astype(np.float32)


def _rows_text(rows: np.ndarray) -> str:
    idx = np.flatnonzero(rows).tolist()
    more = f" and {len(idx) - 8} more" if len(idx) > 8 else ""
    return f"token row{'s' if len(idx) > 1 else ''} {idx[:8]}{more}"


def warn_stage(op: str, stage: str, arguments: str, out, src=(), *, zero: bool = False) -> None:
    """Emit a :class:`NumericsWarning` when stage ``stage`` of ``op`` turned finite input rows
    into NaN / inf (or, with ``zero``, a row that is not all zero into all zeros).

    ``out``: the stage's result (one array or a tuple), first axis the token; ``src``: the
    stage's inputs computed by earlier stages (one array or a tuple, the same token rows; the
    checked arguments are finite and need not be given). Only rows whose inputs are finite
    count, so a NaN is reported once, at the stage that made it. ``arguments``: the arguments
    the stage reads, for the message."""
    outs = out if isinstance(out, tuple) else (out,)
    srcs = src if isinstance(src, tuple) else (src,)
    t = np.asarray(outs[0]).shape[0]
    src_rows = [_token_rows(v, t) for v in srcs]
    clean = np.ones(t, dtype=bool)
    for r in src_rows:
        clean &= np.isfinite(r).all(axis=1)
    for v in outs:
        r = _token_rows(v, t)
        nan, inf = np.isnan(r).any(axis=1) & clean, np.isinf(r).any(axis=1) & clean
        if nan.any() or inf.any():
            what = " and ".join(w for w, m in (("NaN", nan), ("inf", inf)) if m.any())
            _warn(op, stage, arguments, f"became {what}", nan | inf)
            clean &= ~(nan | inf)
    if zero and src_rows:
        live = clean & (src_rows[0] != 0).any(axis=1)
        zeros = live & (_token_rows(outs[0], t) == 0).all(axis=1)
        if zeros.any():
            _warn(op, stage, arguments, "became all zero (from a non-zero row)", zeros)


def _warn(op: str, stage: str, arguments: str, what: str, rows: np.ndarray) -> None:
    warnings.warn(
        f"{op}: stage {stage} ({arguments}) {what} in {_rows_text(rows)}, from finite input: an "
        f"overflow or a division by zero in FP32 / FP16 / BF16; the golden returns what the "
        f"arithmetic gives (docs/ops/{op}.md, 'Bad input and overflow')",
        NumericsWarning,
        stacklevel=3,
    )


def quantize_nonfinite(quantize, v, group: int):
    """``quantize(v)`` (a quantizer of ``tilesim.shared.quant`` or a golden's own, returning
    ``(codes, scales)`` with one scale per ``group`` values of the last axis) that also takes
    NaN / inf: the groups holding one are quantized as zeros first, then given the rule's IEEE
    outcome -- scale NaN (a NaN in the group) or +inf (``amax = inf``), codes 0 for INT8 (the
    conversion of NaN to an integer has no defined result; 0 is written) and, for E4M3,
    ``e4m3(v / scale)`` (0 for a finite value over inf, the NaN code for the rest). Finite
    ``v`` is passed to ``quantize`` as it is: the same bits."""
    v32 = np.asarray(v).astype(np.float32)
    grp = v32.reshape(*v32.shape[:-1], -1, group)
    bad = ~np.isfinite(grp).all(axis=-1)
    if not bad.any():
        return quantize(v)
    clean = np.where(bad[..., None], np.float32(0), grp).reshape(v32.shape)
    codes, scales = quantize(clean.astype(np.asarray(v).dtype))
    fill = np.where(np.isnan(grp).any(axis=-1), np.nan, np.inf)[bad]
    s = np.array(scales, copy=True).reshape(bad.shape)
    s[bad] = fill
    c = np.array(codes, copy=True).reshape(grp.shape)
    if c.dtype == np.int8:
        c[bad] = 0
    else:
        with np.errstate(invalid="ignore"):
            c[bad] = to_fp8_e4m3(grp[bad] / fill[:, None].astype(np.float32), saturate=True)
    return c.reshape(np.shape(codes)), s.reshape(np.shape(scales))


__all__ = [
    "ULP_DTYPES",
    "NumericsWarning",
    "quantize_nonfinite",
    "quiet_numpy",
    "warn_stage",
    "BF16",
    "FP8_E4M3",
    "bf16_round_trip",
    "to_bf16",
    "to_fp8_e4m3",
    "ulp_distance",
    "widen_to_fp32",
]
