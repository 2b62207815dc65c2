"""moe_grouped_gemm: independent float64 oracle with a derived error bound, the loop nest
written out with math.fsum, loop-nest properties, the trace schema, bad inputs, interop.

The oracles live in tests/oracles/moe.py. The float64 oracle (``oracle64``) is written per
expert with full-K float64 matmuls and the activation formulas in float64; it shares no code
with the golden. Its error bound
(``oracle_bound``) follows from the golden's documented rounding points:

* mm1/mm2 with ``nk`` K tiles: each tile partial is rounded once to FP32 and ``nk - 1`` FP32
  adds follow, so ``|GU32 - GU| <= (nk1 + 1) 2^-24 S1`` with ``S1 = |x| @ |W13|`` (same for mm2
  with ``S2 = |A| @ |W2|``);
* the FP32 activation adds a few FP32 roundings (relative ``(2|alpha g| + 8) 2^-24``) and passes
  the mm1 error on through its partial derivatives (bounded by ``1.1 |up|`` resp.
  ``(|up| + beta)(1 + alpha |g| / 4)`` in gate and ``|g|`` in up);
* with ``round_activation`` the golden's BF16 activation equals the oracle's unless the FP32
  error interval around the float64 activation straddles a BF16 rounding boundary — then they
  differ by at most that BF16 step;
* the output is one RNE rounding, at most half a BF16 spacing of the result.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from oracles.moe import (
    assert_within_oracle,
    chunk_loop_golden,
    half_bf16_spacing,
    oracle64,
    torch_seed_golden,
)
from tilesim.reference import MOE_CASES, moe_grouped_gemm, moe_make_case, ulp_distance
from tilesim.reference.moe import (
    MoeTileRecord,
    moe_activation,
    moe_flop_count,
    moe_tile_schedule,
)
from tilesim.shared import MoeDims, MoeTiling, loop_unroll_chunks, to_bf16
from tilesim.shared.casts import BF16
from tilesim.shared.trace import check_record

BF = ml_dtypes.bfloat16
U32 = 2.0**-24


def _f64(a):
    return np.asarray(a).astype(np.float32).astype(np.float64)


def run(case, **over):
    params = dict(case["params"])
    params.update(over)
    return moe_grouped_gemm(**case["inputs"], **params)


def o1_case(activation="silu", layout="halves", seed=0, **kw):
    """O(1) data: unit-normal tokens, weights ~ 1/sqrt(fan-in), outputs O(1)."""
    kw.setdefault("counts", (30, 0, 50, 17))
    kw.setdefault("input_scale", 1.0 if activation == "silu" else 3.0)
    return moe_make_case(None, seed=seed, activation=activation, gate_up_layout=layout, **kw)


# --------------------------------------------------------------------------- loop nest model


@pytest.mark.parametrize("activation", ["silu", "swigluoai"])
@pytest.mark.parametrize("round_activation", [True, False])
def test_golden_equals_the_chunk_loop_written_out_with_fsum(activation, round_activation):
    """The whole loop nest, chunk by chunk, with math.fsum K-tile partials (oracles.moe)."""
    case = moe_make_case(
        None, seed=2, activation=activation, hidden_size=48, intermediate_size=32,
        counts=(5, 0, 3, 1), mm1_k=16, mm2_k=16, unroll=(1, 2, 4),
        input_scale=1.0 if activation == "silu" else 3.0, weight_scale=0.25,
        round_activation=round_activation,
    )  # fmt: skip
    unroll = case["params"]["tiling"].unroll
    want = chunk_loop_golden(case, lambda n: loop_unroll_chunks(n, unroll))
    assert run(case).tobytes() == want.tobytes()


# --------------------------------------------------------------------------- activation


def test_silu_activation_limits_and_formula():
    dims = MoeDims(1, 16, 3, "silu")
    gate = np.array([[-200.0, 0.0, 3.0]], dtype=np.float32)
    up = np.array([[2.0, 5.0, -1.5]], dtype=np.float32)
    a = moe_activation(np.concatenate([gate, up], axis=1), dims)
    assert a[0, 0] == 0 and np.signbit(a[0, 0])  # exp overflow -> -0 * 2 = -0
    assert a[0, 1] == 0
    want = 3.0 / (1.0 + math.exp(-3.0)) * -1.5
    assert abs(float(a[0, 2]) - want) <= 4 * U32 * abs(want)


def test_swigluoai_activation_clamps_gate_above_only_and_up_both_sides():
    dims = MoeDims(1, 16, 4, "swigluoai")
    gate = np.array([[7.0, 50.0, -30.0, 1.0]], dtype=np.float32)
    up = np.array([[0.5, 0.5, 0.5, -100.0]], dtype=np.float32)
    a = moe_activation(np.concatenate([gate, up], axis=1), dims).astype(np.float64)
    assert a[0, 0] == a[0, 1]  # gate 50 clamped to 7
    want_neg = (0.5 + 1.0) * -30.0 / (1.0 + math.exp(1.702 * 30.0))
    assert a[0, 2] != 0 and abs(a[0, 2] - want_neg) <= 80 * U32 * abs(want_neg)  # no lower clamp
    want_up = (-7.0 + 1.0) * 1.0 / (1.0 + math.exp(-1.702))  # up clamped to -7
    assert abs(a[0, 3] - want_up) <= 16 * U32 * abs(want_up)


def test_swigluoai_alpha_limit_beta_are_used():
    gu = np.array([[2.0, 9.0]], dtype=np.float32)  # I = 1: gate 2, up 9
    base = moe_activation(gu, MoeDims(1, 16, 1, "swigluoai"))
    other = moe_activation(gu, MoeDims(1, 16, 1, "swigluoai", alpha=1.0, limit=8.0, beta=0.5))
    want = (8.0 + 0.5) * 2.0 / (1.0 + math.exp(-2.0))
    assert abs(float(other[0, 0]) - want) <= 16 * U32 * want
    assert base[0, 0] != other[0, 0]


# --------------------------------------------------------------------------- vs float64 oracle


@pytest.mark.parametrize("activation", ["silu", "swigluoai"])
@pytest.mark.parametrize("layout", ["halves", "interleaved"])
@pytest.mark.parametrize("round_activation", [True, False])
def test_o1_data_within_derived_bound_of_float64_oracle(activation, layout, round_activation):
    case = o1_case(activation, layout, seed=11, round_activation=round_activation)
    y = run(case)
    d64 = assert_within_oracle(case, y)
    # headline: almost every element is the correctly rounded float64 result or 1 ULP off
    ulp = ulp_distance(y, d64.astype(np.float32).astype(BF))
    assert np.mean(ulp <= 1) >= 0.999, np.bincount(ulp.ravel())
    assert np.abs(d64).max() > 0.5  # O(1) outputs: the bound is not vacuous


def test_clamp_fires_in_o1_swiglu_data():
    case = o1_case("swigluoai", seed=11)
    d = case["params"]["dims"]
    x = _f64(case["inputs"]["sorted_tokens"])
    w13 = _f64(case["inputs"]["weights"][0])
    gu = x[:30] @ w13[: d.hidden_size]  # expert 0 (30 tokens)
    assert gu[:, : d.intermediate_size].max() > d.limit
    assert np.abs(gu[:, d.intermediate_size :]).max() > d.limit
    assert gu[:, : d.intermediate_size].min() < -d.limit  # gate below -limit passes unclamped


def test_interleaved_layout_equals_halves_on_permuted_columns():
    """mm1 columns are independent, so interleaving W13's columns + layout switch is bit-exact."""
    case = o1_case("swigluoai", seed=3)
    w13, w2 = case["inputs"]["weights"]
    i = case["params"]["dims"].intermediate_size
    cols = np.empty(2 * i, dtype=np.int64)
    cols[0::2] = np.arange(i)
    cols[1::2] = np.arange(i) + i
    inter = dict(case["inputs"], weights=(np.ascontiguousarray(w13[:, cols]), w2))
    dims_i = MoeDims(**{**case["params"]["dims"].__dict__, "gate_up_layout": "interleaved"})
    y_h = run(case)
    y_i = moe_grouped_gemm(**inter, **{**case["params"], "dims": dims_i})
    assert y_h.tobytes() == y_i.tobytes()


