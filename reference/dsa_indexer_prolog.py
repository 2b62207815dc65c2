"""DeepSeek-V3.2 lightning-indexer prolog: the index queries, their scales and weights, and the
new tokens' index keys written into the paged index-key cache (``docs/ops/dsa_indexer_prolog.md``;
the contract is :mod:`tilesim.shared.dsa_indexer_prolog`).

Per token ``t`` (``T`` tokens; ``H`` hidden, ``R`` q_lora_rank; rounding points in capitals;
``MM`` = :func:`~tilesim.reference.util.arith.matmul_fp32` with one K tile: the exact sum of the
exact products, rounded once to FP32; ``MMk`` = the same with K tiles of ``k_tile`` rows
when ``k_tile`` is given, the tile partials added in FP32 -- the device kernel's cube)::

    INT8 path (pypto-gym lightning_indexer_prolog_quant, its test golden):
      q    = FP32(int32 q_norm @ w_qb)            exact integer sum, one RNE rounding
      q    = BF16(FP32(q * q_norm_scale_t) * w_qb_scale_c)     two FP32 multiplies
      q    = [ROPE(q[:, h, :64]) | q[:, h, 64:]]              ROPE: shared/rope.py, -> BF16
      q    = BF16(MM(q, hadamard_q))                          the matrix input
      q, q_scale = quant_int8(q) per (t, h)                   f = FP32(FP32(1/amax) * 127),
                                                              codes rint(q * f), FP16(1/f)
      k    = MMk(x, w_k)                                      FP32, no BF16 rounding
      k    = BF16(LN(k))                                      LN below
      k    = BF16(MM([ROPE(k[:64]) | k[64:]], hadamard_k)); k, k_scale = quant_int8(k)
      w    = FP16(FP32(FP32(BF16(MMk(x, w_proj)) * 2^-3) * FP32(128^-0.5)))
    FP8 path (DeepSeek-V3.2-Exp inference/model.py Indexer, after the indexer-RoPE fix):
      q    = LIN8(q_norm, w_qb)                               BF16
      q    = HAD([ROPE(q[:, h, :64]) | q[:, h, 64:]])         HAD: FP32 FWHT * 128^-0.5 -> BF16
      q, q_scale = act_quant(q) per (t, h)                    E4M3, UE8M0 (or amax/448) scale
      k    = BF16(LN(LIN8(x, w_k)))                           BF16 into the LayerNorm
      k    = HAD([ROPE(k[:64]) | k[64:]]); k, k_scale = act_quant(k)
      w    = FP32(FP32(FP32(MMk(x, w_proj) * 2^-3) * q_scale) * FP32(128^-0.5))

``LN(v)`` (both paths; pypto-gym's golden form): ``mean = FP32(sum v) / 128``, ``d = v -
mean``, ``var = FP32(sum d*d) / 128``, ``y = d / sqrt(var + FP32(eps))``, ``y * gamma +
beta``; every element-wise step one FP32 operation, each row sum the exact sum rounded once.
``LIN8(a, W)`` (DeepSeek's ``fp8_gemm`` behind ``Linear``): ``a`` quantized per 128 values by
``act_quant`` (amax floor 1e-4, UE8M0 scales when ``ue8m0``), then per K block ``kb`` of 128,
``P = MM(a_kb, W_kb)``, ``S = FP32(sa_kb * sb_kb)`` and ``acc = FP32(acc + P * S)``, one
rounding (``fp8_promotion="fma"``, the default: the kernel's ``acc += partial * scale`` as
nvcc's default ``--fmad=true`` contracts it), or ``acc = FP32(acc + FP32(P * S))``
(``"two_roundings"``); BF16 at the end. The two agree when every ``P * S`` is exact in FP32
(power-of-two weight scales ``sb``, as UE8M0 checkpoints hold, away from underflow); with
``amax / 448`` weight scales they differ in a last bit on some elements.
``HAD`` is :func:`tilesim.shared.hadamard.hadamard_rotate`; ``act_quant`` is
:func:`tilesim.shared.quant.quantize_index_fp8`, ``quant_int8``
:func:`~tilesim.shared.quant.quantize_index_int8` with ``scale_rule="reciprocal"``.
``ROPE`` is :func:`tilesim.shared.rope.apply_rope` (``rope_pairing``: ``"halves"``, or
DeepSeek's pre-fix ``"interleaved"``). The reductions' order (the matmuls' and the row sums')
is modelled as one rounding of the exact sum; the public goldens leave it to the BLAS and
the kernels to the cube (the op page says what that costs).

The keys are written into copies of the caches at ``slot_mapping`` (``-1`` skipped) through
:mod:`tilesim.shared.layouts.index_cache`; no other cache row changes and the inputs are never
written.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
from tilesim.reference.util.arith import (
    F32,
    F64,
    block_scaled_matmul_fp32,
    matmul_fp32,
    rowsum_fp32,
)
from tilesim.reference.util.numerics import quantize_nonfinite, quiet_numpy, warn_stage
from tilesim.shared.casts import to_bf16
from tilesim.shared.dsa_indexer import INDEX_HEADS
from tilesim.shared.dsa_indexer_prolog import (
    FP8_BLOCK,
    QB_COLS,
    ROPE_DIM,
    Args,
    PrologResult,
    check_meta,
    check_values,
    host_plan,
    prolog_inputs,
)
from tilesim.shared.hadamard import hadamard_rotate
from tilesim.shared.layouts.index_cache import INDEX_DIM, fp8_page_views
from tilesim.shared.models import DEEPSEEK_V32
from tilesim.shared.quant import e4m3_to_fp32, quantize_index_fp8, quantize_index_int8
from tilesim.shared.rope import apply_rope
from tilesim.shared.trace import emit, emit_stage
from tilesim.shared.validate import host_array, same_kind

#: the names of the arrays (:func:`~tilesim.shared.dsa_indexer_prolog.prolog_inputs`)
_INPUTS = tuple(inspect.signature(prolog_inputs).parameters)

OP = "dsa_indexer_prolog"

F16 = np.dtype(np.float16)
#: columns of ``w_qb`` per pass of the INT8 q projection (bounds the float64 copy)
_QB_CHUNK = 1024
#: DeepSeek ``act_quant``'s amax floor inside ``Linear`` (``kernel.py``)
_LINEAR_AMAX_FLOOR = 1e-4
_HEAD_SCALE = np.float32(INDEX_HEADS**-0.5)  # 2^-3, exact
_SOFTMAX_SCALE = np.float32(INDEX_DIM**-0.5)  # FP32(128^-0.5)


# ----------------------------------------------------------------------------- projections
def _q_int8(ins, t: int) -> np.ndarray:
    """BF16 ``[T, 8192]``: ``BF16(FP32(FP32(int32 q_norm @ w_qb) * q_norm_scale) * w_scale)``."""
    qn = host_array(ins.q_norm, "q_norm").astype(F64)
    w = host_array(ins.w_qb, "w_qb")
    qs = host_array(ins.q_norm_scale, "q_norm_scale")  # FP32 [T, 1]
    ws = host_array(ins.w_qb_scale, "w_qb_scale").reshape(1, QB_COLS)
    out = np.empty((t, QB_COLS), dtype=F32)
    for c0 in range(0, QB_COLS, _QB_CHUNK):
        c1 = c0 + _QB_CHUNK
        # |sum| <= R * 128 * 128 < 2^53: the float64 product is the exact int32 sum
        acc = (qn @ w[:, c0:c1].astype(F64)).astype(F32)  # int32 -> FP32, one RNE rounding
        out[:, c0:c1] = (acc * qs) * ws[:, c0:c1]
    return to_bf16(out)


def _linear_fp8(a_bf16: np.ndarray, w, w_scale, ue8m0: bool, promotion: str) -> np.ndarray:
    """DeepSeek's FP8 ``Linear``: BF16 ``[T, N]`` from BF16 ``a [T, K]``, E4M3 ``w [K, N]``
    and FP32 block scales ``[K/128, N/128]`` (module docstring, ``LIN8``; ``promotion``: the
    K-block promotion, ``"fma"`` or ``"two_roundings"``)."""
    t, k = a_bf16.shape

    def quant(v):
        return quantize_index_fp8(v, ue8m0=ue8m0, amax_floor=_LINEAR_AMAX_FLOOR)

    # a NaN / inf block of ``a`` (a q_norm the layer step's MLA prolog overflowed): the
    # quantizer's IEEE outcome (reference/util/numerics.py); finite blocks: the same bits
    codes, sa = quantize_nonfinite(quant, a_bf16.reshape(t, k // FP8_BLOCK, FP8_BLOCK), FP8_BLOCK)
    a32 = e4m3_to_fp32(codes).reshape(t, k)
    w32 = e4m3_to_fp32(w)
    return to_bf16(block_scaled_matmul_fp32(a32, sa, w32, w_scale, block=FP8_BLOCK,
                                            promotion=promotion))  # fmt: skip


def _layer_norm(v32: np.ndarray, gamma, beta, eps: float) -> np.ndarray:
    """BF16 LayerNorm of FP32 rows ``[T, 128]`` (module docstring, ``LN``)."""
    n = np.float32(v32.shape[-1])
    mean = rowsum_fp32(v32) / n
    d = v32 - mean
    var = rowsum_fp32(d * d) / n
    y = d / np.sqrt(var + np.float32(eps))
    g = host_array(gamma, "ln_gamma").astype(F32)
    b = host_array(beta, "ln_beta").astype(F32)
    return to_bf16(y * g + b)


# ----------------------------------------------------------------------------- q and k
def _rope_half(v: np.ndarray, a: Args) -> np.ndarray:
    """``[ROPE(v[..., :64]) | v[..., 64:]]`` for BF16 ``v [T, ..., 128]``."""
    out = v.copy()
    out[..., :ROPE_DIM] = apply_rope(v[..., :ROPE_DIM], a.ins.cos, a.ins.sin,
                                     pairing=a.rope_pairing)  # fmt: skip
    return out


def _rotate(v: np.ndarray, a: Args, hadamard) -> np.ndarray:
    """The Hadamard rotation of BF16 ``v [..., 128]`` -> BF16: the matrix input (INT8) or the
    fast transform times ``128^-0.5`` (FP8)."""
    if hadamard is None:
        return hadamard_rotate(v)
    h = host_array(hadamard, "hadamard").astype(F32)
    return to_bf16(matmul_fp32(v.astype(F32), h, k_tile=None))


def _quant(v: np.ndarray, a: Args) -> tuple[np.ndarray, np.ndarray]:
    """The path's quantizer per 128-vector; a vector holding NaN / inf (an overflow upstream)
    gets :func:`~tilesim.reference.util.numerics.quantize_nonfinite`'s outcome, never an error."""
    if a.path == "int8":
        rule = lambda g: quantize_index_int8(g, amax_floor=a.amax_floor,  # noqa: E731
                                             scale_rule="reciprocal")  # fmt: skip
    else:
        rule = lambda g: quantize_index_fp8(g, ue8m0=a.ue8m0, amax_floor=a.amax_floor)  # noqa: E731
    return quantize_nonfinite(rule, v, INDEX_DIM)


