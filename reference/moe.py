"""MiniMax M2.7 / M3 routed-expert FFN as one grouped GEMM — the golden of the PyPTO kernel.

For every expert ``e`` with tokens, ``y = W2_e . act(W13_e . x)`` over the rows
``expert_cumsum[e]:expert_cumsum[e+1]`` of ``sorted_tokens``. The golden walks the kernel's loop
nest (hicann/pypto-gym, src/pypto_gym/ops/pypto_tensor/minimax/minimax_grouped_gemm_impl.py;
docs/ops/moe.md) and keeps every loop that changes the numbers:

1. expert loop over ``expert_cumsum`` (experts with no tokens are skipped);
2. the expert's token range split into chunks exactly as ``pypto.loop_unroll`` splits it
   (:func:`tilesim.shared.moe.moe_tile_schedule`); the trace hook sees every chunk;
3. mm1 ``GU = X @ W13_e`` with FP32 accumulation over K tiles of ``tiling.mm1_k`` rows of H;
4. the activation in FP32 (:func:`moe_activation`), rounded to BF16 (``round_activation``);
5. mm2 ``D = A @ W2_e`` with FP32 accumulation over K tiles of ``tiling.mm2_k`` rows of I;
6. one BF16 rounding of ``D`` into the output rows.

Arithmetic models (:mod:`tilesim.reference.util.arith`): mm1 and mm2 are
:func:`~tilesim.reference.util.arith.matmul_fp32` with ``k_tile = mm1_k`` / ``mm2_k`` (each K tile's
partial sum exact in float64 and rounded once to FP32, the partials added in FP32 in ascending
K order); ``exp`` is :func:`~tilesim.reference.util.arith.exp_fp32_correctly_rounded`.
Consequence: every output row depends only on its own input row and the K tiling — the chunk
split, the BLAS kernel and the thread count do not change the bits (up to a double-rounding
coincidence when a float64 tile sum lands within ~2^-53 of an FP32 rounding midpoint). What
the cube does inside one K tile is not documented to this level; mm1's multi-core split-K
(whose combine order is implementation-defined on the device) is modelled as the sequential
order.

Tiles that change nothing are batched: N tiles (``mm1_n``, ``mm2_n``) and vector tiles
(``vec_tile``) only partition independent columns/elements. This module is the readable loop
nest; the speed path (:mod:`tilesim.reference._moe_fast`, chosen by the private switch
``_FAST``, on) runs one product over all rows of an expert instead of one per
``loop_unroll`` chunk, its BF16 weights widened one K tile at a time, the experts on the
reference worker pool. The trace records are the chunk schedule either way; a test proves
both paths give the same bits on every named case (tests/reference/test_moe_speed_path.py).
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import numpy as np
from tilesim.reference import _moe_fast
from tilesim.reference.util.arith import exp_fp32_correctly_rounded, matmul_fp32
from tilesim.shared.casts import BF16, to_bf16, widen_to_fp32
from tilesim.shared.interop import is_torch_tensor, to_torch
from tilesim.shared.models import ACTIVATIONS, GATE_UP_LAYOUTS, MoeDims
from tilesim.shared.moe import (
    OP_NAME,
    Args,
    MoeTileRecord,
    check_cumsum_meta,
    check_meta,
    check_moe_dims,
    check_values,
    cost,
    emit_moe_schedule,
    host_plan,
    moe_tile_schedule,
    resolve_tiling,
)
from tilesim.shared.tiling import MoeTiling
from tilesim.shared.trace import Trace
from tilesim.shared.validate import host_array, same_kind

_F32 = np.float32
_F64 = np.float64

#: the one speed switch: :mod:`tilesim.reference._moe_fast` (one K-tiled product per expert,
#: weights widened per K tile, experts in parallel) instead of the chunk loop below. Rows are
#: independent, so the bits are the same (tests/reference/test_moe_speed_path.py proves it).
_FAST = True


# --------------------------------------------------------------------------- numerics


def split_gate_up(gu: np.ndarray, layout: str) -> tuple[np.ndarray, np.ndarray]:
    """Split the ``2I`` columns of mm1's output into (gate, up).

    ``"halves"``: ``[gate | up]`` (MiniMax); ``"interleaved"``: even columns gate, odd up
    (GPT-OSS checkpoints).
    """
    if layout == "halves":
        i = gu.shape[-1] // 2
        return gu[..., :i], gu[..., i:]
    if layout == "interleaved":
        return gu[..., 0::2], gu[..., 1::2]
    raise ValueError(f"gate_up_layout: expected one of {GATE_UP_LAYOUTS}, got {layout!r}")


def moe_activation(gu, dims: MoeDims) -> np.ndarray:
    """The kernel's FP32 activation of mm1's ``[T, 2I]`` FP32 output -> FP32 ``[T, I]``.

    Every step is one FP32 operation (IEEE round to nearest), ``exp`` is correctly rounded:

    * ``silu``: ``n = gate * -1; t = exp(n); d = t + 1; s = gate / d; a = s * up``.
    * ``swigluoai``: ``g = min(gate, limit)`` (no lower clamp), ``u = clip(up, -limit, limit)``,
      ``z = alpha * g; t = exp(-z); sig = 1 / (1 + t); glu = g * sig; a = (u + beta) * glu``
      with ``alpha``, ``limit``, ``beta`` rounded to FP32 first.

    For very negative gates ``exp`` overflows to +inf and silu gives -0 (the right limit).
    """
    gu = np.asarray(gu)
    if gu.dtype != _F32:
        raise TypeError(f"moe_activation(gu): expected float32, got dtype {gu.dtype}")
    gate, up = split_gate_up(gu, dims.gate_up_layout)
    if dims.activation == "silu":
        neg = gate * _F32(-1.0)
        denom = exp_fp32_correctly_rounded(neg) + _F32(1.0)
        return (gate / denom) * up
    if dims.activation == "swigluoai":
        limit = _F32(dims.limit)
        g = np.minimum(gate, limit)
        u = np.clip(up, -limit, limit)
        z = _F32(dims.alpha) * g
        sig = _F32(1.0) / (exp_fp32_correctly_rounded(-z) + _F32(1.0))
        glu = g * sig
        return (u + _F32(dims.beta)) * glu
    raise ValueError(f"dims.activation: expected one of {ACTIVATIONS}, got {dims.activation!r}")


def moe_flop_count(expert_cumsum, dims: MoeDims) -> int:
    """Matmul FLOPs of one call: ``2*H*2I`` (mm1) plus ``2*I*H`` (mm2) per routed row, i.e.
    the sum of the trace records' ``flop`` (zero-token experts cost nothing). A thin call of
    :func:`tilesim.shared.moe.cost`. ``expert_cumsum`` follows the grouped GEMM's rules:
    ``[E+1]`` INT32 (``E = dims.num_experts``), ``c[0] == 0``, non-decreasing."""
    check_moe_dims(dims)
    check_cumsum_meta(expert_cumsum, dims)  # the grouped GEMM's rule (check_meta)
    unbounded = np.iinfo(np.int64).max  # no N_total here: c[E] is the routed row count
    args = Args(None, None, None, expert_cumsum, dims, None, None, True, None, unbounded)
    return cost(check_values(args))["flop"]


# --------------------------------------------------------------------------- checks


class _MoeCall(NamedTuple):
    """The checked arguments of one call, as host NumPy arrays."""

    x: np.ndarray  # [N_total, H] BF16
    w13: np.ndarray  # [E*H, 2I] BF16
    w2: np.ndarray  # [E*I, H] BF16
    cs: np.ndarray  # [E+1] int64
    dims: MoeDims
    tiling: MoeTiling
    round_activation: bool
    result: np.ndarray  # [N_total, H] BF16, written row by row
    plan: list[MoeTileRecord]  # the chunk schedule (shared host_plan)


def _check_moe(args: Args) -> _MoeCall:
    """The shared value checks on the call's :func:`~tilesim.shared.moe.check_meta` result,
    then the host copies."""
    args = check_values(args)
    args = args._replace(tiling=resolve_tiling(args.tiling, args.dims))
    out, dims = args.out, args.dims
    if out is None:
        result = np.zeros((args.n_total, dims.hidden_size), dtype=BF16)
    elif isinstance(out, np.ndarray):
        result = out  # written in place
    else:
        result = host_array(out, "out").copy()  # a torch out gets the rows copied back
    return _MoeCall(
        x=host_array(args.sorted_tokens, "sorted_tokens"),
        w13=host_array(args.w13, "w13_flat"),
        w2=host_array(args.w2, "w2_flat"),
        cs=args.cs,
        dims=dims,
        tiling=args.tiling,
        round_activation=args.round_activation,
        result=result,
        plan=host_plan(args),
    )


# --------------------------------------------------------------------------- the op


def _expert_weights(call: _MoeCall, e: int) -> tuple[np.ndarray, np.ndarray]:
    """Expert ``e``'s ``W13_e [H, 2I]`` and ``W2_e [I, H]``, widened exactly to float64 once
    per expert (``matmul_fp32`` then reads every K tile without a copy). Memory: one
    expert's weights in float64, ``8 * 3 * H * I`` bytes."""
    h, i = call.dims.hidden_size, call.dims.intermediate_size
    return call.w13[e * h : (e + 1) * h].astype(_F64), call.w2[e * i : (e + 1) * i].astype(_F64)