def test_round_activation_switch_changes_the_result():
    case = o1_case("silu", seed=4)
    a = run(case, round_activation=True)
    b = run(case, round_activation=False)
    assert a.tobytes() != b.tobytes()
    # rounding the activation moves each A element by <= 2^-9 relative: |a - b| is at most that
    # through |W2|, plus the two output roundings and the FP32 accumulation
    d64, parts = oracle64(case, round_activation=False)
    s2 = np.zeros_like(d64)
    for rows, act, *_rest, w2e in parts:
        s2[rows] = np.abs(act) @ np.abs(w2e)
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    allowed = half_bf16_spacing(a) + half_bf16_spacing(b) + (2.0**-9 + 2.0**-20) * s2 * 1.01
    assert (diff <= allowed).all()


# --------------------------------------------------------------------------- loop-nest properties


@pytest.mark.parametrize("activation", ["silu", "swigluoai"])
def test_chunk_split_does_not_change_bits(activation):
    case = o1_case(activation, seed=7, counts=(63, 0, 100, 3))
    ref = run(case, tiling=case["params"]["tiling"].replace(unroll=(63, 100, 3)))  # 1 chunk each
    for unroll in [(1,), (1, 2, 4), (1, 2, 4, 8, 16, 32, 64), (5, 7), (64,)]:
        got = run(case, tiling=case["params"]["tiling"].replace(unroll=unroll))
        assert got.tobytes() == ref.tobytes(), unroll