def _queries(a: Args, trace=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(codes [T, 64, 128], scales [T, 64], rotated BF16 q)``."""
    ins = a.ins
    if a.path == "int8":
        q = _q_int8(ins, a.rows)
        had = ins.hadamard_q
    else:
        qn = host_array(ins.q_norm, "q_norm")
        q = _linear_fp8(qn, host_array(ins.w_qb, "w_qb"),
                        host_array(ins.w_qb_scale, "w_qb_scale"), a.ue8m0,
                        a.fp8_promotion)  # fmt: skip
        had = None
    _stage(trace, "q_linear", q, 2 * a.rows * a.rank * QB_COLS, "q_norm @ w_qb")
    warn_stage(OP, "q_linear", "q_norm @ w_qb (scales "
               f"{'q_norm_scale, ' if a.path == 'int8' else ''}w_qb_scale)", q)  # fmt: skip
    q_lin = q
    q = _rope_half(q.reshape(a.rows, INDEX_HEADS, INDEX_DIM), a)
    _stage(trace, "q_rope", q, 0, "rope of each head's first 64")
    q_rope = q
    warn_stage(OP, "q_rope", "rope of each head's first 64, cos, sin", q, q_lin)
    q = _rotate(q, a, had)
    _stage(trace, "q_hadamard", q, _hadamard_flop(a, INDEX_HEADS), "Hadamard per head")
    warn_stage(OP, "q_hadamard", _had_text(a, "hadamard_q"), q, q_rope)
    codes, scales = _quant(q, a)
    _stage(trace, "q_quant", scales, 0, "per-head quant (scale)")
    warn_stage(OP, "q_quant", "per-head quant of q: codes, q_scale", (codes, scales), q,
               zero=True)  # fmt: skip
    return codes, scales, q


def _keys(a: Args, trace=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(codes [T, 128], scales [T], rotated BF16 k)``."""
    ins = a.ins
    x = host_array(ins.x, "x")
    if a.path == "int8":
        k32 = matmul_fp32(x, host_array(ins.w_k, "w_k"), k_tile=a.k_tile)  # FP32, kept
        had = ins.hadamard_k
    else:
        kb = _linear_fp8(x, host_array(ins.w_k, "w_k"), host_array(ins.w_k_scale, "w_k_scale"),
                         a.ue8m0, a.fp8_promotion)  # fmt: skip
        k32 = kb.astype(F32)  # BF16 values into the LayerNorm
        had = None
    _stage(trace, "k_linear", k32, 2 * a.rows * a.hidden * INDEX_DIM, "x @ w_k")
    warn_stage(OP, "k_linear", f"x @ w_k{'' if had is not None else ' (scale w_k_scale)'}", k32)
    k = _layer_norm(k32, ins.ln_gamma, ins.ln_beta, a.eps)
    _stage(trace, "k_layernorm", k, 0, "LayerNorm(k) * ln_gamma + ln_beta")
    warn_stage(OP, "k_layernorm", f"LayerNorm(k) * ln_gamma + ln_beta, eps={a.eps:g}", k, k32)
    k_ln = k
    k = _rope_half(k, a)
    _stage(trace, "k_rope", k, 0, "rope of the first 64")
    warn_stage(OP, "k_rope", "rope of the key's first 64, cos, sin", k, k_ln)
    k_rope = k
    k = _rotate(k, a, had)
    _stage(trace, "k_hadamard", k, _hadamard_flop(a, 1), "Hadamard")
    warn_stage(OP, "k_hadamard", _had_text(a, "hadamard_k"), k, k_rope)
    codes, scales = _quant(k, a)
    _stage(trace, "k_quant", scales, 0, "per-token quant (scale)")
    warn_stage(OP, "k_quant", "per-token quant of the key: the codes and scale written into "
               "the cache", (codes, scales), k, zero=True)  # fmt: skip
    return codes, scales, k


def _weights(a: Args, q_scale: np.ndarray, trace=None) -> np.ndarray:
    x = host_array(a.ins.x, "x")
    w = matmul_fp32(x, host_array(a.ins.w_proj, "w_proj"), k_tile=a.k_tile)
    if a.path == "int8":
        w = to_bf16(w).astype(F32) * _HEAD_SCALE
        out = (w * _SOFTMAX_SCALE).astype(F16)
    else:
        out = ((w * _HEAD_SCALE) * q_scale) * _SOFTMAX_SCALE
    _stage(trace, "weights", out, 2 * a.rows * a.hidden * INDEX_HEADS, "x @ w_proj, scaled")
    warn_stage(OP, "weights", "x @ w_proj, scaled" + (" into FP16" if a.path == "int8" else
               " by q_scale"), out, () if a.path == "int8" else q_scale)  # fmt: skip
    return out


# ----------------------------------------------------------------------------- trace
#: the traced stages in pipeline order (a record's lane ``{"stage": j}`` is stage ``j``)
TRACE_STAGES = ("q_linear", "q_rope", "q_hadamard", "q_quant", "k_linear", "k_layernorm",
                "k_rope", "k_hadamard", "k_quant", "weights", "cache_write")  # fmt: skip


def _stage(trace, name: str, value, flop: int, what: str) -> None:
    emit_stage(trace, "dsa_indexer_prolog", TRACE_STAGES.index(name), name, value, flop=flop,
               what=what)  # fmt: skip


def _had_text(a: Args, name: str) -> str:
    """The arguments of a rotation stage, for a message."""
    return f"the rotation by {name}" if a.path == "int8" else "the fast Hadamard transform"


def _hadamard_flop(a: Args, vectors: int) -> int:
    """The rotation of ``vectors`` 128-vectors per token as the kernels run it (INT8: a
    128 x 128 matmul, 2 per multiply-add; FP8: the fast transform's 7 adds per value)."""
    per = 2 * INDEX_DIM * INDEX_DIM if a.path == "int8" else 7 * INDEX_DIM
    return a.rows * vectors * per


# ----------------------------------------------------------------------------- cache write
def _write_cache(a: Args, codes: np.ndarray, scales: np.ndarray):
    """Copies of the caches with the written tokens' rows replaced (the only rows that
    change); ``(k_cache, k_scale)`` (FP8: a copy of the scales inside the new pages)."""
    plan = host_plan(a)
    rows = np.flatnonzero(plan.written)
    blk, off = plan.block[rows], plan.offset[rows]
    cache = host_array(a.ins.k_cache, "k_cache").copy()
    if a.path == "int8":
        kscale = host_array(a.ins.k_scale, "k_scale").copy()
        cache[blk, off] = codes[rows]
        kscale[blk, off] = scales[rows]
        return cache, kscale
    views = fp8_page_views(cache, block_size=a.block_size)  # the one place of the offsets
    views.codes[blk, off] = codes[rows]
    views.scales[blk, off] = scales[rows]
    return cache, views.scales.copy()  # the pages' scales, a copy to read


def _trace(trace: Callable, a: Args, q_rot: np.ndarray, k_rot: np.ndarray) -> None:
    """The cache write, one record per token (see :func:`dsa_indexer_prolog`)."""
    plan, lane = host_plan(a), {"stage": TRACE_STAGES.index("cache_write")}
    qa = np.abs(q_rot.astype(F32)).max(axis=-1)
    ka = np.abs(k_rot.astype(F32)).max(axis=-1)
    for t in range(a.rows):
        emit(trace, "dsa_indexer_prolog", lane, t, (t, t + 1), keys_used=int(plan.written[t]),
             row_max=qa[t], stage="cache_write", slot=int(a.slot_mapping[t]),
             k_amax=float(ka[t]), block=int(plan.block[t]),
             offset=int(plan.offset[t]))  # fmt: skip


@quiet_numpy
def dsa_indexer_prolog(
    x,
    q_norm,
    w_qb,
    w_k,
    w_proj,
    ln_gamma,
    ln_beta,
    cos,
    sin,
    k_cache,
    slot_mapping,
    q_norm_scale=None,
    w_qb_scale=None,
    w_k_scale=None,
    hadamard_q=None,
    hadamard_k=None,
    k_scale=None,
    *,
    path: str = "int8",
    rope_pairing: str = "halves",
    eps: float = 1e-6,
    ue8m0: bool = True,
    amax_floor: float | None = None,
    block_size: int = DEEPSEEK_V32.block_size,
    fp8_promotion: str = "fma",
    k_tile: int | None = None,
    trace: Callable[[dict], None] | None = None,
):
    """Lightning-indexer prolog golden (both paths; module docstring for the arithmetic).

    Args (declared once for the golden and a kernel wrapper:
    :func:`tilesim.shared.dsa_indexer_prolog.prolog_inputs` and ``prolog_keywords``):
        x, q_norm, w_qb, w_k, w_proj, ln_gamma, ln_beta, cos, sin, k_cache, slot_mapping and
            the path's optional arrays (``q_norm_scale``, ``w_qb_scale``, ``w_k_scale``,
            ``hadamard_q``, ``hadamard_k``, ``k_scale``): see the contract module.
        path: ``"int8"`` (pypto-gym) or ``"fp8"`` (DeepSeek); rope_pairing: ``"halves"`` or the
            pre-fix ``"interleaved"``; eps: the LayerNorm epsilon; ue8m0: FP8 power-of-two
            scales; amax_floor: the q/k quantizers' floor (``None``: the path's);
            block_size: tokens per cache block.
        trace: called once per stage of :data:`TRACE_STAGES` but the last, in pipeline
            order, with a :func:`tilesim.shared.trace.emit_stage` record (lane ``{"stage":
            j}``, the stage's matmul FLOPs, each token's max ``|result|``), then once per
            token for the cache write: lane ``{"stage": 10}``, ``step`` = token,
            ``keys_used`` = 1 when its key is written, ``row_max`` = FP32 ``[64]`` max
            ``|q|`` per head after the rotation; ``extra``: ``stage`` (``"cache_write"``),
            ``slot``, ``block``, ``offset`` (``-1`` when skipped), ``k_amax``.

    Returns:
        :class:`PrologResult` ``(q, q_scale, weights, k_cache, k_scale)``; the caches are
        updated copies (only the rows of the written slots differ from the inputs). Same kind
        (NumPy / torch) as ``x``; inputs are never modified. Legal input that overflows on
        the way is computed through and reported by a
        :class:`~tilesim.reference.util.numerics.NumericsWarning` naming the stage
        (``docs/ops/dsa_indexer_prolog.md``, "Bad input and overflow").
    """
    ins = SimpleNamespace(**{n: v for n, v in locals().items() if n in _INPUTS})  # the arrays
    a = check_values(check_meta(
        ins, path=path, rope_pairing=rope_pairing, eps=eps, ue8m0=ue8m0, amax_floor=amax_floor,
        block_size=block_size, trace=trace, fp8_promotion=fp8_promotion, k_tile=k_tile,
    ))  # fmt: skip
    return prolog_from_args(a, trace=trace)


@quiet_numpy
def prolog_from_args(a: Args, *, trace: Callable[[dict], None] | None = None) -> PrologResult:
    """:func:`dsa_indexer_prolog` on already checked arguments (``a``: the
    :func:`tilesim.shared.dsa_indexer_prolog.check_values` Args, its arrays in ``a.ins``): no
    check runs again, so a ``q_norm`` an earlier stage of the layer step computed (NaN / inf
    after an overflow it warned about) is computed through, not refused."""
    ins = a.ins
    q_codes, q_scale, q_rot = _queries(a, trace)
    k_codes, k_scale, k_rot = _keys(a, trace)
    weights = _weights(a, q_scale, trace)
    cache, kscale = _write_cache(a, k_codes, k_scale)
    if trace is not None:
        _trace(trace, a, q_rot, k_rot)
    like = ins.x
    out = PrologResult(q_codes, q_scale, weights, cache, kscale)
    return PrologResult(*(same_kind(v, like) for v in out))


__all__ = ["PrologResult", "dsa_indexer_prolog", "prolog_from_args"]
