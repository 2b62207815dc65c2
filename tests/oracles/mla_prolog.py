"""Float64 oracle of the DeepSeek-V3.2 MLA prolog, written from the math (docs/ops/mla_prolog.md),
not from the golden: every sum, norm and rotation in float64.

Stage outputs are BF16 tensors by definition (``q_a``, the normed q, ``q_b``, ``kv_a``, the
normed latent): the oracle stores each one in BF16 (:func:`_bf16`), as the data type of the
pipeline, and computes everything between two of them in float64. The other discrete steps
it keeps are the ones that define the data (they are not rounding noise): the INT8
per-token quantization of the normalised q and the FP8 activation / weight codes of
DeepSeek's FP8 linears, each recomputed here from its own float64 input with the rule's
formula (``round(v * 127 / amax)``; ``2^ceil(log2(amax / 448))`` and an E4M3 rounding).
RoPE rotates pairs by the angle ``atan2(sin, cos)`` of the given table, written as the 2 x 2
rotation in float64. Returns float64 arrays.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

F64 = np.float64


def _f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float32).astype(F64)


def _bf16(v: np.ndarray) -> np.ndarray:
    """Store a float64 stage output as BF16 (through FP32: the double rounding is ~2^-29 away
    from mattering) and read it back as float64."""
    return v.astype(np.float32).astype(ml_dtypes.bfloat16).astype(F64)


def _e4m3(v: np.ndarray) -> np.ndarray:
    return np.clip(v, -448, 448).astype(np.float32).astype(ml_dtypes.float8_e4m3fn).astype(F64)


def _fp8_act(v: np.ndarray) -> np.ndarray:
    """DeepSeek's activation quantization per 128 values, then dequantized (float64)."""
    g = v.reshape(v.shape[0], -1, 128)
    amax = np.maximum(np.abs(g).max(axis=-1, keepdims=True), 1e-4)
    s = 2.0 ** np.ceil(np.log2(amax / 448.0))
    return (_e4m3(g / s) * s).reshape(v.shape)


def _linear(a: np.ndarray, w, scale) -> np.ndarray:
    w64 = _f64(w)
    if scale is None:
        return a @ w64
    blk = np.repeat(np.repeat(_f64(scale), 128, axis=0), 128, axis=1)[
        : w64.shape[0], : w64.shape[1]
    ]
    return _fp8_act(a) @ (w64 * blk)


def _rms(v: np.ndarray, gamma, eps: float) -> np.ndarray:
    return v / np.sqrt((v * v).mean(axis=-1, keepdims=True) + eps) * _f64(gamma)


def _rope(v: np.ndarray, cos, sin, pairing: str) -> np.ndarray:
    """Rotate pairs of ``v [T, ..., 64]`` by the table's angles, in ``pairing``."""
    c, s = _f64(cos), _f64(sin)
    d = v.shape[-1]
    if c.shape[1] == d // 2:
        c, s = np.concatenate([c, c], 1), np.concatenate([s, s], 1)
    shape = (v.shape[0],) + (1,) * (v.ndim - 2) + (d,)
    c, s = c.reshape(shape), s.reshape(shape)
    if pairing == "interleaved":  # pair (2i, 2i+1) uses angle i: table entry i
        a, b = v[..., 0::2], v[..., 1::2]
        ci, si = c[..., : d // 2], s[..., : d // 2]
        out = np.empty_like(v)
        out[..., 0::2], out[..., 1::2] = a * ci - b * si, a * si + b * ci
        return out
    if pairing == "deinterleave":
        v = np.concatenate([v[..., 0::2], v[..., 1::2]], axis=-1)
    h = d // 2
    a, b = v[..., :h], v[..., h:]
    return np.concatenate([a * c[..., :h] - b * s[..., :h], b * c[..., h:] + a * s[..., h:]], -1)


def mla_prolog_oracle(inputs: dict, *, rope_pairing: str, rms_eps: float) -> dict:
    """``{"q_a", "qn", "q_norm_deq", "query_nope", "query_rope", "kvn", "kr"}`` in float64."""
    x = _f64(inputs["x"])
    q_a = _bf16(_linear(x, inputs["w_dq"], inputs.get("w_dq_scale")))
    qn = _bf16(_rms(q_a, inputs["gamma_cq"], rms_eps))
    w_uq = inputs["w_uq_qr"]
    if np.asarray(w_uq).dtype == np.int8:
        amax = np.abs(qn).max(axis=-1, keepdims=True)
        q_deq = np.round(qn * 127.0 / amax) * (amax / 127.0)
        q_b = _bf16(q_deq @ _f64(w_uq) * _f64(inputs["w_uq_qr_scale"]).reshape(1, -1))
    else:
        q_deq = qn
        q_b = _bf16(_linear(qn, w_uq, inputs.get("w_uq_qr_scale")))
    q = q_b.reshape(x.shape[0], 128, 192)
    query_nope = np.einsum("thd,hdc->thc", q[:, :, :128], _f64(inputs["w_uk"]))
    query_rope = _rope(q[:, :, 128:], inputs["cos"], inputs["sin"], rope_pairing)
    kv_a = _bf16(_linear(x, inputs["w_dkv_kr"], inputs.get("w_dkv_kr_scale")))
    kvn = _bf16(_rms(kv_a[:, :512], inputs["gamma_ckv"], rms_eps))
    kr = _rope(kv_a[:, 512:], inputs["cos"], inputs["sin"], rope_pairing)
    return {"q_a": q_a, "qn": qn, "q_norm_deq": q_deq, "query_nope": query_nope,
            "query_rope": query_rope, "kvn": kvn, "kr": kr}  # fmt: skip


def yarn_table_f64(positions, d: int = 64, theta: float = 1e4, factor: float = 40.0,
                   orig: int = 4096, beta_fast: float = 32, beta_slow: float = 1):  # fmt: skip
    """YaRN angles ``[T, d/2]`` in float64 from the formula (DeepSeek's rule, always scaled)."""

    def corr(r):
        return d * math.log(orig / (r * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = max(math.floor(corr(beta_fast)), 0), min(math.ceil(corr(beta_slow)), d - 1)
    f = theta ** -(np.arange(0, d, 2, dtype=F64) / d)
    ramp = np.clip((np.arange(d // 2, dtype=F64) - lo) / (hi - lo), 0, 1)
    f = f / factor * ramp + f * (1 - ramp)
    return np.asarray(positions, dtype=F64)[:, None] * f[None, :]