@pytest.mark.parametrize("activation", ["silu", "swigluoai"])
def test_k_tiles_only_change_fp32_summation_order(activation):
    """Any K tiling stays inside the oracle bound for that tiling; results differ by <= 1 ULP
    almost everywhere and the single-tile result is the float64 sum rounded once to FP32."""
    case = o1_case(activation, seed=8, hidden_size=512, intermediate_size=256, counts=(9, 20, 0, 4))
    results = {}
    for k1, k2 in [(16, 16), (48, 80), (128, 128), (512, 256)]:
        t = case["params"]["tiling"].replace(mm1_k=k1, mm2_k=k2)
        c = dict(case, params={**case["params"], "tiling": t})
        results[(k1, k2)] = y = run(c)
        assert_within_oracle(c, y)
    base = results[(128, 128)]
    for key, y in results.items():
        u = ulp_distance(y, base)
        assert np.mean(u == 0) > 0.9 and np.mean(u <= 1) > 0.999, (key, np.bincount(u.ravel()))


def test_n_and_vector_tiles_do_not_change_bits():
    case = o1_case("silu", seed=9)
    ref = run(case)
    t = case["params"]["tiling"].replace(mm1_n=16, mm2_n=32, vec_tile=16)
    assert run(case, tiling=t).tobytes() == ref.tobytes()


def test_permuting_experts_permutes_rows():
    case = o1_case("swigluoai", seed=10, counts=(5, 0, 7, 2))
    inp, d = case["inputs"], case["params"]["dims"]
    e, h, i = d.num_experts, d.hidden_size, d.intermediate_size
    cs = inp["expert_cumsum"]
    y = run(case)
    perm = [2, 3, 0, 1]  # new expert k is old expert perm[k]
    w13, w2 = inp["weights"]
    w13p = np.concatenate([w13[p * h : (p + 1) * h] for p in perm])
    w2p = np.concatenate([w2[p * i : (p + 1) * i] for p in perm])
    rows = np.concatenate([np.arange(cs[p], cs[p + 1]) for p in perm])
    counts = [int(cs[p + 1] - cs[p]) for p in perm]
    csp = np.array([0, *np.cumsum(counts)], dtype=np.int32)
    yp = moe_grouped_gemm(inp["sorted_tokens"][rows], (w13p, w2p), csp, **case["params"])
    assert yp.tobytes() == y[rows].tobytes()
    assert e == len(perm)


def test_zero_token_experts_are_skipped_even_with_nan_weights():
    case = o1_case("silu", seed=12, counts=(4, 0, 6, 0))
    inp, d = case["inputs"], case["params"]["dims"]
    h, i = d.hidden_size, d.intermediate_size
    w13, w2 = (w.copy() for w in inp["weights"])
    for e in (1, 3):
        w13[e * h : (e + 1) * h] = np.nan
        w2[e * i : (e + 1) * i] = np.nan
    seen = []
    y = moe_grouped_gemm(
        inp["sorted_tokens"], (w13, w2), inp["expert_cumsum"], **case["params"], trace=seen.append
    )
    assert np.isfinite(y.astype(np.float32)).all()
    assert {r["lane"]["expert"] for r in seen} == {0, 2}
    assert y.tobytes() == run(case).tobytes()


