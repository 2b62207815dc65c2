"""Host glue around the grouped GEMM: MiniMax routing + token sort (dispatch) and the weighted
unpermute-and-sum (combine), so a whole routed-MoE layer golden can be built (``op-facts`` §1.5).

Dispatch (:func:`moe_dispatch`), all in FP32:

1. scores ``w = sigmoid(router_logits)`` (``scores="logits"``; correctly rounded FP32 sigmoid,
   evaluated in float64 and rounded once) or ``w = router_logits`` as given
   (``scores="probabilities"``);
2. selection on ``w + correction_bias`` (one FP32 add): the ``top_k`` largest, slot order by
   descending selection score, **ties broken by the lower expert id** (torch's ``topk`` order
   is unspecified; ours is fixed);
3. routing weights = ``w`` gathered at the chosen experts (without the bias), optionally divided
   by their FP32 sum (``normalize=True``, M3's ``norm_topk_prob``; the sum runs sequentially in
   slot order);
4. the ``N*top_k`` (token, slot) pairs sorted by expert id with a STABLE sort, so inside an
   expert the rows are in ascending (token, slot) order (torch's default ``argsort`` is not
   stable — a device run may order rows within an expert differently; the per-row results do
   not depend on the order, see ``docs/ops/moe.md``).

Combine (:func:`moe_combine`), in the precision of the seeds' host code: gather the expert
outputs back to ``[N, k, H]`` (BF16), multiply by the routing weights rounded to BF16 (one BF16
rounding per product), sum over ``k`` in FP32 in slot order and round once to BF16, multiply
by ``routed_scaling_factor`` (one BF16 rounding) and add the shared expert's output (one BF16
rounding).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from tilesim.reference.interop import is_torch_tensor, to_numpy
from tilesim.shared.casts import BF16, to_bf16, widen_to_fp32

_F32 = np.float32
SCORE_KINDS = ("logits", "probabilities")


@dataclass(frozen=True)
class MoeDispatch:
    """Result of :func:`moe_dispatch` (all NumPy arrays).

    Attributes:
        sorted_tokens: ``[N*k + pad_rows, H]`` BF16, rows grouped by ascending expert id.
        expert_cumsum: ``[E+1]`` INT32, the grouped GEMM's ``expert_cumsum``.
        counts: ``[E]`` int64 rows per expert.
        perm: ``[N*k]`` int64; sorted row ``r`` is flat slot ``perm[r] = t*k + j`` (token ``t``,
            slot ``j``).
        inv_perm: ``[N*k]`` int64; flat slot ``s`` sits at sorted row ``inv_perm[s]``.
        topk_ids: ``[N, k]`` int64 chosen experts, slot order as described in the module doc.
        topk_weights: ``[N, k]`` FP32 routing weights (normalised if requested).
    """

    sorted_tokens: np.ndarray
    expert_cumsum: np.ndarray
    counts: np.ndarray
    perm: np.ndarray
    inv_perm: np.ndarray
    topk_ids: np.ndarray
    topk_weights: np.ndarray

    @property
    def num_tokens(self) -> int:
        return self.topk_ids.shape[0]

    @property
    def top_k(self) -> int:
        return self.topk_ids.shape[1]

    @property
    def num_experts(self) -> int:
        return self.counts.shape[0]


def _np(x):
    return to_numpy(x) if is_torch_tensor(x) else x


def _require(name: str, a, dtype, shape_desc: str, ndim: int) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name}: expected a numpy array (or CPU torch tensor), got {type(a)}")
    if a.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {np.dtype(dtype)}, got {a.dtype}")
    if a.ndim != ndim:
        raise ValueError(f"{name}: expected shape {shape_desc}, got {a.shape}")
    return a


def sigmoid_fp32(x) -> np.ndarray:
    """Correctly rounded FP32 sigmoid (evaluated in float64, rounded once)."""
    x64 = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x64))).astype(_F32)


def moe_dispatch(
    hidden_states,
    router_logits,
    top_k: int,
    *,
    correction_bias=None,
    normalize: bool = False,
    scores: str = "logits",
    pad_rows: int = 0,
    trace: Callable[[dict], None] | None = None,
) -> MoeDispatch:
    """MiniMax routing and the expert-sorted token layout the grouped GEMM expects.

    Args:
        hidden_states: ``[N, H]`` BF16 tokens.
        router_logits: ``[N, E]`` FP32 router output (``scores="logits"``) or FP32 scores
            already in ``[0, 1]`` (``scores="probabilities"``). Must be finite.
        top_k: experts per token, ``1 <= top_k <= E``.
        correction_bias: ``[E]`` FP32 ``e_score_correction_bias`` (selection only) or None.
        normalize: divide the chosen weights by their FP32 sum (M3 ``norm_topk_prob``).
        pad_rows: zero rows appended to ``sorted_tokens`` (the seeds' host pads 64 so the
            kernel's tail prefetch stays in bounds); ``expert_cumsum`` does not cover them.
        trace: called once with ``{"op": "moe_dispatch", "num_tokens", "top_k", "counts"}``.

    Returns:
        :class:`MoeDispatch`. Inputs are never modified.
    """
    x = _require("hidden_states", _np(hidden_states), BF16, "[N, H]", 2)
    logits = _require("router_logits", _np(router_logits), np.float32, "[N, E]", 2)
    n, _h = x.shape
    if logits.shape[0] != n:
        raise ValueError(
            f"router_logits: expected {n} rows (one per token of hidden_states), "
            f"got shape {logits.shape}"
        )
    e = logits.shape[1]
    if e == 0:
        raise ValueError("router_logits: expected at least one expert column, got 0")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= e:
        raise ValueError(f"top_k: expected an int in [1, E = {e}], got {top_k!r}")
    if scores not in SCORE_KINDS:
        raise ValueError(f"scores: expected one of {SCORE_KINDS}, got {scores!r}")
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize: expected a bool, got {normalize!r}")
    if not isinstance(pad_rows, int) or isinstance(pad_rows, bool) or pad_rows < 0:
        raise ValueError(f"pad_rows: expected a non-negative int, got {pad_rows!r}")
    if not np.all(np.isfinite(logits)):
        raise ValueError("router_logits: expected finite values, got NaN or inf")
    if scores == "probabilities" and logits.size and (logits.min() < 0 or logits.max() > 1):
        raise ValueError(
            f"router_logits: scores='probabilities' expects values in [0, 1], got range "
            f"[{float(logits.min())}, {float(logits.max())}]"
        )
    if correction_bias is None:
        bias = np.zeros(e, dtype=_F32)
    else:
        bias = _require("correction_bias", _np(correction_bias), np.float32, f"[E = {e}]", 1)
        if bias.shape != (e,):
            raise ValueError(f"correction_bias: expected shape ({e},), got {bias.shape}")
        if not np.all(np.isfinite(bias)):
            raise ValueError("correction_bias: expected finite values, got NaN or inf")

    w = sigmoid_fp32(logits) if scores == "logits" else logits.copy()
    choice = w + bias  # FP32 add
    # descending selection score; the stable sort keeps the lower expert id first on ties
    order = np.argsort(-choice, axis=1, kind="stable")
    topk_ids = np.ascontiguousarray(order[:, :top_k]).astype(np.int64)
    topk_w = np.take_along_axis(w, topk_ids, axis=1)  # FP32, without the bias
    if normalize:
        total = np.zeros(n, dtype=_F32)
        for j in range(top_k):  # sequential FP32 sum in slot order
            total = total + topk_w[:, j]
        with np.errstate(divide="ignore", invalid="ignore"):
            topk_w = topk_w / total[:, None]
    topk_w = topk_w.astype(_F32)

    flat = topk_ids.reshape(-1)
    perm = np.argsort(flat, kind="stable").astype(np.int64)
    inv = np.empty_like(perm)
    inv[perm] = np.arange(perm.size, dtype=np.int64)
    counts = np.bincount(flat, minlength=e).astype(np.int64)
    cumsum = np.zeros(e + 1, dtype=np.int32)
    cumsum[1:] = np.cumsum(counts)
    sorted_tokens = np.zeros((perm.size + pad_rows, x.shape[1]), dtype=BF16)
    sorted_tokens[: perm.size] = x[perm // top_k]
    if trace is not None:
        trace({"op": "moe_dispatch", "num_tokens": n, "top_k": top_k, "counts": counts.tolist()})
    return MoeDispatch(
        sorted_tokens=sorted_tokens,
        expert_cumsum=cumsum,
        counts=counts,
        perm=perm,
        inv_perm=inv,
        topk_ids=topk_ids,
        topk_weights=topk_w,
    )


def moe_combine(
    expert_out,
    dispatch: MoeDispatch,
    *,
    routed_scaling_factor: float = 1.0,
    shared_expert_out=None,
    trace: Callable[[dict], None] | None = None,
) -> np.ndarray:
    """Unpermute, weight and sum the grouped GEMM's output: ``[N*k(+pad), H]`` -> ``[N, H]`` BF16.

    ``y[t] = bf16(bf16(sum_j fp32(bf16(out[inv[t*k+j]] * bf16(w[t, j])))) * scale)``, then
    ``bf16(y + shared_expert_out)`` when a shared expert output ``[N, H]`` BF16 is given. The
    sum over slots ``j`` is sequential in FP32 in slot order. Rows of ``expert_out`` past
    ``N*k`` (padding) are ignored. ``routed_scaling_factor`` is applied as an FP32 multiply
    (exact for 1.0 and 2.0, M3's value). ``trace`` is called once with ``{"op": "moe_combine"}``.
    """
    if not isinstance(dispatch, MoeDispatch):
        raise TypeError(f"dispatch: expected a MoeDispatch, got {type(dispatch)}")
    y_sorted = _require("expert_out", _np(expert_out), BF16, "[N*k, H]", 2)
    n, k = dispatch.topk_ids.shape
    if y_sorted.shape[0] < n * k:
        raise ValueError(
            f"expert_out: expected at least N*k = {n * k} rows, got shape {y_sorted.shape}"
        )
    h = y_sorted.shape[1]
    if (
        not isinstance(routed_scaling_factor, (int, float))
        or isinstance(routed_scaling_factor, bool)
        or not math.isfinite(routed_scaling_factor)
    ):
        raise ValueError(
            f"routed_scaling_factor: expected a finite number, got {routed_scaling_factor!r}"
        )
    shared = None
    if shared_expert_out is not None:
        shared = _require("shared_expert_out", _np(shared_expert_out), BF16, f"[{n}, {h}]", 2)
        if shared.shape != (n, h):
            raise ValueError(f"shared_expert_out: expected shape {(n, h)}, got {shared.shape}")

    gathered = widen_to_fp32(y_sorted[dispatch.inv_perm]).reshape(n, k, h)
    w_bf16 = widen_to_fp32(to_bf16(dispatch.topk_weights))  # the host's .to(hidden dtype)
    prods = widen_to_fp32(to_bf16(gathered * w_bf16[:, :, None]))  # BF16 multiply
    acc = np.zeros((n, h), dtype=_F32)
    for j in range(k):  # FP32 sum over the top-k slots, slot order
        acc = acc + prods[:, j]
    routed = to_bf16(acc)
    routed = to_bf16(widen_to_fp32(routed) * _F32(routed_scaling_factor))
    if shared is not None:
        routed = to_bf16(widen_to_fp32(routed) + widen_to_fp32(shared))
    if trace is not None:
        trace({"op": "moe_combine", "num_tokens": n, "top_k": k})
    return routed


__all__ = ["MoeDispatch", "moe_combine", "moe_dispatch", "sigmoid_fp32"]
