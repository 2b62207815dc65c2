"""Independent float64 oracle of the DeepSeek-V3.2 lightning-indexer prolog
(``dsa_indexer_prolog``), written from the math, not from the golden.

No ``tilesim.reference`` or ``tilesim.shared`` import: one token at a time in float64 NumPy,
the Hadamard matrix from its closed form ``(-1)^popcount(i & j) / sqrt(128)``, the RoPE pairs
written out by index, LayerNorm as ``(v - mean) / sqrt(var + eps) * gamma + beta``. The only
quantizations kept are the ones that are part of a path's math: the INT8 path's inputs are
already codes and scales (dequantized exactly here), and DeepSeek's FP8 ``Linear`` quantizes
its activation per 128 values to E4M3 with a power-of-two scale (done here with Python's
``math.frexp`` and one ml_dtypes cast from float64). No BF16 or FP32 rounding anywhere, and
the final q / k quantization is not applied: the oracle returns the real-valued rotated
``q [T, 64, 128]`` and ``k [T, 128]`` and the weights ``[T, 64]`` (FP8: without the q scale,
which the caller multiplies in), for a test to bound the golden's dequantized outputs.
"""

from __future__ import annotations

import math
import struct

import ml_dtypes
import numpy as np

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)


def hadamard_orthonormal(n: int = 128) -> np.ndarray:
    """``H_n / sqrt(n)`` from the closed form of the Sylvester matrix, float64."""
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    parity = np.vectorize(lambda v: bin(int(v)).count("1") % 2)(i & j)
    return np.where(parity == 1, -1.0, 1.0) / math.sqrt(n)


def _act_quant_dequant(a: np.ndarray) -> np.ndarray:
    """DeepSeek's FP8 ``Linear`` activation per 128 values (UE8M0 scale, amax floor 1e-4),
    dequantized: ``e4m3(v / s) * s`` in float64."""
    out = np.empty_like(a)
    for r in range(a.shape[0]):
        for g in range(0, a.shape[1], 128):
            v = a[r, g : g + 128]
            ratio = max(float(np.abs(v).max()), 1e-4) / 448.0
            m, e = math.frexp(ratio)
            s = 2.0 ** (e - 1 if m == 0.5 else e)  # 2^ceil(log2(ratio))
            codes = np.clip(v / s, -448, 448).astype(E4M3)
            out[r, g : g + 128] = codes.astype(np.float64) * s
    return out


def _fp8_linear(a: np.ndarray, w, w_scale) -> np.ndarray:
    w64 = np.asarray(w).astype(np.float64)
    s = np.asarray(w_scale, dtype=np.float64)
    deq = w64 * np.kron(s, np.ones((128, 128)))  # [K, N] dequantized weights
    return _act_quant_dequant(a) @ deq


def _rope(v: np.ndarray, cos_row, sin_row, pairing: str) -> np.ndarray:
    """Rotate the 64 rope values of one vector (or ``[heads, 64]``) in float64."""
    c = np.asarray(cos_row, dtype=np.float64)
    s = np.asarray(sin_row, dtype=np.float64)
    out = np.empty_like(v)
    for j in range(32):
        if pairing == "interleaved":  # pairs (2j, 2j+1), angle j
            a, b = v[..., 2 * j], v[..., 2 * j + 1]
            out[..., 2 * j] = a * c[j] - b * s[j]
            out[..., 2 * j + 1] = a * s[j] + b * c[j]
            continue
        lo, hi = j, j + 32  # halves: pairs (j, j + 32); a 64-wide table is read per element
        c_lo, s_lo = c[lo], s[lo]
        c_hi, s_hi = (c[hi], s[hi]) if c.size == 64 else (c[lo], s[lo])
        a, b = v[..., lo], v[..., hi]
        out[..., lo] = a * c_lo - b * s_lo
        out[..., hi] = b * c_hi + a * s_hi
    return out


def _layer_norm(v: np.ndarray, gamma, beta, eps: float) -> np.ndarray:
    mean = v.mean()
    var = ((v - mean) ** 2).mean()
    return (v - mean) / math.sqrt(var + eps) * np.asarray(gamma, np.float64) + np.asarray(
        beta, np.float64
    )


def oracle_prolog(inputs: dict, *, path="int8", rope_pairing="halves", eps=1e-6) -> dict:
    """``{"q": [T, 64, 128], "k": [T, 128], "weights": [T, 64]}`` float64 (module docstring)."""
    x = np.asarray(inputs["x"]).astype(np.float64)
    t = x.shape[0]
    if path == "int8":
        qn = np.asarray(inputs["q_norm"]).astype(np.float64)
        w = np.asarray(inputs["w_qb"]).astype(np.float64)
        q = (qn @ w) * np.asarray(inputs["q_norm_scale"], np.float64)
        q = q * np.asarray(inputs["w_qb_scale"], np.float64).reshape(1, -1)
        k = x @ np.asarray(inputs["w_k"]).astype(np.float64)
        hq = np.asarray(inputs["hadamard_q"]).astype(np.float64)
        hk = np.asarray(inputs["hadamard_k"]).astype(np.float64)
    else:
        q = _fp8_linear(np.asarray(inputs["q_norm"]).astype(np.float64), inputs["w_qb"],
                        inputs["w_qb_scale"])  # fmt: skip
        k = _fp8_linear(x, inputs["w_k"], inputs["w_k_scale"])
        hq = hk = hadamard_orthonormal(128)
    q = q.reshape(t, 64, 128)
    q_out = np.empty_like(q)
    k_out = np.empty((t, 128))
    for i in range(t):
        cr, sr = inputs["cos"][i], inputs["sin"][i]
        qi = q[i].copy()
        qi[:, :64] = _rope(qi[:, :64], cr, sr, rope_pairing)
        q_out[i] = qi @ hq
        ki = _layer_norm(k[i], inputs["ln_gamma"], inputs["ln_beta"], eps)
        ki[:64] = _rope(ki[:64], cr, sr, rope_pairing)
        k_out[i] = ki @ hk
    weights = (x @ np.asarray(inputs["w_proj"]).astype(np.float64)) / 8.0 / math.sqrt(128)
    return {"q": q_out, "k": k_out, "weights": weights}


def fp8_page_row(pages, slot: int, block_size: int) -> tuple[np.ndarray, float]:
    """Codes (float64 ``[128]``) and the FP32 scale of cache row ``slot`` of the FP8 pages,
    decoded from the bytes by hand (``struct``): codes at ``128 * offset`` of the page, the
    scale at ``128 * block_size + 4 * offset``."""
    page = np.asarray(pages)[slot // block_size].tobytes()
    off = slot % block_size
    codes = np.frombuffer(page[128 * off : 128 * (off + 1)], dtype=E4M3).astype(np.float64)
    (scale,) = struct.unpack(
        "<f", page[128 * block_size + 4 * off : 128 * block_size + 4 * off + 4]
    )
    return codes, scale