def test_empty_input_and_all_zero_counts():
    dims = MoeDims(3, 32, 16, "silu")
    w13 = np.zeros((96, 32), dtype=BF)
    w2 = np.zeros((48, 32), dtype=BF)
    y = moe_grouped_gemm(np.zeros((0, 32), dtype=BF), (w13, w2), np.zeros(4, np.int32), dims)
    assert y.shape == (0, 32) and y.dtype == BF
    x = to_bf16(np.ones((5, 32), np.float32))
    out = to_bf16(np.full((5, 32), 3.0, np.float32))
    got = moe_grouped_gemm(x, (w13, w2), np.zeros(4, np.int32), dims, out=out)
    assert got is out and (out.astype(np.float32) == 3.0).all()


def test_out_rows_outside_cumsum_are_preserved_and_fresh_output_is_zero():
    case = o1_case("silu", seed=13, counts=(3, 0, 2, 1))
    inp = dict(case["inputs"])
    x = inp["sorted_tokens"]
    pad = np.concatenate([x, to_bf16(np.ones((4, x.shape[1]), np.float32))])  # 4 uncovered rows
    inp["sorted_tokens"] = pad
    fresh = moe_grouped_gemm(**inp, **case["params"])
    assert (fresh[6:].astype(np.float32) == 0).all()
    out = to_bf16(np.full(pad.shape, -7.0, np.float32))
    got = moe_grouped_gemm(**inp, **case["params"], out=out)
    assert got is out
    assert (out[6:].astype(np.float32) == -7.0).all()
    assert out[:6].tobytes() == fresh[:6].tobytes() == run(case).tobytes()


def test_deterministic_and_inputs_unmodified():
    case = o1_case("swigluoai", seed=14)
    inp = case["inputs"]
    before = [inp["sorted_tokens"].copy(), *(w.copy() for w in inp["weights"])]
    cs_before = inp["expert_cumsum"].copy()
    a = run(case)
    b = run(case)
    assert a.tobytes() == b.tobytes()
    after = [inp["sorted_tokens"], *inp["weights"]]
    for x0, x1 in zip(before, after, strict=True):
        assert x0.tobytes() == x1.tobytes()
    assert (cs_before == inp["expert_cumsum"]).all()


# --------------------------------------------------------------------------- schedule / trace


def test_trace_follows_loop_unroll_and_schedule():
    case = o1_case("silu", seed=15, counts=(63, 0, 100, 3), hidden_size=32, intermediate_size=16)
    seen = []
    run(case, trace=seen.append)
    for r in seen:
        check_record(r)
    sizes = [(r["lane"]["expert"], r["extra"]["chunk"]) for r in seen]
    assert sizes == [(0, 32), (0, 16), (0, 8), (0, 4), (0, 2), (0, 1), (2, 64), (2, 32), (2, 4),
                     (3, 2), (3, 1)]  # fmt: skip
    assert [r["step"] for r in seen] == [0, 1, 2, 3, 4, 5, 0, 1, 2, 0, 1]
    assert all(r["op"] == "moe_grouped_gemm" for r in seen)
    assert [r["key_range"] for r in seen][:3] == [(0, 32), (32, 48), (48, 56)]
    assert seen[6]["key_range"] == (63, 127) and seen[7]["extra"]["token_offset"] == 64
    assert seen[7]["key_range"][0] == 127
    assert all(r["keys_used"] == r["extra"]["chunk"] for r in seen)
    assert all(r["row_max"] is None and r["row_sum"] is None for r in seen)
    # per chunk: mm1 [tb, 32] @ [32, 32] and mm2 [tb, 16] @ [16, 32], 2 FLOPs per multiply-add
    assert all(r["flop"] == r["keys_used"] * (2 * 32 * 32 + 2 * 16 * 32) for r in seen)
    sched = moe_tile_schedule(case["inputs"]["expert_cumsum"], case["params"]["tiling"].unroll)
    assert [s.as_trace(case["params"]["dims"]) for s in sched] == seen
    assert isinstance(sched[0], MoeTileRecord)


