"""Host glue around the grouped GEMM: MiniMax routing + token sort (dispatch) and the weighted
unpermute-and-sum (combine), so a whole routed-MoE layer golden can be built (the seeds' host
code: hicann/pypto-gym, src/pypto_gym/transformers/minimax_m3/modeling_minimax_m3.py and the
grouped-GEMM tests; docs/ops/moe.md).

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

Arguments follow :mod:`tilesim.shared.validate` (NumPy or torch arrays). :class:`MoeDispatch` is
a host plan and holds NumPy arrays whatever came in; :func:`moe_combine` returns the kind of
``expert_out``. Each op sends one :mod:`tilesim.shared.trace` record (lane ``{}``, step 0,
``key_range`` = the ``N*k`` routed rows of ``sorted_tokens``, ``flop`` 0; extra
``num_tokens``, ``top_k`` and, for dispatch, ``counts``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from tilesim.shared.casts import BF16, to_bf16, widen_to_fp32
from tilesim.shared.ranking import top_k
from tilesim.shared.trace import Trace, emit
from tilesim.shared.validate import (
    as_array,
    check_array,
    check_bool,
    check_choice,
    check_elements,
    check_finite,
    check_float,
    check_instance,
    check_int,
    check_range,
    check_trace,
    host_array,
    host_ints,
    raise_at_first,
    same_kind,
    shape_of,
)

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


def sigmoid_fp32(x) -> np.ndarray:
    """Correctly rounded FP32 sigmoid (evaluated in float64, rounded once)."""
    x64 = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x64))).astype(_F32)


class _DispatchArgs(NamedTuple):
    x: np.ndarray  # [N, H] BF16
    logits: np.ndarray  # [N, E] FP32
    bias: np.ndarray  # [E] FP32
    top_k: int
    normalize: bool
    scores: str
    pad_rows: int


def _check_dispatch(hidden_states, router_logits, top_k, correction_bias, normalize, scores,
                    pad_rows, trace) -> _DispatchArgs:  # fmt: skip
    x = as_array(hidden_states, "hidden_states", dtype=BF16, ndim=2, layout="[N, H]")
    logits = as_array(router_logits, "router_logits", dtype=np.float32, ndim=2, layout="[N, E]")
    n, e = logits.shape
    if n != x.shape[0]:
        raise ValueError(
            f"router_logits: expected {x.shape[0]} rows (one per token of hidden_states), "
            f"got shape {logits.shape}"
        )
    if e == 0:
        raise ValueError("router_logits: expected at least one expert column, got 0")
    top_k = check_int(top_k, "top_k", lo=1, hi=e)
    check_choice(scores, "scores", SCORE_KINDS)
    normalize = check_bool(normalize, "normalize")
    pad_rows = check_int(pad_rows, "pad_rows", lo=0)
    check_elements((n * top_k + pad_rows, x.shape[1]), "pad_rows", "sorted_tokens")
    check_finite(logits, "router_logits")
    if scores == "probabilities" and logits.size and (logits.min() < 0 or logits.max() > 1):
        raise ValueError(
            f"router_logits: expected values in [0, 1] with scores='probabilities', got range "
            f"[{float(logits.min())}, {float(logits.max())}]"
        )
    if correction_bias is None:
        bias = np.zeros(e, dtype=_F32)
    else:
        bias = as_array(correction_bias, "correction_bias", dtype=np.float32, shape=(e,),
                        layout="[E]")  # fmt: skip
        check_finite(bias, "correction_bias")
    check_trace(trace)
    return _DispatchArgs(x, logits, bias, top_k, normalize, scores, pad_rows)


def _route(a: _DispatchArgs) -> tuple[np.ndarray, np.ndarray]:
    """(topk_ids [N, k] int64, topk_weights [N, k] FP32): steps 1-3 of the module docstring."""
    w = sigmoid_fp32(a.logits) if a.scores == "logits" else a.logits.copy()
    choice = w + a.bias  # FP32 add
    # descending selection score, the lower expert id first on ties (tilesim.shared.ranking)
    topk_ids = top_k(choice, a.top_k, name="selection scores (w + correction_bias)")
    topk_w = np.take_along_axis(w, topk_ids, axis=1)  # FP32, without the bias
    if a.normalize:
        total = np.zeros(topk_w.shape[0], dtype=_F32)
        for j in range(a.top_k):  # sequential FP32 sum in slot order
            total = total + topk_w[:, j]
        _check_weight_sums(total, a)
        topk_w = topk_w / total[:, None]
    return topk_ids, topk_w.astype(_F32)


def _check_weight_sums(total: np.ndarray, a: _DispatchArgs) -> None:
    """``ValueError`` naming ``router_logits`` and the first token whose ``top_k`` chosen
    weights sum to 0 (every weight is ``>= 0``, so all of them are 0): ``normalize=True``
    would divide 0 by 0."""
    why = (
        "the FP32 sigmoid is 0 for logits below about -104"
        if a.scores == "logits"
        else "its chosen probabilities are 0"
    )

    def message(t: int) -> str:
        return (
            f"router_logits: expected the top_k = {a.top_k} chosen weights of every token to "
            f"have a sum > 0 with normalize=True, got token {t} whose chosen weights sum to 0 "
            f"({why}), so normalize=True is undefined"
        )

    raise_at_first(total == 0, message)


def moe_dispatch(
    hidden_states,
    router_logits,
    top_k: int,
    *,
    correction_bias=None,
    normalize: bool = False,
    scores: str = "logits",
    pad_rows: int = 0,
    trace: Trace = None,
) -> MoeDispatch:
    """MiniMax routing and the expert-sorted token layout the grouped GEMM expects.

    Args:
        hidden_states: ``[N, H]`` BF16 tokens.
        router_logits: ``[N, E]`` FP32 router output (``scores="logits"``) or FP32 scores
            already in ``[0, 1]`` (``scores="probabilities"``). Must be finite.
        top_k: experts per token, ``1 <= top_k <= E``.
        correction_bias: ``[E]`` FP32 ``e_score_correction_bias`` (selection only) or None.
        normalize: divide the chosen weights by their FP32 sum (M3 ``norm_topk_prob``).
            ``ValueError`` naming ``router_logits`` and the first token whose chosen weights
            sum to 0 (``scores="probabilities"`` zeros, or logits below about -104, where the
            FP32 sigmoid is 0): the division would be 0/0.
        pad_rows: zero rows appended to ``sorted_tokens`` (the seeds' host pads 64 so the
            kernel's tail prefetch stays in bounds); ``expert_cumsum`` does not cover them.
        trace: called once with a :mod:`tilesim.shared.trace` record (op ``"moe_dispatch"``,
            extra ``num_tokens``, ``top_k``, ``counts``).

    Returns:
        :class:`MoeDispatch` (NumPy arrays). Inputs are never modified.
    """
    a = _check_dispatch(hidden_states, router_logits, top_k, correction_bias, normalize, scores,
                        pad_rows, trace)  # fmt: skip
    n, e = a.logits.shape
    topk_ids, topk_w = _route(a)
    flat = topk_ids.reshape(-1)
    perm = np.argsort(flat, kind="stable").astype(np.int64)
    inv = np.empty_like(perm)
    inv[perm] = np.arange(perm.size, dtype=np.int64)
    counts = np.bincount(flat, minlength=e).astype(np.int64)
    cumsum = np.zeros(e + 1, dtype=np.int32)
    cumsum[1:] = np.cumsum(counts)
    sorted_tokens = np.zeros((perm.size + a.pad_rows, a.x.shape[1]), dtype=BF16)
    sorted_tokens[: perm.size] = a.x[perm // a.top_k]
    emit(trace, "moe_dispatch", {}, 0, (0, perm.size), num_tokens=n, top_k=a.top_k,
         counts=counts.tolist())  # fmt: skip
    # the fields in their declared order (see MoeDispatch)
    return MoeDispatch(sorted_tokens, cumsum, counts, perm, inv, topk_ids, topk_w)


class _CombineArgs(NamedTuple):
    y_sorted: np.ndarray  # [>= N*k, H] BF16
    inv_perm: np.ndarray  # [N*k] int64, a permutation of range(N*k)
    weights: np.ndarray  # [N, k] FP32, finite
    scale: float
    shared: np.ndarray | None  # [N, H] BF16


def _check_plan_meta(d: MoeDispatch) -> tuple[int, int]:
    """(N, k): the dtypes and shapes of the fields of ``d`` as :func:`moe_dispatch` builds
    them, consistent with each other; errors name ``dispatch.<field>``."""
    check_array(d.topk_ids, "dispatch.topk_ids", dtype=np.int64, ndim=2, layout="[N, k]")
    n, k = shape_of(d.topk_ids, "dispatch.topk_ids")
    check_array(d.topk_weights, "dispatch.topk_weights", dtype=_F32, shape=(n, k),
                layout="[N, k]")  # fmt: skip
    for name in ("perm", "inv_perm"):
        check_array(getattr(d, name), f"dispatch.{name}", dtype=np.int64, shape=(n * k,),
                    layout="[N*k]")  # fmt: skip
    check_array(d.counts, "dispatch.counts", dtype=np.int64, ndim=1, layout="[E]")
    e = shape_of(d.counts, "dispatch.counts")[0]
    check_array(d.expert_cumsum, "dispatch.expert_cumsum", dtype=np.int32, shape=(e + 1,),
                layout="[E+1]")  # fmt: skip
    check_array(d.sorted_tokens, "dispatch.sorted_tokens", dtype=BF16, ndim=2,
                layout="[N*k + pad_rows, H]")  # fmt: skip
    rows = shape_of(d.sorted_tokens, "dispatch.sorted_tokens")
    if rows[0] < n * k:
        raise ValueError(
            f"dispatch.sorted_tokens: expected at least N*k = {n * k} rows, got shape {rows}"
        )
    return n, k


def _check_plan_values(d: MoeDispatch, nk: int) -> tuple[np.ndarray, np.ndarray]:
    """(inv_perm, topk_weights) on the host: ``inv_perm`` a permutation of ``range(N*k)``,
    ``topk_weights`` finite. The fields :func:`moe_combine` reads; ``ValueError`` naming the
    first bad entry."""
    inv = host_ints(d.inv_perm, "dispatch.inv_perm")
    check_range(inv, "dispatch.inv_perm", 0, nk - 1)
    repeated = np.ones(nk, dtype=bool)
    repeated[np.unique(inv, return_index=True)[1]] = False

    def message(i: int) -> str:
        first = int(np.flatnonzero(inv == inv[i])[0])
        return (
            f"dispatch.inv_perm: expected a permutation of range(N*k) = range({nk}), got "
            f"{int(inv[i])} twice, at index {first} and at index {i}"
        )

    raise_at_first(repeated, message)
    w = host_array(d.topk_weights, "dispatch.topk_weights")
    check_finite(w, "dispatch.topk_weights")
    return inv, w


def _check_combine(expert_out, dispatch, routed_scaling_factor, shared_expert_out,
                   trace) -> _CombineArgs:  # fmt: skip
    y_sorted = as_array(expert_out, "expert_out", dtype=BF16, ndim=2, layout="[N*k, H]")
    check_instance(dispatch, "dispatch", MoeDispatch)
    n, k = _check_plan_meta(dispatch)
    if y_sorted.shape[0] < n * k:
        raise ValueError(
            f"expert_out: expected at least N*k = {n * k} rows, got shape {y_sorted.shape}"
        )
    scale = check_float(routed_scaling_factor, "routed_scaling_factor", fp32=True)
    shared = None
    if shared_expert_out is not None:
        shared = as_array(shared_expert_out, "shared_expert_out", dtype=BF16,
                          shape=(n, y_sorted.shape[1]), layout="[N, H]")  # fmt: skip
    check_trace(trace)
    inv, weights = _check_plan_values(dispatch, n * k)
    return _CombineArgs(y_sorted, inv, weights, scale, shared)


def moe_combine(
    expert_out,
    dispatch: MoeDispatch,
    *,
    routed_scaling_factor: float = 1.0,
    shared_expert_out=None,
    trace: Trace = None,
):
    """Unpermute, weight and sum the grouped GEMM's output: ``[N*k(+pad), H]`` -> ``[N, H]`` BF16.

    ``y[t] = bf16(bf16(sum_j fp32(bf16(out[inv[t*k+j]] * bf16(w[t, j])))) * scale)``, then
    ``bf16(y + shared_expert_out)`` when a shared expert output ``[N, H]`` BF16 is given. The
    sum over slots ``j`` is sequential in FP32 in slot order. Rows of ``expert_out`` past
    ``N*k`` (padding) are ignored. ``routed_scaling_factor`` is applied as an FP32 multiply
    (exact for 1.0 and 2.0, M3's value). ``trace`` gets one record (op ``"moe_combine"``).
    The result is a torch tensor when ``expert_out`` is one, else a NumPy array.

    ``dispatch`` must hold its fields as :func:`moe_dispatch` builds them, checked at every
    call (a frozen dataclass's arrays can still be written): ``topk_ids`` ``[N, k]`` int64,
    ``topk_weights`` ``[N, k]`` finite FP32, ``perm`` / ``inv_perm`` ``[N*k]`` int64 with
    ``inv_perm`` a permutation of ``range(N*k)``, ``counts`` ``[E]`` int64,
    ``expert_cumsum`` ``[E+1]`` INT32, ``sorted_tokens`` ``[>= N*k, H]`` BF16. Errors name
    ``dispatch.<field>``.
    """
    a = _check_combine(expert_out, dispatch, routed_scaling_factor, shared_expert_out, trace)
    n, k = a.weights.shape
    h = a.y_sorted.shape[1]
    gathered = widen_to_fp32(a.y_sorted[a.inv_perm]).reshape(n, k, h)
    w_bf16 = widen_to_fp32(to_bf16(a.weights))  # the host's .to(hidden dtype)
    prods = widen_to_fp32(to_bf16(gathered * w_bf16[:, :, None]))  # BF16 multiply
    acc = np.zeros((n, h), dtype=_F32)
    for j in range(k):  # FP32 sum over the top-k slots, slot order
        acc = acc + prods[:, j]
    routed = to_bf16(acc)
    routed = to_bf16(widen_to_fp32(routed) * _F32(a.scale))
    if a.shared is not None:
        routed = to_bf16(widen_to_fp32(routed) + widen_to_fp32(a.shared))
    emit(trace, "moe_combine", {}, 0, (0, n * k), num_tokens=n, top_k=k)
    return same_kind(routed, expert_out)


__all__ = ["SCORE_KINDS", "MoeDispatch", "moe_combine", "moe_dispatch", "sigmoid_fp32"]
