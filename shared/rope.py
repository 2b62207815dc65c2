"""Rotary position embedding (RoPE) for DeepSeek-V3.2: the YaRN cos/sin table and its rotation.

The table (:func:`yarn_rope_table`) follows ``precompute_freqs_cis`` of
``deepseek-ai/DeepSeek-V3.2-Exp:inference/model.py`` step by step in FP32:

1. ``e_i = fp32(2i) / fp32(d)`` for ``i < d/2`` (exact: a multiple of ``2/d``);
   ``f_i = 1 / fp32(theta ** e_i)`` (the power is computed in float64 and rounded to FP32
   once, then one FP32 reciprocal).
2. YaRN (only when ``max_seq_len > original_max_position_embeddings``, the reference's rule):
   ``lo = max(floor(c(beta_fast)), 0)``, ``hi = min(ceil(c(beta_slow)), d - 1)`` with
   ``c(r) = d * ln(orig / (2 pi r)) / (2 ln theta)`` in float64 (``hi += 0.001`` when equal);
   ``ramp_i = clip((fp32(i) - lo) / (hi - lo), 0, 1)`` and ``smooth_i = 1 - ramp_i`` in FP32;
   ``f_i = (f_i / factor) * (1 - smooth_i) + f_i * smooth_i``, each operation one FP32
   rounding, left to right.
3. ``angle[p, i] = fp32(p) * f_i`` (one FP32 product); ``cos = fp32(cos(angle))`` and
   ``sin = fp32(sin(angle))`` evaluated in float64 and rounded once (correctly rounded but for
   double rounding, which the float64 margin makes vanishingly rare). torch's ``torch.polar``
   uses its own FP32 cos/sin, which may differ by one FP32 ulp on some entries; a golden that
   must match a torch run takes the table as an input (as :mod:`tilesim.reference.mla_prolog`
   does), so the table is never a hidden rounding point.
4. ``mscale``: the reference applies YaRN's magnitude correction to the softmax scale
   (``0.1 * mscale * ln(factor) + 1``, squared), not to the table, so its table has
   ``mscale`` 1. ``table_mscale`` (default 1.0) multiplies cos and sin in FP32 for the
   Hugging Face form, whose ratio ``get_mscale(factor, mscale) / get_mscale(factor,
   mscale_all_dim)`` is 1.0 for DeepSeek-V3.2's config. :func:`yarn_softmax_mscale` gives the
   softmax factor.

Parameters (DeepSeek-V3.2 defaults, ``ModelArgs`` of the same file): ``rope_dim`` 64
(``qk_rope_head_dim``), ``rope_theta`` 10000, ``factor`` 40 (``rope_factor``),
``original_max_position_embeddings`` 4096 (``original_seq_len``), ``beta_fast`` 32,
``beta_slow`` 1, ``mscale`` 1, ``max_seq_len`` 16384.

The rotation (:func:`apply_rope`) widens ``x``, ``cos`` and ``sin`` to FP32 exactly, forms
each output element as one FP32 product pair combined by one FP32 add or subtract
(``a*c - b*s`` and ``a*s + b*c``; no fused multiply-add), and rounds once at the end to the
dtype of ``x`` (BF16 -> BF16 round to nearest even, FP32 stays FP32). Pairings of the
``d`` rope values of one vector:

* ``"interleaved"`` -- pairs ``(2i, 2i+1)``, output interleaved: DeepSeek's
  ``apply_rotary_emb`` (``view_as_complex``), vLLM ``is_neox_style=False``.
* ``"halves"`` -- pairs ``(i, i + d/2)``, output in halves (rotate-half, NeoX).
* ``"deinterleave"`` -- input interleaved, gathered to ``[x0, x2, ..., x1, x3, ...]``, then
  rotated as ``"halves"``; the output stays in that de-interleaved order (pypto-gym's MLA
  ``apply_rotary_pos_emb_v2``, Hugging Face DeepSeek-V3 ``apply_rotary_pos_emb``).

The ``"interleaved"`` output is the ``"deinterleave"`` output permuted back, bit for bit, when
both read the same angles (``a*c - b*s`` and ``a*c + (-b)*s`` round alike).

NumPy only; arguments follow :mod:`tilesim.shared.validate` (inputs never written, results are
NumPy arrays).
"""

from __future__ import annotations

import math

import numpy as np
from tilesim.shared.casts import BF16, to_bf16
from tilesim.shared.validate import (
    check_array,
    check_choice,
    check_dtype_choice,
    check_float,
    check_int,
    check_pos_int,
    fp32_holds,
    host_data,
    host_ints,
    shape_of,
)

#: how RoPE pairs the elements it rotates (the module docstring draws each)
PAIRINGS = ("interleaved", "halves", "deinterleave")

#: DeepSeek-V3.2's RoPE parameters (``inference/model.py`` ``ModelArgs``)
DEEPSEEK_V32_ROPE = {
    "rope_dim": 64,
    "rope_theta": 10000.0,
    "factor": 40.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "max_seq_len": 16384,
}