def test_flop_count_is_the_sum_of_the_trace_and_the_published_m27_figure():
    case = o1_case("swigluoai", seed=5, counts=(7, 0, 9, 2), hidden_size=64, intermediate_size=32)
    seen = []
    run(case, trace=seen.append)
    cs, dims = case["inputs"]["expert_cumsum"], case["params"]["dims"]
    assert moe_flop_count(cs, dims) == sum(r["flop"] for r in seen) == 18 * 6 * 64 * 32
    # m27_case_001: 63 rows, H 3072, I 1536, about 1.8 GFLOP
    m27 = MoeDims(8, 3072, 1536)
    cs27 = np.concatenate([[0], np.cumsum([0, 1, 2, 4, 8, 16, 32, 0])]).astype(np.int32)
    assert 1.7e9 < moe_flop_count(cs27, m27) < 1.9e9
    with pytest.raises(ValueError, match="non-decreasing"):
        moe_flop_count(np.array([0, 3, 2], np.int32), MoeDims(2, 32, 16))


def test_tiling_none_reads_env_at_call_time(monkeypatch):
    case = o1_case("silu", seed=16, counts=(3, 0, 2, 1), hidden_size=32, intermediate_size=16)
    params = {**case["params"], "tiling": None}
    monkeypatch.setenv("PYPTO_UNROLL", "1")
    seen = []
    moe_grouped_gemm(**case["inputs"], **params, trace=seen.append)
    assert [r["extra"]["chunk"] for r in seen] == [1] * 6
    monkeypatch.setenv("PYPTO_UNROLL", "1,2,4")
    seen.clear()
    moe_grouped_gemm(**case["inputs"], **params, trace=seen.append)
    assert [r["extra"]["chunk"] for r in seen] == [2, 1, 2, 1]


# --------------------------------------------------------------------------- bad input


def _read_only(a):
    a.flags.writeable = False
    return a


def _small():
    case = moe_make_case(None, seed=1, hidden_size=32, intermediate_size=16, counts=(2, 0, 1, 1))
    return case["inputs"], case["params"]


