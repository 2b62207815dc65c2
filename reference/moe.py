"""MiniMax M2.7 / M3 routed-expert FFN as one grouped GEMM — the golden of the PyPTO kernel.

For every expert ``e`` with tokens, ``y = W2_e . act(W13_e . x)`` over the rows
``expert_cumsum[e]:expert_cumsum[e+1]`` of ``sorted_tokens``. The golden walks the kernel's loop
nest (``op-facts`` §1.4) and keeps every loop that changes the numbers:

1. expert loop over ``expert_cumsum`` (experts with no tokens are skipped);
2. the expert's token range split into chunks exactly as ``pypto.loop_unroll`` splits it
   (:func:`tilesim.shared.loop_unroll_chunks`); the trace hook sees every chunk;
3. mm1 ``GU = X @ W13_e`` with FP32 accumulation over K tiles of ``tiling.mm1_k`` rows of H;
4. the activation in FP32 (:func:`moe_activation`), rounded to BF16 (``round_activation``);
5. mm2 ``D = A @ W2_e`` with FP32 accumulation over K tiles of ``tiling.mm2_k`` rows of I;
6. one BF16 rounding of ``D`` into the output rows.

Emulation of the FP32 K-tile accumulation (:func:`ktiled_matmul_fp32`): each K tile's partial
sum is evaluated in float64 from the exactly widened operands and rounded ONCE to FP32; the tile
partials are then added in FP32 in ascending K order (``acc = p0; acc = fp32(acc + p1); ...``).
A product of two BF16 values is exact in FP32 and a product of an FP32 and a BF16 value is exact
in float64, so the float64 tile sum carries only ~2^-53 relative error before the FP32 rounding.
Consequence: every output row depends only on its own input row and the K tiling — the chunk
split, the BLAS kernel and the thread count do not change the bits (up to a double-rounding
coincidence when a float64 tile sum lands within ~2^-53 of an FP32 rounding midpoint). The
tests check this bit-for-bit. What the cube does inside one K tile is not documented to this
level; the model is "exact partial, one FP32 rounding", and mm1's multi-core split-K (whose
combine order is implementation-defined on the device) is modelled as the sequential order.

Tiles that change nothing are batched: N tiles (``mm1_n``, ``mm2_n``) and vector tiles
(``vec_tile``) only partition independent columns/elements, so each NumPy call covers a whole
chunk x a whole K tile x all columns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from tilesim.reference.interop import is_torch_tensor, to_numpy, to_torch
from tilesim.shared.casts import BF16, to_bf16, widen_to_fp32
from tilesim.shared.models import ACTIVATIONS, GATE_UP_LAYOUTS, MoeDims
from tilesim.shared.tiling import MoeTiling, loop_unroll_chunks

OP_NAME = "moe_grouped_gemm"
_F32 = np.float32


# --------------------------------------------------------------------------- schedule


@dataclass(frozen=True)
class MoeTileRecord:
    """One chunk of the kernel's schedule: ``chunk`` rows of ``expert`` starting at its
    ``token_offset``, i.e. global rows ``row0 : row0 + chunk`` of ``sorted_tokens``."""

    expert: int
    token_offset: int
    chunk: int
    row0: int

    def as_trace(self) -> dict:
        """The dict handed to the ``trace`` hook."""
        return {
            "op": OP_NAME,
            "expert": self.expert,
            "token_offset": self.token_offset,
            "chunk": self.chunk,
            "row0": self.row0,
        }


def moe_tile_schedule(expert_cumsum, unroll) -> list[MoeTileRecord]:
    """The chunk schedule the kernel runs for ``expert_cumsum`` (validated only loosely: it
    must be a 1-D integer sequence starting at 0 and non-decreasing) and an unroll list."""
    cs = np.asarray(expert_cumsum).astype(np.int64).ravel()
    if cs.size == 0 or cs[0] != 0 or np.any(np.diff(cs) < 0):
        raise ValueError(
            f"expert_cumsum: expected a non-decreasing sequence starting at 0, got {cs.tolist()}"
        )
    records = []
    for e in range(cs.size - 1):
        start = int(cs[e])
        for tok, tb in loop_unroll_chunks(int(cs[e + 1]) - start, unroll):
            records.append(MoeTileRecord(e, tok, tb, start + tok))
    return records


# --------------------------------------------------------------------------- numerics


def ktiled_matmul_fp32(x, w, k_tile: int) -> np.ndarray:
    """``x [M, K] @ w [K, N]`` with FP32 accumulation over K tiles of ``k_tile`` rows.

    ``x`` and ``w`` are float32 arrays whose pairwise products are exact in float64 (BF16 data,
    or FP32 x BF16). Each tile's partial sum is computed in float64 and rounded once to FP32;
    partials are added in FP32 in ascending K order. The last tile may be shorter. Returns a
    float32 ``[M, N]`` array.
    """
    x = np.asarray(x)
    w = np.asarray(w)
    k = x.shape[1]
    if w.shape[0] != k:
        raise ValueError(f"ktiled_matmul_fp32: inner dimensions differ ({k} vs {w.shape[0]})")
    if k == 0:
        return np.zeros((x.shape[0], w.shape[1]), dtype=_F32)
    acc = None
    for k0 in range(0, k, k_tile):  # the cube's K loop: one FP32 rounding per tile partial
        k1 = min(k0 + k_tile, k)
        part = (x[:, k0:k1].astype(np.float64) @ w[k0:k1].astype(np.float64)).astype(_F32)
        acc = part if acc is None else acc + part  # FP32 accumulator update
    return acc


def _exp_fp32(x: np.ndarray) -> np.ndarray:
    """FP32 ``exp``, correctly rounded (evaluated in float64, rounded once to FP32).

    NumPy's own float32 ``exp`` differs between CPUs (SIMD paths); this one does not. Overflow
    gives +inf, as in FP32 hardware.
    """
    with np.errstate(over="ignore"):
        return np.exp(x.astype(np.float64)).astype(_F32)


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
        denom = _exp_fp32(neg) + _F32(1.0)
        return (gate / denom) * up
    if dims.activation == "swigluoai":
        limit = _F32(dims.limit)
        g = np.minimum(gate, limit)
        u = np.clip(up, -limit, limit)
        z = _F32(dims.alpha) * g
        sig = _F32(1.0) / (_exp_fp32(-z) + _F32(1.0))
        glu = g * sig
        return (u + _F32(dims.beta)) * glu
    raise ValueError(f"dims.activation: expected one of {ACTIVATIONS}, got {dims.activation!r}")


# --------------------------------------------------------------------------- checks


def _check_array(name: str, a, dtype, ndim: int) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name}: expected a numpy array (or CPU torch tensor), got {type(a)}")
    if a.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {np.dtype(dtype)}, got {a.dtype}")
    if a.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array, got shape {a.shape}")
    return a


def _check_dims(dims) -> None:
    if not isinstance(dims, MoeDims):
        raise TypeError(f"dims: expected tilesim.shared.MoeDims, got {type(dims)}")
    if dims.activation not in ACTIVATIONS:
        raise ValueError(f"dims.activation: expected one of {ACTIVATIONS}, got {dims.activation!r}")
    if dims.gate_up_layout not in GATE_UP_LAYOUTS:
        raise ValueError(
            f"dims.gate_up_layout: expected one of {GATE_UP_LAYOUTS}, got {dims.gate_up_layout!r}"
        )
    for name in ("alpha", "limit", "beta"):
        v = getattr(dims, name)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not np.isfinite(v):
            raise ValueError(f"dims.{name}: expected a finite number, got {v!r}")
    if dims.limit <= 0:
        raise ValueError(f"dims.limit: expected > 0, got {dims.limit!r}")


def _check_tiling(tiling, dims: MoeDims) -> MoeTiling:
    if tiling is None:
        tiling = MoeTiling.from_env(dims.activation)
    if not isinstance(tiling, MoeTiling):
        raise TypeError(f"tiling: expected tilesim.shared.MoeTiling or None, got {type(tiling)}")
    if dims.activation == "swigluoai":
        # The kernel takes alpha/limit from its tiling (PYPTO_SWIGLU_*), the golden from dims.
        # A tiling that overrides the defaults must agree with dims, or the two would differ.
        default = MoeTiling()
        for t_name, d_name in (("swiglu_alpha", "alpha"), ("swiglu_limit", "limit")):
            t_val, d_val = getattr(tiling, t_name), getattr(dims, d_name)
            if t_val != getattr(default, t_name) and t_val != d_val:
                raise ValueError(
                    f"tiling.{t_name} = {t_val} (PYPTO_{t_name.upper()}) overrides the default "
                    f"but dims.{d_name} = {d_val}; the golden uses dims.{d_name} — make them agree"
                )
    return tiling


def _check_cumsum(cs: np.ndarray, num_experts: int, n_total: int) -> None:
    if cs.shape != (num_experts + 1,):
        raise ValueError(
            f"expert_cumsum: expected length E+1 = {num_experts + 1}, got shape {cs.shape}"
        )
    if cs[0] != 0:
        raise ValueError(f"expert_cumsum: expected expert_cumsum[0] == 0, got {int(cs[0])}")
    steps = np.diff(cs.astype(np.int64))
    if np.any(steps < 0):
        e = int(np.argmax(steps < 0))
        raise ValueError(
            f"expert_cumsum: expected non-decreasing values, got {int(cs[e])} then "
            f"{int(cs[e + 1])} at index {e}"
        )
    if cs[-1] > n_total:
        raise ValueError(
            f"expert_cumsum: expected the last value <= N_total = {n_total}, got {int(cs[-1])}"
        )


# --------------------------------------------------------------------------- the op


def moe_grouped_gemm(
    sorted_tokens,
    weights,
    expert_cumsum,
    dims: MoeDims,
    *,
    tiling: MoeTiling | None = None,
    out=None,
    round_activation: bool = True,
    trace: Callable[[dict], None] | None = None,
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
        out: optional ``[N_total, H]`` BF16 array written in place and returned; rows outside
            ``c[0]:c[E]`` and rows of zero-token experts keep their values. Must not share
            memory with an input. Default: a fresh zero array.
        round_activation: ``True`` (the kernel, both variants; the M3 seed golden) rounds the
            FP32 activation to BF16 before mm2; ``False`` keeps it FP32 (the M2.7 seed golden).
        trace: called once per chunk with ``{"op", "expert", "token_offset", "chunk", "row0"}``.

    Returns:
        ``[N_total, H]`` BF16 (``out`` if given). Torch CPU tensors are accepted for any array
        argument; the result is ``out`` itself when given, else a torch tensor when
        ``sorted_tokens`` is one and a NumPy array otherwise.

    Rounding points: mm1 and mm2 accumulate in FP32 per K tile (see the module docstring), the
    activation is FP32 then (optionally) BF16, the output is rounded once to BF16 (RNE).
    """
    as_torch = is_torch_tensor(sorted_tokens)
    torch_out = out if is_torch_tensor(out) else None
    x_all = to_numpy(sorted_tokens) if as_torch else sorted_tokens
    if not isinstance(weights, (tuple, list)) or len(weights) != 2:
        raise TypeError(
            f"weights: expected a (w13_flat, w2_flat) pair, got {type(weights).__name__}"
            + (f" of length {len(weights)}" if isinstance(weights, (tuple, list)) else "")
        )
    w13, w2 = (to_numpy(w) if is_torch_tensor(w) else w for w in weights)
    cs = to_numpy(expert_cumsum) if is_torch_tensor(expert_cumsum) else expert_cumsum
    out_np = to_numpy(out) if torch_out is not None else out

    _check_dims(dims)
    e_cnt, h, i = dims.num_experts, dims.hidden_size, dims.intermediate_size
    _check_array("sorted_tokens", x_all, BF16, 2)
    if x_all.shape[1] != h:
        raise ValueError(f"sorted_tokens: expected [N_total, H = {h}], got shape {x_all.shape}")
    n_total = x_all.shape[0]
    _check_array("w13_flat", w13, BF16, 2)
    if w13.shape != (e_cnt * h, 2 * i):
        raise ValueError(
            f"w13_flat: expected shape (E*H, 2I) = {(e_cnt * h, 2 * i)}, got {w13.shape}"
        )
    _check_array("w2_flat", w2, BF16, 2)
    if w2.shape != (e_cnt * i, h):
        raise ValueError(f"w2_flat: expected shape (E*I, H) = {(e_cnt * i, h)}, got {w2.shape}")
    _check_array("expert_cumsum", cs, np.int32, 1)
    _check_cumsum(cs, e_cnt, n_total)
    tiling = _check_tiling(tiling, dims)
    if not isinstance(round_activation, bool):
        raise TypeError(f"round_activation: expected a bool, got {round_activation!r}")
    if trace is not None and not callable(trace):
        raise TypeError(f"trace: expected a callable or None, got {type(trace)}")
    if out_np is None:
        result = np.zeros((n_total, h), dtype=BF16)
    else:
        result = _check_array("out", out_np, BF16, 2)
        if result.shape != (n_total, h):
            raise ValueError(
                f"out: expected shape (N_total, H) = {(n_total, h)}, got {result.shape}"
            )
        if not result.flags.writeable:
            raise ValueError("out: expected a writeable array")
        for name, a in (("sorted_tokens", x_all), ("w13_flat", w13), ("w2_flat", w2)):
            if np.may_share_memory(result, a):
                raise ValueError(f"out: must not share memory with {name}")

    for e in range(e_cnt):  # expert loop
        start, stop = int(cs[e]), int(cs[e + 1])
        if stop == start:
            continue
        w13_e = widen_to_fp32(w13[e * h : (e + 1) * h])  # [H, 2I], exact
        w2_e = widen_to_fp32(w2[e * i : (e + 1) * i])  # [I, H], exact
        for tok, tb in loop_unroll_chunks(stop - start, tiling.unroll):  # loop_unroll chunks
            row0 = start + tok
            if trace is not None:
                trace(MoeTileRecord(e, tok, tb, row0).as_trace())
            x = widen_to_fp32(x_all[row0 : row0 + tb])  # [tb, H]
            gu = ktiled_matmul_fp32(x, w13_e, tiling.mm1_k)  # mm1, FP32 [tb, 2I]
            act = moe_activation(gu, dims)  # FP32 [tb, I]
            if round_activation:
                act = widen_to_fp32(to_bf16(act))  # A = bf16(a)
            d = ktiled_matmul_fp32(act, w2_e, tiling.mm2_k)  # mm2, FP32 [tb, H]
            result[row0 : row0 + tb] = to_bf16(d)  # the one output rounding

    if torch_out is not None:
        if not torch_out.is_contiguous():  # to_numpy had to copy: write the rows back
            torch_out.copy_(to_torch(result))
        return torch_out
    return to_torch(result) if as_torch else result


__all__ = [
    "MoeTileRecord",
    "ktiled_matmul_fp32",
    "moe_activation",
    "moe_grouped_gemm",
    "moe_tile_schedule",
    "split_gate_up",
]
