"""moe_dispatch / moe_combine: MiniMax routing and the host combine vs torch versions of the
seeds' host code (tests/oracles/moe.py), ordering rules, whole-layer golden vs a float64 dense
oracle, trace records, bad inputs."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from oracles.moe import dense_layer_oracle64, torch_host_combine, torch_seed_routing
from tilesim.reference import (
    MoeDispatch,
    moe_combine,
    moe_dispatch,
    moe_grouped_gemm,
    moe_make_case,
)
from tilesim.shared import MoeDims, MoeTiling, to_bf16, unconvert_minimax_weights, widen_to_fp32
from tilesim.shared.trace import check_record

BF = ml_dtypes.bfloat16


def _inputs(n=12, h=16, e=8, seed=0, bias_like_m3=False):
    rng = np.random.default_rng(seed)
    x = to_bf16(rng.standard_normal((n, h), dtype=np.float32))
    logits = rng.standard_normal((n, e), dtype=np.float32) * np.float32(2.0)
    if bias_like_m3:  # M3-like bias: ~11-19 with ~1e-3 gaps (must stay FP32)
        bias = (np.float32(11.0) + np.arange(e, dtype=np.float32) * np.float32(1e-3)).astype(
            np.float32
        )
    else:
        bias = (rng.standard_normal(e, dtype=np.float32) * np.float32(0.5)).astype(np.float32)
    return x, logits, bias


# --------------------------------------------------------------------------- dispatch


@pytest.mark.torch
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("bias_like_m3", [False, True])
def test_dispatch_matches_seed_routing_in_torch(normalize, bias_like_m3):
    x, logits, bias = _inputs(n=40, e=16, seed=1, bias_like_m3=bias_like_m3)
    k = 4
    d = moe_dispatch(x, logits, k, correction_bias=bias, normalize=normalize)
    idx, tw = torch_seed_routing(logits, bias, k, normalize)
    for t in range(40):
        ours = dict(zip(d.topk_ids[t].tolist(), d.topk_weights[t].tolist(), strict=True))
        theirs = dict(zip(idx[t].tolist(), tw[t].tolist(), strict=True))
        assert set(ours) == set(theirs)
        for ex, wv in theirs.items():  # sigmoid / sum rounding may differ by a couple FP32 ULP
            assert abs(ours[ex] - wv) <= 4 * 2.0**-24 * abs(wv)


def test_dispatch_layout_is_consistent_and_stable():
    x, logits, bias = _inputs(n=30, e=8, seed=2)
    k = 3
    d = moe_dispatch(x, logits, k, correction_bias=bias)
    assert isinstance(d, MoeDispatch)
    assert (d.num_tokens, d.top_k, d.num_experts) == (30, 3, 8)
    flat = d.topk_ids.reshape(-1)
    np.testing.assert_array_equal(d.counts, np.bincount(flat, minlength=8))
    assert d.expert_cumsum.dtype == np.int32
    np.testing.assert_array_equal(d.expert_cumsum, np.concatenate([[0], np.cumsum(d.counts)]))
    np.testing.assert_array_equal(d.inv_perm[d.perm], np.arange(90))
    # sorted by expert; inside an expert ascending (token, slot) = ascending flat index
    ids_sorted = flat[d.perm]
    assert (np.diff(ids_sorted) >= 0).all()
    for e in range(8):
        block = d.perm[d.expert_cumsum[e] : d.expert_cumsum[e + 1]]
        assert (np.diff(block) > 0).all()
    assert d.sorted_tokens.tobytes() == x[d.perm // k].tobytes()
    # every token's k experts are distinct; slots ordered by descending selection score
    assert all(len(set(r)) == k for r in d.topk_ids.tolist())
    w = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    choice = np.take_along_axis(w + bias, d.topk_ids, axis=1)
    assert (np.diff(choice, axis=1) <= 1e-6).all()


def test_dispatch_ties_go_to_the_lower_expert_id():
    x = to_bf16(np.ones((3, 4), np.float32))
    logits = np.zeros((3, 6), np.float32)
    logits[1, 4] = 1.0  # token 1: expert 4 first, then the tie 0, 1
    d = moe_dispatch(x, logits, 3)
    assert d.topk_ids.tolist() == [[0, 1, 2], [4, 0, 1], [0, 1, 2]]
    # equal selection scores made equal by the bias, different weights: still lower id first
    logits2 = np.array([[0.0, 1.0, 0.0]], np.float32)
    w = 1.0 / (1.0 + np.exp(-logits2.astype(np.float64)))
    bias = (np.float32(w[0, 1]) - np.float32(w[0, 0])) * np.array([1, 0, 0], np.float32)
    d2 = moe_dispatch(x[:1], logits2, 1, correction_bias=bias.astype(np.float32))
    sel = (d2.topk_ids[0, 0], float(d2.topk_weights[0, 0]))
    assert sel[0] == 0 and sel[1] == pytest.approx(0.5)


def test_dispatch_weights_are_without_bias_and_normalised_on_request():
    x, logits, bias = _inputs(n=10, e=8, seed=3)
    d = moe_dispatch(x, logits, 2, correction_bias=bias)
    sig = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    want = np.take_along_axis(sig, d.topk_ids, axis=1)
    np.testing.assert_allclose(d.topk_weights, want, rtol=2**-23)
    dn = moe_dispatch(x, logits, 2, correction_bias=bias, normalize=True)
    np.testing.assert_array_equal(dn.topk_ids, d.topk_ids)
    np.testing.assert_allclose(dn.topk_weights.sum(axis=1), 1.0, rtol=4 * 2**-24)
    assert dn.topk_weights.dtype == np.float32


def test_dispatch_probabilities_are_used_as_given():
    x = to_bf16(np.ones((2, 4), np.float32))
    probs = np.array([[0.1, 0.7, 0.2], [0.5, 0.25, 0.25]], np.float32)
    d = moe_dispatch(x, probs, 2, scores="probabilities")
    assert d.topk_ids.tolist() == [[1, 2], [0, 1]]
    np.testing.assert_array_equal(d.topk_weights, np.array([[0.7, 0.2], [0.5, 0.25]], np.float32))


def test_dispatch_pad_rows_and_empty_batch():
    x, logits, _ = _inputs(n=5, e=4, seed=4)
    d = moe_dispatch(x, logits, 2, pad_rows=64)
    assert d.sorted_tokens.shape == (10 + 64, 16)
    assert (d.sorted_tokens[10:].astype(np.float32) == 0).all()
    assert d.expert_cumsum[-1] == 10
    d0 = moe_dispatch(x[:0], logits[:0], 2)
    assert d0.sorted_tokens.shape == (0, 16) and d0.expert_cumsum.tolist() == [0] * 5


def test_dispatch_does_not_modify_inputs_and_is_deterministic():
    x, logits, bias = _inputs(seed=5)
    copies = [a.copy() for a in (x, logits, bias)]
    a = moe_dispatch(x, logits, 3, correction_bias=bias, normalize=True)
    b = moe_dispatch(x, logits, 3, correction_bias=bias, normalize=True)
    for c, o in zip(copies, (x, logits, bias), strict=True):
        assert c.tobytes() == o.tobytes()
    for f in ("sorted_tokens", "expert_cumsum", "perm", "topk_ids", "topk_weights"):
        assert getattr(a, f).tobytes() == getattr(b, f).tobytes()


@pytest.mark.parametrize(
    "kw, exc, match",
    [
        ({"hidden_states": np.zeros((4, 16), np.float32)}, TypeError, "hidden_states: expected"),
        ({"router_logits": np.zeros((4, 8), np.float64)}, TypeError, "router_logits: exp"),
        ({"router_logits": np.zeros((4, 8), BF)}, TypeError, "dtype float32, got bfloat16"),
        ({"router_logits": np.zeros((5, 8), np.float32)}, ValueError, "expected 4 rows"),
        ({"router_logits": np.zeros(8, np.float32)}, ValueError, "router_logits: expected a 2-D"),
        ({"router_logits": [[0.0] * 8] * 4}, TypeError, "router_logits: expected a numpy array"),
        ({"router_logits": np.full((4, 8), np.nan, np.float32)}, ValueError, "finite"),
        ({"top_k": 0}, ValueError, "top_k: expected an int in \\[1, 8\\], got 0"),
        ({"top_k": 9}, ValueError, "top_k"),
        ({"top_k": 2.0}, TypeError, "top_k: expected an int, got float"),
        ({"top_k": True}, TypeError, "top_k: expected an int, got bool"),
        ({"scores": "softmax"}, ValueError, "scores: expected one of"),
        ({"scores": "probabilities"}, ValueError, "expected values in \\[0, 1\\]"),
        ({"correction_bias": np.zeros(7, np.float32)}, ValueError, "correction_bias: expected s"),
        ({"correction_bias": np.zeros(8, np.float64)}, TypeError, "correction_bias: expected d"),
        ({"normalize": 1}, TypeError, "normalize"),
        ({"pad_rows": -1}, ValueError, "pad_rows"),
        ({"correction_bias": np.full(8, np.inf, np.float32)}, ValueError, "correction_bias: e"),
        ({"trace": "log"}, TypeError, "trace: expected a callable"),
    ],
)  # fmt: skip
def test_dispatch_bad_inputs(kw, exc, match):
    rng = np.random.default_rng(0)
    args = {
        "hidden_states": to_bf16(np.ones((4, 16), np.float32)),
        "router_logits": rng.standard_normal((4, 8), dtype=np.float32) * np.float32(3),
        "top_k": 2,
    }
    args.update(kw)
    with pytest.raises(exc, match=match):
        moe_dispatch(**args)


# --------------------------------------------------------------------------- combine


@pytest.mark.torch
@pytest.mark.parametrize("factor, with_shared", [(1.0, False), (2.0, True), (0.7, True)])
def test_combine_matches_seed_host_code_in_torch(factor, with_shared):
    x, logits, bias = _inputs(n=24, h=32, e=8, seed=6)
    d = moe_dispatch(x, logits, 4, correction_bias=bias, normalize=True, pad_rows=64)
    rng = np.random.default_rng(7)
    out_sorted = to_bf16(rng.standard_normal((24 * 4 + 64, 32), dtype=np.float32))
    shared = to_bf16(rng.standard_normal((24, 32), dtype=np.float32)) if with_shared else None
    got = moe_combine(out_sorted, d, routed_scaling_factor=factor, shared_expert_out=shared)
    want = torch_host_combine(out_sorted, d.topk_weights, d.inv_perm, factor, shared)
    assert got.dtype == BF and got.shape == (24, 32)
    assert got.tobytes() == want.tobytes()


def test_combine_rounding_points():
    """One token, k = 2: the BF16 product, the FP32 sum, the BF16 scaling are visible."""
    x = to_bf16(np.ones((1, 2), np.float32))
    d = moe_dispatch(x, np.array([[0.0, 0.0, 5.0]], np.float32), 2)
    # slots: expert 2 (w = sigmoid(5)), expert 0 (w = 0.5); rows sorted: expert 0 then 2
    out = to_bf16(np.array([[3.0, 1.0], [1.0, 1.0 + 2**-7]], np.float32))
    y = moe_combine(out, d, routed_scaling_factor=2.0).astype(np.float64)
    w2 = float(to_bf16(np.float32(1.0 / (1.0 + math.exp(-5.0)))).astype(np.float32))
    p_e2 = widen_to_fp32(to_bf16(np.array([1.0, 1.0 + 2**-7], np.float32) * np.float32(w2)))
    p_e0 = widen_to_fp32(to_bf16(np.array([3.0, 1.0], np.float32) * np.float32(0.5)))
    want = widen_to_fp32(to_bf16(p_e2 + p_e0)) * 2.0
    np.testing.assert_array_equal(y[0], want.astype(np.float64))


def test_combine_bad_inputs():
    x, logits, _ = _inputs(n=4, h=8, e=4, seed=8)
    d = moe_dispatch(x, logits, 2)
    ok = to_bf16(np.zeros((8, 8), np.float32))
    with pytest.raises(TypeError, match="dispatch: expected a MoeDispatch"):
        moe_combine(ok, {"perm": 1})
    with pytest.raises(TypeError, match="expert_out: expected dtype bfloat16"):
        moe_combine(ok.astype(np.float32), d)
    with pytest.raises(ValueError, match="at least N\\*k = 8 rows"):
        moe_combine(ok[:7], d)
    with pytest.raises(ValueError, match="routed_scaling_factor"):
        moe_combine(ok, d, routed_scaling_factor=float("inf"))
    with pytest.raises(TypeError, match="routed_scaling_factor: expected a real number"):
        moe_combine(ok, d, routed_scaling_factor="2")
    with pytest.raises(TypeError, match="trace: expected a callable"):
        moe_combine(ok, d, trace=1)
    with pytest.raises(ValueError, match="shared_expert_out: expected shape"):
        moe_combine(ok, d, shared_expert_out=ok)
    with pytest.raises(TypeError, match="shared_expert_out: expected dtype"):
        moe_combine(ok, d, shared_expert_out=np.zeros((4, 8), np.float32))


# --------------------------------------------------------------------------- whole layer


def _layer(seed=9, n=20, k=3, activation="swigluoai"):
    case = moe_make_case(
        None, seed=seed, activation=activation, counts=(0,) * 8, num_experts=8,
        hidden_size=64, intermediate_size=32, input_scale=2.0, weight_scale=0.125,
    )  # fmt: skip
    dims: MoeDims = case["params"]["dims"]
    rng = np.random.default_rng(seed + 100)
    x = to_bf16(rng.standard_normal((n, 64), dtype=np.float32))
    logits = rng.standard_normal((n, 8), dtype=np.float32)
    return case["inputs"]["weights"], dims, x, logits, k


def test_whole_layer_golden_vs_float64_dense_oracle():
    (w13, w2), dims, x, logits, k = _layer()
    d = moe_dispatch(x, logits, k, normalize=True)
    tiling = MoeTiling.default(dims.activation)
    y_sorted = moe_grouped_gemm(d.sorted_tokens, (w13, w2), d.expert_cumsum, dims, tiling=tiling)
    y = moe_combine(y_sorted, d, routed_scaling_factor=2.0).astype(np.float64)
    gate_up, down = unconvert_minimax_weights(w13, w2, 8)
    ref, mag = dense_layer_oracle64(x, gate_up, down, d.topk_ids, d.topk_weights, dims, 2.0)
    # BF16 roundings: activation, expert output, weight, product, sum, scaling (each <= 2^-9
    # relative of what it rounds) -> a few BF16 ULPs of the magnitude sum
    assert (np.abs(y - ref) <= 6 * 2.0**-9 * mag + 2.0**-133).all()
    assert np.abs(ref).max() > 1.0


def test_whole_layer_does_not_depend_on_row_order_inside_an_expert():
    """Dispatch sorts stably; torch's argsort may not. Any order inside an expert gives the same
    combined bits, because every output row depends only on its own input row."""
    (w13, w2), dims, x, logits, k = _layer(seed=10, activation="silu")
    d = moe_dispatch(x, logits, k)
    tiling = MoeTiling.default("silu")
    y = moe_combine(moe_grouped_gemm(d.sorted_tokens, (w13, w2), d.expert_cumsum, dims,
                                     tiling=tiling), d)  # fmt: skip
    rng = np.random.default_rng(0)
    perm = d.perm.copy()
    for e in range(8):
        lo, hi = d.expert_cumsum[e], d.expert_cumsum[e + 1]
        perm[lo:hi] = rng.permutation(perm[lo:hi])
    inv = np.empty_like(perm)
    inv[perm] = np.arange(perm.size)
    d2 = MoeDispatch(
        sorted_tokens=x[perm // k], expert_cumsum=d.expert_cumsum, counts=d.counts, perm=perm,
        inv_perm=inv, topk_ids=d.topk_ids, topk_weights=d.topk_weights,
    )  # fmt: skip
    assert not np.array_equal(perm, d.perm)
    y2 = moe_combine(moe_grouped_gemm(d2.sorted_tokens, (w13, w2), d2.expert_cumsum, dims,
                                      tiling=tiling), d2)  # fmt: skip
    assert y.tobytes() == y2.tobytes()


@pytest.mark.torch
def test_dispatch_and_combine_accept_torch_tensors():
    import torch
    from tilesim.shared.interop import to_numpy, to_torch

    x, logits, bias = _inputs(n=6, h=8, e=4, seed=11)
    d_np = moe_dispatch(x, logits, 2, correction_bias=bias)
    d_t = moe_dispatch(to_torch(x), to_torch(logits), 2, correction_bias=to_torch(bias))
    assert isinstance(d_t.sorted_tokens, np.ndarray)  # the dispatch plan is host data
    assert d_t.sorted_tokens.tobytes() == d_np.sorted_tokens.tobytes()
    assert d_t.topk_weights.tobytes() == d_np.topk_weights.tobytes()
    out = to_bf16(np.random.default_rng(1).standard_normal((12, 8), dtype=np.float32))
    y_t = moe_combine(to_torch(out), d_np)  # torch in, torch out
    assert isinstance(y_t, torch.Tensor)
    assert to_numpy(y_t).tobytes() == moe_combine(out, d_np).tobytes()


def test_dispatch_and_combine_trace_records():
    x, logits, _ = _inputs(n=5, h=8, e=4, seed=12)
    seen = []
    d = moe_dispatch(x, logits, 2, trace=seen.append)
    moe_combine(d.sorted_tokens, d, trace=seen.append)
    assert [check_record(r)["op"] for r in seen] == ["moe_dispatch", "moe_combine"]
    rd, rc = seen
    assert (rd["lane"], rd["step"], rd["key_range"], rd["keys_used"]) == ({}, 0, (0, 10), 10)
    assert rd["extra"] == {"num_tokens": 5, "top_k": 2, "counts": d.counts.tolist()}
    assert sum(rd["extra"]["counts"]) == 10
    assert (rc["key_range"], rc["extra"]) == ((0, 10), {"num_tokens": 5, "top_k": 2})