@pytest.mark.parametrize(
    "mutate, exc, match",
    [
        (lambda i, p: i.update(sorted_tokens=i["sorted_tokens"].astype(np.float32)), TypeError,
         "sorted_tokens: expected dtype bfloat16"),
        (lambda i, p: i.update(sorted_tokens=i["sorted_tokens"][None]), ValueError,
         "sorted_tokens: expected a 2-D"),
        (lambda i, p: i.update(sorted_tokens=i["sorted_tokens"][:, :16]), ValueError,
         "sorted_tokens: expected shape \\(\\*, 32\\) \\[N_total, H\\]"),
        (lambda i, p: i.update(sorted_tokens=[[1.0]]), TypeError,
         "sorted_tokens: expected a numpy array or a torch tensor, got list"),
        (lambda i, p: i.update(weights=i["weights"][0]), TypeError, "weights: expected a"),
        (lambda i, p: i.update(weights=(i["weights"][0],)), TypeError, "of length 1"),
        (lambda i, p: i.update(weights=(i["weights"][0].astype(np.float32), i["weights"][1])),
         TypeError, "w13_flat: expected dtype bfloat16"),
        (lambda i, p: i.update(weights=(i["weights"][0][:-1], i["weights"][1])), ValueError,
         "w13_flat: expected shape \\(128, 32\\) \\[E\\*H, 2I\\]"),
        (lambda i, p: i.update(weights=(i["weights"][0], i["weights"][1][:, :-1])), ValueError,
         "w2_flat: expected shape \\(64, 32\\) \\[E\\*I, H\\]"),
        (lambda i, p: i.update(weights=(i["weights"][0], i["weights"][1].astype(np.float16))),
         TypeError, "w2_flat: expected dtype bfloat16"),
        (lambda i, p: i.update(expert_cumsum=i["expert_cumsum"].astype(np.int64)), TypeError,
         "expert_cumsum: expected dtype int32"),
        (lambda i, p: i.update(expert_cumsum=i["expert_cumsum"][:-1]), ValueError,
         "expert_cumsum: expected length E\\+1 = 5"),
        (lambda i, p: i.update(expert_cumsum=i["expert_cumsum"] + np.int32(1)), ValueError,
         "expected expert_cumsum\\[0\\] == 0, got 1"),
        (lambda i, p: i.update(expert_cumsum=np.array([0, 2, 1, 3, 4], np.int32)), ValueError,
         "non-decreasing"),
        (lambda i, p: i.update(expert_cumsum=np.array([0, 2, 2, 3, 5], np.int32)), ValueError,
         "last value <= N_total = 4, got 5"),
        (lambda i, p: i.update(expert_cumsum=i["expert_cumsum"][None]), ValueError,
         "expert_cumsum: expected a 1-D"),
        (lambda i, p: p.update(dims=(4, 32, 16)), TypeError, "dims: expected"),
        (lambda i, p: p.update(tiling="default"), TypeError, "tiling: expected"),
        (lambda i, p: p.update(round_activation=1), TypeError, "round_activation"),
        (lambda i, p: p.update(trace=3), TypeError, "trace: expected a callable"),
        (lambda i, p: p.update(out=np.zeros((4, 32), np.float32)), TypeError,
         "out: expected dtype bfloat16"),
        (lambda i, p: p.update(out=np.zeros((5, 32), BF)), ValueError, "out: expected shape"),
        (lambda i, p: p.update(out=i["sorted_tokens"]), ValueError,
         "out: expected memory of its own, got memory shared with sorted_tokens"),
        (lambda i, p: p.update(out=_read_only(np.zeros((4, 32), BF))), ValueError,
         "out: expected a writeable"),
        (lambda i, p: p.update(round_activation="yes"), TypeError,
         "round_activation: expected a bool"),
        (lambda i, p: i.update(weights=[i["weights"][0].tolist(), i["weights"][1]]), TypeError,
         "w13_flat: expected a numpy array or a torch tensor, got list"),
    ],
)  # fmt: skip
def test_bad_inputs_raise_clear_errors(mutate, exc, match):
    """Every bad argument is named; trace is checked with the rest, before any work."""
    inp, params = _small()
    mutate(inp, params)
    with pytest.raises(exc, match=match):
        moe_grouped_gemm(**inp, **params)


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("activation", "gelu", "dims.activation: expected one of"),
        ("alpha", float("nan"), "dims.alpha: expected a finite number"),
        ("limit", float("inf"), "dims.limit: expected a finite number"),
        ("beta", float("-inf"), "dims.beta: expected a finite number"),
        ("gate_up_layout", "rows", "dims.gate_up_layout"),
    ],
)
def test_bad_dims_fields_are_rejected_even_if_moedims_was_bypassed(field, value, match):
    inp, params = _small()
    dims = MoeDims(4, 32, 16, "swigluoai")
    object.__setattr__(dims, field, value)  # bypass MoeDims' own checks
    with pytest.raises(ValueError, match=match):
        moe_grouped_gemm(**inp, dims=dims, tiling=params["tiling"])


def test_moedims_itself_rejects_unknown_activation_and_non_finite():
    with pytest.raises(ValueError, match="activation"):
        MoeDims(4, 32, 16, "relu")
    with pytest.raises(ValueError, match="alpha"):
        MoeDims(4, 32, 16, "swigluoai", alpha=float("nan"))


def test_swiglu_tiling_override_must_agree_with_dims(monkeypatch):
    inp, _ = _small()
    dims = MoeDims(4, 32, 16, "swigluoai")
    with pytest.raises(ValueError, match="tiling.swiglu_alpha: expected the default 1.702 or dims"):
        moe_grouped_gemm(**inp, dims=dims, tiling=MoeTiling(swiglu_alpha=1.5))
    monkeypatch.setenv("PYPTO_SWIGLU_LIMIT", "6.0")
    with pytest.raises(ValueError, match="tiling.swiglu_limit: .*got 6.0 \\(PYPTO_SWIGLU_LIMIT\\)"):
        moe_grouped_gemm(**inp, dims=dims)
    dims6 = MoeDims(4, 32, 16, "swigluoai", limit=6.0)
    moe_grouped_gemm(**inp, dims=dims6)  # agreeing override is fine
    # a default tiling never conflicts: dims carries the activation constants
    moe_grouped_gemm(**inp, dims=MoeDims(4, 32, 16, "swigluoai", alpha=1.0), tiling=MoeTiling())