#: the largest ``max_seq_len`` of a table: every position below it is an FP32 integer exactly
#: (``fp32(2**24 + 1)`` rounds to ``2**24``, and two positions would share one row)
MAX_TABLE_SEQ_LEN = 2**24


def _correction_dim(rotations: float, d: int, theta: float, orig: int) -> float:
    return d * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(theta))


def yarn_inv_freq(
    *,
    rope_dim: int = 64,
    rope_theta: float = 10000.0,
    factor: float = 40.0,
    original_max_position_embeddings: int = 4096,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    max_seq_len: int = 16384,
) -> np.ndarray:
    """The FP32 inverse frequencies ``[rope_dim // 2]`` (steps 1-2 of the module docstring).

    ``rope_theta``: a number ``> 1`` whose largest power ``theta ** ((rope_dim - 2) /
    rope_dim)`` FP32 can hold (so every frequency is finite, ``> 0`` and ``<= 1``);
    ``beta_fast > beta_slow > 0``. Anything else is a ``ValueError`` naming the argument."""
    d = check_pos_int(rope_dim, "rope_dim")
    if d % 2:
        raise ValueError(f"rope_dim: expected an even number, got {rope_dim!r}")
    theta = check_float(rope_theta, "rope_theta", positive=True)
    fac = check_float(factor, "factor", positive=True, fp32=True)
    orig = check_pos_int(original_max_position_embeddings, "original_max_position_embeddings")
    bf = check_float(beta_fast, "beta_fast", positive=True)
    bs = check_float(beta_slow, "beta_slow", positive=True)
    if not bf > bs:
        raise ValueError(
            f"beta_fast: expected a value > beta_slow ({beta_slow!r}), got {beta_fast!r}"
        )
    msl = check_pos_int(max_seq_len, "max_seq_len")
    e = np.arange(0, d, 2, dtype=np.float32) / np.float32(d)
    power = np.power(np.float64(theta), e.astype(np.float64))  # float64: e < 1, never inf
    if not (theta > 1.0 and fp32_holds(float(power[-1]))):
        raise ValueError(
            f"rope_theta: expected a value > 1 whose power theta ** {float(e[-1])!r} FP32 can "
            f"hold (rope_dim {d}), got {rope_theta!r}"
        )
    freqs = np.float32(1.0) / power.astype(np.float32)
    if msl > orig:
        lo = max(math.floor(_correction_dim(bf, d, theta, orig)), 0)
        hi = min(math.ceil(_correction_dim(bs, d, theta, orig)), d - 1)
        if lo == hi:
            hi += 0.001
        ramp = (np.arange(d // 2, dtype=np.float32) - np.float32(lo)) / np.float32(hi - lo)
        smooth = np.float32(1) - np.clip(ramp, np.float32(0), np.float32(1))
        freqs = freqs / np.float32(fac) * (np.float32(1) - smooth) + freqs * smooth
    return freqs.astype(np.float32)


def yarn_rope_table(
    positions, *, table_mscale: float = 1.0, **yarn
) -> tuple[np.ndarray, np.ndarray]:
    """``(cos, sin)``, each FP32 ``[len(positions), rope_dim // 2]``: one angle per pair.

    ``positions``: 1-D integer array of token positions, each in ``[0, max_seq_len)`` (the
    rows of DeepSeek's ``freqs_cis``). ``yarn``: the keywords of :func:`yarn_inv_freq`
    (``rope_dim``, ``rope_theta``, ``factor``, ``original_max_position_embeddings``,
    ``beta_fast``, ``beta_slow``, ``max_seq_len``; DeepSeek-V3.2's by default). For the
    ``"halves"``/``"deinterleave"`` pairings pass the table as is (``apply_rope`` repeats it) or
    tile it to ``[T, rope_dim]`` yourself (the form pypto-gym's prolog takes, then rounded to
    BF16: :func:`halves_table`).

    ``max_seq_len`` is at most :data:`MAX_TABLE_SEQ_LEN` (``2**24``): the angle is formed from
    ``fp32(position)``, exact for every position below ``2**24`` only (a larger one would be
    rounded and share its row with a neighbour); a larger value is a ``ValueError`` naming
    ``max_seq_len``.
    """
    msl = check_int(
        yarn.get("max_seq_len", DEEPSEEK_V32_ROPE["max_seq_len"]),
        "max_seq_len",
        lo=1,
        hi=MAX_TABLE_SEQ_LEN,
    )
    pos = host_ints(positions, "positions", ndim=1, layout="[T]")
    if pos.size and (pos.min() < 0 or pos.max() >= msl):
        bad = pos[(pos < 0) | (pos >= msl)][0]
        raise ValueError(f"positions: expected values in [0, {msl}) (max_seq_len), got {bad}")
    ms = check_float(table_mscale, "table_mscale", positive=True, fp32=True)
    freqs = yarn_inv_freq(**yarn)
    angle = pos.astype(np.float32)[:, None] * freqs[None, :]  # fp32(pos) exact: pos < 2**24
    a64 = angle.astype(np.float64)
    cos = np.cos(a64).astype(np.float32)
    sin = np.sin(a64).astype(np.float32)
    if ms != 1.0:
        cos, sin = cos * np.float32(ms), sin * np.float32(ms)
    return cos, sin


def yarn_softmax_mscale(factor: float = 40.0, mscale: float = 1.0) -> float:
    """YaRN's attention-magnitude factor ``0.1 * mscale * ln(factor) + 1`` (float64; 1.0 for
    ``factor <= 1``). DeepSeek's reference multiplies the softmax scale by its square when
    ``max_seq_len > original_seq_len``."""
    fac = check_float(factor, "factor", positive=True)
    ms = check_float(mscale, "mscale")
    return 1.0 if fac <= 1 else 0.1 * ms * math.log(fac) + 1.0


def halves_table(cos, sin, *, dtype=BF16) -> tuple[np.ndarray, np.ndarray]:
    """``[T, d/2]`` FP32 angles table -> ``[T, d]`` ``cat(c, c)`` / ``cat(s, s)`` in ``dtype``
    (BF16 by default, round to nearest even: the table pypto-gym's MLA prolog takes)."""
    dtype = check_dtype_choice(dtype, "dtype", (BF16, np.float32))
    c = host_data(cos, "cos")
    s = host_data(sin, "sin")
    check_array(c, "cos", dtype=np.float32, ndim=2, layout="[T, d/2]")
    check_array(s, "sin", dtype=np.float32, shape=c.shape, layout="[T, d/2]")
    c2, s2 = np.concatenate([c, c], axis=1), np.concatenate([s, s], axis=1)
    if np.dtype(dtype) == BF16:
        return to_bf16(c2), to_bf16(s2)
    return c2, s2


def _table(t, name: str, rows: int, d: int, pairing: str) -> np.ndarray:
    check_array(t, name, dtype=(np.float32, BF16), ndim=2, layout="[T, d/2] or [T, d]")
    shp = shape_of(t, name)
    widths = (d // 2,) if pairing == "interleaved" else (d // 2, d)
    if shp[0] != rows or shp[1] not in widths:
        want = " or ".join(f"[{rows}, {w}]" for w in widths)
        raise ValueError(f"{name}: expected shape {want} for pairing {pairing!r}, got {shp}")
    a = host_data(t, name).astype(np.float32)
    if pairing != "interleaved" and shp[1] == d // 2:
        a = np.concatenate([a, a], axis=1)
    return a


def apply_rope(x, cos, sin, *, pairing: str) -> np.ndarray:
    """Rotate the last axis of ``x [T, ..., d]`` (BF16 or FP32) by the angles of row ``t``.

    ``cos``/``sin``: FP32 or BF16, ``[T, d/2]`` (one value per pair) or, for ``"halves"`` and
    ``"deinterleave"``, ``[T, d]`` read element by element (``out[j] = x[j]*cos[j] -
    x[j+d/2]*sin[j]``, ``out[j+d/2] = x[j+d/2]*cos[j+d/2] + x[j]*sin[j+d/2]``), as pypto-gym's
    prolog reads its ``[T, 64]`` inputs. Returns ``x``'s shape and dtype (one rounding at the
    end); see the module docstring for the pairings and the FP32 operation order.
    """
    check_choice(pairing, "pairing", PAIRINGS)
    check_array(x, "x", dtype=(BF16, np.float32))
    shp = shape_of(x, "x")
    if len(shp) < 2 or shp[-1] < 2 or shp[-1] % 2:
        raise ValueError(f"x: expected shape [T, ..., d] with an even d >= 2, got {shp}")
    d, h = shp[-1], shp[-1] // 2
    c = _table(cos, "cos", shp[0], d, pairing)
    s = _table(sin, "sin", shp[0], d, pairing)
    xa = host_data(x, "x")
    x32 = xa.astype(np.float32)
    bshape = (shp[0],) + (1,) * (len(shp) - 2) + (c.shape[1],)
    c, s = c.reshape(bshape), s.reshape(bshape)
    if pairing == "interleaved":
        a, b = x32[..., 0::2], x32[..., 1::2]
        out = np.empty_like(x32)
        out[..., 0::2] = a * c - b * s
        out[..., 1::2] = a * s + b * c
    else:
        if pairing == "deinterleave":
            x32 = np.concatenate([x32[..., 0::2], x32[..., 1::2]], axis=-1)
        a, b = x32[..., :h], x32[..., h:]
        out = np.concatenate(
            [a * c[..., :h] - b * s[..., :h], b * c[..., h:] + a * s[..., h:]], axis=-1
        )
    return to_bf16(out) if xa.dtype == BF16 else out


__all__ = [
    "DEEPSEEK_V32_ROPE",
    "MAX_TABLE_SEQ_LEN",
    "PAIRINGS",
    "apply_rope",
    "halves_table",
    "yarn_inv_freq",
    "yarn_rope_table",
    "yarn_softmax_mscale",
]