def _expert_ffn(call: _MoeCall, rows: slice, w13_e, w2_e, matmul=matmul_fp32) -> None:
    """``out[rows] = bf16(A @ W2_e)`` with ``A = act(X @ W13_e)``: the kernel's rounding points.
    ``matmul``: :func:`matmul_fp32` (weights widened already) or
    :func:`matmul_fp32_widening` (BF16 weights widened one K tile at a time) — same bits."""
    x = call.x[rows].astype(_F64)  # exact
    gu = matmul(x, w13_e, k_tile=call.tiling.mm1_k)  # mm1, FP32 [rows, 2I]
    act = moe_activation(gu, call.dims)  # FP32 [rows, I]
    if call.round_activation:
        act = widen_to_fp32(to_bf16(act))  # A = bf16(a)
    d = matmul(act, w2_e, k_tile=call.tiling.mm2_k)  # mm2, FP32 [rows, H]
    call.result[rows] = to_bf16(d)  # the one output rounding


def _deliver(call: _MoeCall, out, like):
    """The result: ``out`` itself when given (a torch ``out`` gets the rows copied in), else
    of the kind of ``sorted_tokens``."""
    if out is None:
        return same_kind(call.result, like)
    if is_torch_tensor(out):
        out.copy_(to_torch(call.result))
    return out