# --------------------------------------------------------------------------- interop


@pytest.mark.torch
def test_torch_tensors_in_torch_tensor_out():
    import torch
    from tilesim.shared.interop import to_numpy, to_torch

    case = o1_case("swigluoai", seed=17, hidden_size=64, intermediate_size=32)
    inp = case["inputs"]
    y = run(case)
    yt = moe_grouped_gemm(
        to_torch(inp["sorted_tokens"]),
        tuple(to_torch(w) for w in inp["weights"]),
        to_torch(inp["expert_cumsum"]),
        **case["params"],
    )
    assert isinstance(yt, torch.Tensor) and yt.dtype == torch.bfloat16
    assert to_numpy(yt).tobytes() == y.tobytes()
    # the first array argument decides: NumPy tokens with torch weights give NumPy
    y_np = moe_grouped_gemm(inp["sorted_tokens"], tuple(to_torch(w) for w in inp["weights"]),
                            to_torch(inp["expert_cumsum"]), **case["params"])  # fmt: skip
    assert isinstance(y_np, np.ndarray) and y_np.tobytes() == y.tobytes()
    # a non-contiguous torch `out` is written back and returned; untouched rows are kept
    n, h = y.shape
    big = torch.full((h, n + 2), 5.0, dtype=torch.bfloat16)
    out_t = big.t()[:n]  # [n, h] view, not contiguous
    assert not out_t.is_contiguous()
    got = moe_grouped_gemm(inp["sorted_tokens"], inp["weights"], inp["expert_cumsum"],
                           **case["params"], out=out_t)  # fmt: skip
    assert got is out_t
    assert to_numpy(out_t).tobytes() == y.tobytes()
    assert bool((big.t()[n:] == 5.0).all())


@pytest.mark.torch
def test_torch_out_sharing_an_input_is_rejected():
    from tilesim.shared.interop import to_torch

    inp, params = _small()
    x_t = to_torch(inp["sorted_tokens"])
    with pytest.raises(ValueError, match="out: expected memory of its own"):
        moe_grouped_gemm(x_t, inp["weights"], inp["expert_cumsum"], **params, out=x_t)


# --------------------------------------------------------------------------- the seeds' cases


@pytest.fixture(scope="module")
def case_001():
    """The seeds' M2.7 case and the kernel emulation's output."""
    case = moe_make_case("m27_case_001")
    return case, run(case)


@pytest.mark.torch
def test_m27_case_001_at_seed_tolerance(case_001):
    case, y = case_001  # y: the kernel emulation (activation rounded to BF16)
    spec = MOE_CASES["m27_case_001"]
    assert y.shape == (63, 3072)
    golden = torch_seed_golden(case, round_activation=spec["seed_golden_round_activation"])
    np.testing.assert_allclose(
        y.astype(np.float32), golden.astype(np.float32), rtol=spec["rtol"], atol=spec["atol"]
    )
    # the seed tolerance is vacuous at this data scale: every |output| is far below atol
    assert np.abs(golden.astype(np.float32)).max() < spec["atol"] / 4
    # ... so judge in ULPs against the same procedure with the same activation rounding
    # (torch's FP32 GEMMs sum in another order: a few elements differ by 1-3 ULP)
    u = ulp_distance(run(case, round_activation=False), golden)
    assert np.mean(u == 0) > 0.999 and np.mean(u <= 1) > 0.9999, np.bincount(u.ravel())


@pytest.mark.slow
@pytest.mark.torch
def test_m27_case_001_kernel_emulation_vs_torch_with_rounded_activation(case_001):
    # with the activation rounded to BF16 on both sides, an FP32 difference of the activation
    # can flip one BF16 rounding and move a whole output row a little (~0.8% of the elements
    # off by >= 1 ULP here); the rigorous check is test_case_001_within_oracle_bound
    case, y = case_001
    u = ulp_distance(y, torch_seed_golden(case, round_activation=True))
    assert np.mean(u == 0) > 0.98 and np.mean(u <= 1) > 0.99, np.bincount(u.ravel())


