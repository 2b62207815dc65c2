"""DeepSeek-V3.2 MLA prolog: hidden states -> queries, the normalised q, and the new latent
cache rows. The contract is :mod:`tilesim.shared.mla_prolog`, the full page
``docs/ops/mla_prolog.md``.

Stages (``T`` tokens; rounding points in capitals; sums of products are
:func:`~tilesim.reference.util.arith.matmul_fp32` with one K tile, i.e. the exact sum rounded once
to FP32, and row sums :func:`~tilesim.reference.util.arith.rowsum_fp32`)::

    q_a  = BF16(linear(x, w_dq))                                      [T, 1536]
    qn   = BF16(rms_norm(q_a) * gamma_cq)                             rms_form, rms_eps
    INT8 q_b:  q_norm, s = int8_gym(qn) per token;                    q_norm INT8, s FP32 [T, 1]
               q_b = BF16(FP32(int32 q_norm @ w_uq_qr) * s * w_scale)
    else:      q_norm = qn; q_b = BF16(linear(qn, w_uq_qr))
    query_nope = BF16(FP32(q_b[:, h, :128] @ w_uk[h]))                [T, 128, 512]
    query_rope = rope(q_b[:, h, 128:], cos, sin, rope_pairing)         BF16 [T, 128, 64]
    kv_a = BF16(linear(x, w_dkv_kr)); kvn = BF16(rms_norm(kv_a[:, :512]) * gamma_ckv)
    codes, scales = kv_quant(kvn) per 128 values                      INT8/FP8 [T, 512], FP32 [T, 4]
    kr   = rope(kv_a[:, 512:], cos, sin, rope_pairing)                 BF16 [T, 64]
    cache rows slot_mapping[t] (>= 0) <- (codes, kr, scales) in cache_layout

``linear``: ``"bf16"`` is ``BF16(FP32(x @ w))``; ``"fp8_block"`` is DeepSeek's ``act_quant``
(UE8M0) of the activation and ``fp8_gemm``: per 128-deep K block, ``P = FP32(a_k @ w_k)``, ``S
= FP32(sa * sb)`` and, with ``fp8_promotion="fma"`` (the default, DeepSeek's kernel as nvcc
contracts it), ``acc = FP32(acc + P * S)`` (one rounding), with ``"two_roundings"`` ``acc =
FP32(acc + FP32(P * S))``; then BF16. ``int8_gym`` per group of ``n`` values:
``s = FP32(FP32(1 / amax) * 127)`` (torch's ``127 / amax``), codes
``int8(trunc(fp16(int32(rint(FP32(v * s))))))``, dequant scale ``FP32(1 / s)`` (an all-zero
group gives codes 0 and scale 0).

The caches are never written: the result holds updated copies in the caller's shapes (only
the rows named by ``slot_mapping`` differ from the inputs, byte for byte).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
from tilesim.reference.util.arith import block_scaled_matmul_fp32, matmul_fp32, rowsum_fp32
from tilesim.reference.util.numerics import quantize_nonfinite, quiet_numpy, warn_stage
from tilesim.shared import mla_prolog as contract
from tilesim.shared.casts import FP8_E4M3_MAX, to_bf16, to_fp8_e4m3
from tilesim.shared.layouts.mla_cache import (
    NOPE,
    NSCALES,
    ROPE,
    is_packed,
    pack_kv_split,
    pack_rows,
)
from tilesim.shared.mla_prolog import BLOCK, HEADS, KV_LORA, Q_HEAD, QK_NOPE, MlaPrologOutputs
from tilesim.shared.quant import (
    _ue8m0,
    e4m3_to_fp32,
    quant_int8_gym,
    quantize_latent_fp8,
    quantize_latent_fp8_ue8m0,
    quantize_latent_int8,
)
from tilesim.shared.rope import apply_rope
from tilesim.shared.trace import emit, emit_stage
from tilesim.shared.validate import host_data, same_kind

F32 = np.float32
OP = "mla_prolog"


# ----------------------------------------------------------------------------- quantizers
def act_quant_deepseek(v) -> tuple[np.ndarray, np.ndarray]:
    """DeepSeek's ``act_quant(v, 128, "ue8m0")`` of FP32 ``v [R, 128*g]``: ``amax = max(max|v|,
    1e-4)``, ``s = 2^ceil(log2(FP32(amax * FP32(1/448))))`` (exact), codes ``e4m3(clamp(v / s,
    +-448))`` -> ``(codes [R, 128*g], s FP32 [R, g])``."""
    g = np.asarray(v, dtype=F32).reshape(v.shape[0], -1, BLOCK)
    amax = np.maximum(np.abs(g).max(axis=-1), F32(1e-4))
    s = _ue8m0(amax * F32(1.0 / FP8_E4M3_MAX))
    codes = to_fp8_e4m3(g / s[..., None], saturate=True)
    return codes.reshape(v.shape), s


def _latent_rule(rule: str):
    if rule == "int8_gym":
        return lambda v: quant_int8_gym(v, NOPE // NSCALES)
    if rule == "fp8_ue8m0_deepseek":
        return lambda v: act_quant_deepseek(v.astype(F32))
    return {
        "int8_seeds": quantize_latent_int8,
        "fp8_ue8m0_flashmla": quantize_latent_fp8_ue8m0,
        "fp8_amax": quantize_latent_fp8,
    }[rule]


def _latent_quant(kvn: np.ndarray, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """``(codes, scales)`` of ``rule`` per 128 values; a group holding NaN / inf (an overflow
    upstream) gets :func:`~tilesim.reference.util.numerics.quantize_nonfinite`'s outcome."""
    return quantize_nonfinite(_latent_rule(rule), kvn, NOPE // NSCALES)


# ----------------------------------------------------------------------------- stages
def linear(a, w, scale, kind: str, promotion: str = "fma") -> np.ndarray:
    """``BF16`` result of one projection ``a [R, K] @ w [K, N]`` (``kind`` ``"bf16"`` or
    ``"fp8_block"``; module docstring). ``promotion``: the FP8 K-block promotion of
    :func:`~tilesim.reference.util.arith.block_scaled_matmul_fp32` (``"fma"`` or
    ``"two_roundings"``; unused for BF16)."""
    if kind == "bf16":
        return to_bf16(matmul_fp32(a, w, k_tile=None))
    codes, sa = act_quant_deepseek(np.asarray(a, dtype=F32))
    a32, w32 = e4m3_to_fp32(codes), e4m3_to_fp32(w)
    return to_bf16(block_scaled_matmul_fp32(a32, sa, w32, scale, block=BLOCK, promotion=promotion))


def rms_norm(v, gamma, form: str, eps: np.float32) -> np.ndarray:
    """BF16 ``rms_norm(v) * gamma`` of BF16 ``v [R, n]`` in ``form`` (``"gym_golden"``:
    ``x / sqrt(sum(x*x * FP32(1/n)) + eps)``; ``"gym_kernel"``: the same mean, ``x * FP32(1 /
    sqrt(.))``; ``"deepseek"``: ``FP32(sum(x*x)) / n``, ``x * FP32(1 / sqrt(. + eps))``)."""
    x = np.asarray(v).astype(F32)
    n = x.shape[-1]
    if form == "deepseek":
        ms = rowsum_fp32(x * x) / F32(n)
    else:
        ms = rowsum_fp32((x * x) * F32(1.0 / n))
    root = np.sqrt(ms + eps)  # [R, 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        y = x / root if form == "gym_golden" else x * (F32(1) / root)
    return to_bf16(y * np.asarray(gamma).astype(F32)[None, :])


def _q_b(qn, ins, kind: str, promotion: str):
    if kind != "int8_channel":
        scale = None if kind == "bf16" else host_data(ins.w_uq_qr_scale, "w_uq_qr_scale")
        return qn, None, linear(qn, host_data(ins.w_uq_qr, "w_uq_qr"), scale, kind, promotion)
    codes, qs = quantize_nonfinite(lambda v: quant_int8_gym(v, v.shape[1]), qn, qn.shape[1])
    w = host_data(ins.w_uq_qr, "w_uq_qr")
    acc = (codes.astype(np.float64) @ w.astype(np.float64)).astype(F32)  # exact int32, RNE
    ws = host_data(ins.w_uq_qr_scale, "w_uq_qr_scale").reshape(1, -1)
    return codes, qs, to_bf16((acc * qs) * ws)


def _queries(a, ins, trace):
    x = host_data(ins.x, "x")
    sc = {k: (None if a.linears[k] == "bf16" else host_data(v, n))
          for k, v, n in (("q_a", ins.w_dq_scale, "w_dq_scale"),
                          ("kv_a", ins.w_dkv_kr_scale, "w_dkv_kr_scale"))}  # fmt: skip
    q_a = linear(x, host_data(ins.w_dq, "w_dq"), sc["q_a"], a.linears["q_a"], a.fp8_promotion)
    _emit(trace, "q_a", q_a, 2 * a.tokens * x.shape[1] * q_a.shape[1], "x @ w_dq")
    warn_stage(OP, "q_a", f"x @ w_dq{_scale_text(a, 'q_a', 'w_dq')}", q_a)
    qn = rms_norm(q_a, host_data(ins.gamma_cq, "gamma_cq"), a.rms_form, a.rms_eps)
    _emit(trace, "q_norm", qn, 0, "rms_norm(q_a) * gamma_cq")
    warn_stage(OP, "q_norm", f"rms_norm(q_a) * gamma_cq, rms_eps={float(a.rms_eps)!r}", qn, q_a,
               zero=True)  # fmt: skip
    q_norm, q_scale, q_b = _q_b(qn, ins, a.linears["q_b"], a.fp8_promotion)
    if q_scale is not None:
        _emit(trace, "q_quant", q_scale, 0, "per-token INT8 of q_norm (dequant scale)")
        warn_stage(OP, "q_quant", "per-token INT8 of q_norm: codes, q_norm_scale",
                   (q_norm, q_scale), qn, zero=True)  # fmt: skip
    _emit(trace, "q_b", q_b, 2 * a.tokens * qn.shape[1] * q_b.shape[1], "q_norm @ w_uq_qr")
    warn_stage(OP, "q_b", f"q_norm @ w_uq_qr{_scale_text(a, 'q_b', 'w_uq_qr')}", q_b,
               (qn,) if q_scale is None else (qn, q_scale))  # fmt: skip
    q = q_b.reshape(a.tokens, HEADS, Q_HEAD)
    w_uk = host_data(ins.w_uk, "w_uk")
    nope = matmul_fp32(q[:, :, :QK_NOPE].transpose(1, 0, 2), w_uk, k_tile=None)
    query_nope = to_bf16(nope).transpose(1, 0, 2).copy()
    _emit(trace, "absorb", query_nope, 2 * a.tokens * HEADS * QK_NOPE * KV_LORA,
          "q_nope @ w_uk per head: query_nope")  # fmt: skip
    warn_stage(OP, "absorb", "q_b's nope @ w_uk: query_nope", query_nope, q_b)
    cos, sin = host_data(ins.cos, "cos"), host_data(ins.sin, "sin")
    query_rope = apply_rope(q[:, :, QK_NOPE:], cos, sin, pairing=a.rope_pairing)
    _emit(trace, "q_rope", query_rope, 0, "rope(q_pe): query_rope")
    warn_stage(OP, "q_rope", "rope of q_b's rope part, cos, sin: query_rope", query_rope, q_b)
    kv_a = linear(x, host_data(ins.w_dkv_kr, "w_dkv_kr"), sc["kv_a"], a.linears["kv_a"],
                  a.fp8_promotion)  # fmt: skip
    _emit(trace, "kv_a", kv_a, 2 * a.tokens * x.shape[1] * kv_a.shape[1], "x @ w_dkv_kr")
    warn_stage(OP, "kv_a", f"x @ w_dkv_kr{_scale_text(a, 'kv_a', 'w_dkv_kr')}", kv_a)
    return query_nope, query_rope, q_norm, q_scale, kv_a


#: the traced stages in pipeline order (a record's lane ``{"stage": j}`` is stage ``j``;
#: ``q_quant``: the INT8 q_b path only)
TRACE_STAGES = ("q_a", "q_norm", "q_quant", "q_b", "absorb", "q_rope", "kv_a", "kv_norm",
                "kv_quant", "k_rope", "cache_write")  # fmt: skip


def _scale_text(a, linear: str, w: str) -> str:
    """`` (scale w_scale)`` for a scaled linear's message, nothing for a BF16 one."""
    return "" if a.linears[linear] == "bf16" else f" (scale {w}_scale)"


def _emit(trace, stage: str, value, flop: int, what: str) -> None:
    emit_stage(trace, OP, TRACE_STAGES.index(stage), stage, value, flop=flop, what=what)


def _emit_writes(trace, slots: np.ndarray) -> None:
    """The cache write, one record per token ``t`` (step ``t``, ``key_range (t, t+1)``):
    ``keys_used`` 1 when its row is written, ``extra["slot"]`` its cache row (-1: skipped)."""
    lane = {"stage": TRACE_STAGES.index("cache_write")}
    for t, slot in enumerate(slots.tolist() if trace is not None else ()):
        emit(trace, OP, lane, t, (t, t + 1), keys_used=int(slot >= 0), stage="cache_write",
             slot=int(slot))  # fmt: skip


def _write_cache(a, ins, codes, kr, scales):
    """Updated copies of the caches with the live tokens' rows written (module docstring)."""
    live = contract.host_plan(a)
    rows = a.slot_mapping[live]
    if is_packed(a.cache_layout):
        out = np.array(host_data(ins.kv_cache, "kv_cache"), copy=True)
        if live.size:
            out[rows] = pack_rows(codes[live], kr[live], scales[live], a.cache_layout)
        return out, None, None
    names = ("kv_cache", "kr_cache", "kv_scale_cache")
    outs = []
    fields = pack_kv_split(codes[live], kr[live], scales[live])
    for name, width, field in zip(names, (NOPE, ROPE, NSCALES), fields, strict=True):
        src = host_data(getattr(ins, name), name)
        flat = np.array(src, copy=True).reshape(-1, width)
        flat[rows] = field
        outs.append(flat.reshape(src.shape))
    return tuple(outs)


@quiet_numpy
def mla_prolog(
    x,
    w_dq,
    w_uq_qr,
    w_uq_qr_scale,
    w_uk,
    w_dkv_kr,
    gamma_cq,
    gamma_ckv,
    cos,
    sin,
    slot_mapping,
    kv_cache,
    kr_cache=None,
    kv_scale_cache=None,
    w_dq_scale=None,
    w_dkv_kr_scale=None,
    *,
    path: str = "int8",
    rope_pairing: str | None = None,
    rms_form: str | None = None,
    rms_eps: float | None = None,
    kv_quant: str | None = None,
    cache_layout: str | None = None,
    fp8_promotion: str = "fma",
    trace: Callable[[dict], None] | None = None,
) -> MlaPrologOutputs:
    """The MLA prolog golden (module docstring; ``docs/ops/mla_prolog.md``).

    Args: the arrays of :func:`tilesim.shared.mla_prolog.prolog_inputs` and the switches of
    :func:`~tilesim.shared.mla_prolog.prolog_keywords` (``path="int8"``: pypto-gym's
    ``mla_prolog_quant`` golden; ``"fp8"``: DeepSeek's reference with its FP8 KV-cache
    simulation). ``trace``: called once per stage of :data:`TRACE_STAGES` in pipeline order
    with a :func:`~tilesim.shared.trace.emit_stage` record (lane ``{"stage": j}``,
    ``key_range`` the tokens, the matmul FLOPs, each token's max ``|result|``), then once per
    token for the cache write (its slot, ``-1`` skipped).

    Returns :class:`MlaPrologOutputs` (NumPy arrays, or CPU torch tensors when ``x`` is one).
    Every check runs before any work; no argument is written. Legal input that overflows on
    the way (a zero row with ``rms_eps = 0``, a square above the FP32 maximum) is computed
    through and reported by a :class:`~tilesim.reference.util.numerics.NumericsWarning` naming the
    stage (``docs/ops/mla_prolog.md``, "Bad input and overflow").
    """
    ins = SimpleNamespace(**{n: v for n, v in locals().items() if n != "trace"})  # the arguments
    a = contract.check_values(contract.check_meta(ins, **_switch_values(ins), trace=trace))
    return prolog_from_args(a, trace=trace)


@quiet_numpy
def prolog_from_args(a, *, trace: Callable[[dict], None] | None = None) -> MlaPrologOutputs:
    """:func:`mla_prolog` on already checked arguments (``a``: the
    :func:`tilesim.shared.mla_prolog.check_values` Args, its arrays in ``a.ins``): no check
    runs again. The layer step (:mod:`tilesim.reference.dsa_attention_step`) checks every
    stage's arguments once, before its first stage, and then calls this."""
    ins = a.ins
    query_nope, query_rope, q_norm, q_scale, kv_a = _queries(a, ins, trace)
    kvn = rms_norm(kv_a[:, :KV_LORA], host_data(ins.gamma_ckv, "gamma_ckv"), a.rms_form, a.rms_eps)
    _emit(trace, "kv_norm", kvn, 0, "rms_norm(kv_a[:, :512]) * gamma_ckv")
    warn_stage(OP, "kv_norm", f"rms_norm(kv_a[:, :512]) * gamma_ckv, rms_eps={float(a.rms_eps)!r}",
               kvn, kv_a[:, :KV_LORA], zero=True)  # fmt: skip
    codes, scales = _latent_quant(kvn, a.kv_quant)
    _emit(trace, "kv_quant", scales, 0, f"{a.kv_quant} latent quant (dequant scales)")
    warn_stage(OP, "kv_quant", f"{a.kv_quant} of the normed latent: codes and the scales "
               "written into the cache", (codes, scales), kvn, zero=True)  # fmt: skip
    cos, sin = host_data(ins.cos, "cos"), host_data(ins.sin, "sin")
    kr = apply_rope(kv_a[:, KV_LORA:], cos, sin, pairing=a.rope_pairing)
    _emit(trace, "k_rope", kr, 0, "rope(kv_a[:, 512:]): kr")
    warn_stage(OP, "k_rope", "rope of kv_a[:, 512:], cos, sin: the cached rope", kr,
               kv_a[:, KV_LORA:])  # fmt: skip
    caches = _write_cache(a, ins, codes, kr, scales)
    _emit_writes(trace, np.asarray(a.slot_mapping))
    outs = (query_nope, query_rope, q_norm, q_scale) + tuple(caches)
    return MlaPrologOutputs(*(None if o is None else same_kind(o, ins.x) for o in outs))


def _switch_values(ins) -> dict:
    return {k: getattr(ins, k) for k in _SWITCHES}


_SWITCHES = ("path", "rope_pairing", "rms_form", "rms_eps", "kv_quant", "cache_layout",
             "fp8_promotion")  # fmt: skip


__all__ = ["MlaPrologOutputs", "act_quant_deepseek", "mla_prolog", "prolog_from_args"]  # fmt: skip