def moe_grouped_gemm(
    sorted_tokens,
    weights,
    expert_cumsum,
    dims: MoeDims,
    *,
    tiling: MoeTiling | None = None,
    out=None,
    round_activation: bool = True,
    trace: Trace = None,
):
    """Golden of the MiniMax grouped-GEMM kernel (M2.7 ``silu`` / M3 ``swigluoai``).

    Args:
        sorted_tokens: ``[N_total, H]`` BF16, rows grouped by ascending expert id.
        weights: ``(w13_flat [E*H, 2I], w2_flat [E*I, H])`` BF16, the kernel layout
            (:func:`tilesim.shared.convert_minimax_weights` builds it from a checkpoint).
        expert_cumsum: ``[E+1]`` INT32, ``0 = c[0] <= c[1] <= ... <= c[E] <= N_total``;
            expert ``e`` owns rows ``c[e]:c[e+1]``.
        dims: :class:`tilesim.shared.MoeDims` (E, H, I, activation, alpha/limit/beta,
            gate_up_layout ``"halves"`` or ``"interleaved"``).
        tiling: :class:`tilesim.shared.MoeTiling`; ``None`` means
            ``MoeTiling.from_env(dims.activation)`` evaluated at call time. ``unroll`` sets the
            chunks, ``mm1_k``/``mm2_k`` the FP32 K-tile accumulation; the N and vector tiles do
            not change the numbers. For ``swigluoai`` a non-default ``swiglu_alpha``/``limit``
            must equal ``dims.alpha``/``dims.limit``.
        out: optional ``[N_total, H]`` BF16 array or tensor, written in place and returned;
            rows outside ``c[0]:c[E]`` and rows of zero-token experts keep their values. Must
            not share memory with an input. Default: a fresh zero array.
        round_activation: ``True`` (the kernel, both variants; the M3 seed golden) rounds the
            FP32 activation to BF16 before mm2; ``False`` keeps it FP32 (the M2.7 seed golden).
        trace: called once per chunk with a :mod:`tilesim.shared.trace` record (lane
            ``{"expert": e}``, ``key_range`` the chunk's rows of ``sorted_tokens``, ``flop``,
            extra ``token_offset`` / ``chunk``).

    Returns:
        ``[N_total, H]`` BF16: ``out`` itself if given, else a torch tensor when
        ``sorted_tokens`` is one and a NumPy array otherwise. Arrays may be NumPy or torch.

    Rounding points: mm1 and mm2 accumulate in FP32 per K tile (see the module docstring), the
    activation is FP32 then (optionally) BF16, the output is rounded once to BF16 (RNE).
    """
    args = check_meta(sorted_tokens, weights, expert_cumsum, dims, tiling, out,
                      round_activation, trace)  # fmt: skip
    call = _check_moe(args)
    experts = [list(g) for _, g in itertools.groupby(call.plan, key=lambda r: r.expert)]
    if _FAST:  # each expert's rows in one product, experts in parallel: same bits
        _moe_fast.run(call, experts, trace, _expert_ffn)
        return _deliver(call, out, sorted_tokens)
    for chunks in experts:  # expert loop
        w13_e, w2_e = _expert_weights(call, chunks[0].expert)
        for c in chunks:  # loop_unroll chunks
            emit_moe_schedule(trace, [c], dims)
            _expert_ffn(call, slice(c.row0, c.row0 + c.chunk), w13_e, w2_e)
    return _deliver(call, out, sorted_tokens)


__all__ = [
    "OP_NAME",
    "MoeTileRecord",
    "moe_activation",
    "moe_flop_count",
    "moe_grouped_gemm",
    "moe_tile_schedule",
    "split_gate_up",
]