@pytest.mark.torch
def test_m3_case_smoke_edge_at_seed_tolerance_and_clamp_fires():
    import torch
    import torch.nn.functional as F
    from tilesim.shared import unconvert_minimax_weights
    from tilesim.shared.interop import to_torch

    spec = MOE_CASES["m3_case_smoke_edge"]
    case = moe_make_case("m3_case_smoke_edge")
    d = case["params"]["dims"]
    assert case["params"]["tiling"].unroll == (4, 2, 1)
    y = run(case)
    assert y.shape == (8, 256)
    golden = torch_seed_golden(case, round_activation=True)
    np.testing.assert_allclose(
        y.astype(np.float32), golden.astype(np.float32), rtol=spec["rtol"], atol=spec["atol"]
    )
    u = ulp_distance(y, golden)
    assert np.mean(u == 0) > 0.99 and u.max() <= 1, np.bincount(u.ravel())
    # assert_clamp: expert 0's mm1 over ALL tokens exceeds the limit in gate and |up|
    gate_up, _ = unconvert_minimax_weights(*case["inputs"]["weights"], d.num_experts)
    gu = F.linear(to_torch(case["inputs"]["sorted_tokens"]).float(), to_torch(gate_up)[0].float())
    assert float(gu[:, : d.intermediate_size].max()) > d.limit
    assert float(gu[:, d.intermediate_size :].abs().max()) > d.limit
    assert torch.isfinite(gu).all()
    assert_within_oracle(case, y)


@pytest.mark.slow
def test_case_001_within_oracle_bound(case_001):
    """The derived float64 bound also holds on the full-size M2.7 case."""
    case, y = case_001
    assert_within_oracle(case, y)


def test_shared_contract_meta_values_plan_cost():
    """``tilesim.shared.moe`` exports the five-part contract; ``check_meta`` runs on meta
    tensors (no value read), ``check_values`` catches what it cannot see, ``cost`` counts."""
    import torch
    from tilesim.shared import moe as contract

    for name in ("Args", "check_meta", "check_values", "host_plan", "cost"):
        assert name in contract.__all__ and callable(getattr(contract, name))
    dims = MoeDims(3, 32, 16)

    def meta(shape, dtype):
        return torch.empty(shape, dtype=dtype, device="meta")

    w = (meta((3 * 32, 32), torch.bfloat16), meta((3 * 16, 32), torch.bfloat16))
    cs_meta = meta((4,), torch.int32)
    args = contract.check_meta(meta((10, 32), torch.bfloat16), w, cs_meta, dims, None, None,
                               True, None)  # fmt: skip
    assert args.n_total == 10 and args.cs is None
    with pytest.raises(ValueError, match="expected length E\\+1 = 4"):
        contract.check_meta(meta((10, 32), torch.bfloat16), w, meta((3,), torch.int32), dims,
                            None, None, True, None)  # fmt: skip
    x = np.zeros((10, 32), BF16)
    wn = (np.zeros((96, 32), BF16), np.zeros((48, 32), BF16))
    for cs, msg in (([0, 4, 9, 11], "last value <= N_total = 10, got 11"),
                    ([0, 5, 3, 9], "non-decreasing"), ([1, 2, 3, 4], "\\[0\\] == 0")):  # fmt: skip
        a = contract.check_meta(x, wn, np.array(cs, np.int32), dims, None, None, True, None)
        with pytest.raises(ValueError, match=msg):
            contract.check_values(a)
    a = contract.check_values(
        contract.check_meta(x, wn, np.array([0, 4, 4, 9], np.int32), dims, None, None, True, None)
    )
    a = a._replace(tiling=contract.resolve_tiling(MoeTiling(unroll=(4, 1)), a.dims))
    plan = contract.host_plan(a)
    assert [(r.expert, r.row0, r.chunk) for r in plan] == [(0, 0, 4), (2, 4, 4), (2, 8, 1)]
    got = contract.cost(a)
    assert got["flop"] == 9 * (2 * 32 * 32 + 2 * 16 * 32)  # 9 routed rows, mm1 + mm2
    # 9 rows in + 9 rows out (BF16), 2 experts' weights (BF16), the INT32 cumsum
    assert got["bytes"] == 2 * 9 * 32 * 2 + 2 * 2 * (32 * 32 + 16 * 32) + 4 * 4
