"""MOE_CASES / CASE_INFO / moe_make_case: the seeds' matrix (hicann/pypto-gym,
tests/ops/minimax_m27/test_cases.json and tests/ops/minimax_m3/test_cases.json; docs/ops/moe.md),
the case schema, the data rule, overrides and parameter checks."""

from __future__ import annotations

import numpy as np
import pytest
import tilesim.reference as ref
from tilesim.reference import MOE_CASES, moe_grouped_gemm, moe_make_case
from tilesim.reference.cases.moe import CASE_INFO, scaled_bf16_normal
from tilesim.shared import MoeDims, unconvert_minimax_weights
from tilesim.shared.registry.case_schema import CASE_KEYS, CaseInfo


def test_seed_matrix_values():
    m27 = MOE_CASES["m27_case_001"]
    assert (m27["num_experts"], m27["hidden_size"], m27["intermediate_size"]) == (8, 3072, 1536)
    assert m27["counts"] == (0, 1, 2, 4, 8, 16, 32, 0) and sum(m27["counts"]) == 63
    assert (m27["seed"], m27["input_scale"], m27["weight_scale"]) == (321, 0.02, 0.02)
    assert (m27["rtol"], m27["atol"], m27["activation"]) == (0.008, 0.008, "silu")
    m3 = MOE_CASES["m3_case_smoke_edge"]
    assert (m3["num_experts"], m3["hidden_size"], m3["intermediate_size"]) == (4, 256, 128)
    assert m3["counts"] == (1, 0, 3, 4)
    assert (m3["seed"], m3["input_scale"], m3["weight_scale"]) == (99, 0.5, 0.3)
    assert (m3["rtol"], m3["atol"], m3["activation"]) == (0.015, 0.5, "swigluoai")
    assert tuple(sorted(m3["unroll"])) == (1, 2, 4) and m3["assert_clamp"]


def test_lazy_public_names():
    assert ref.MOE_CASES is MOE_CASES
    assert ref.moe_make_case is moe_make_case
    assert {"MOE_CASES", "moe_make_case"} <= set(dir(ref))


def test_case_splats_into_the_op_and_has_the_seed_shapes():
    case = moe_make_case("m3_case_smoke_edge")
    inp, p = case["inputs"], case["params"]
    assert set(inp) == {"sorted_tokens", "weights", "expert_cumsum"}
    assert set(p) == {"dims", "tiling", "round_activation"}
    assert tuple(case) == CASE_KEYS
    assert (case["name"], case["op"]) == ("m3_case_smoke_edge", "moe_grouped_gemm")
    # the seeds' assert_allclose: every element within atol + rtol*|g|
    assert case["tolerance"] == {"atol": 0.5, "rtol": 0.015, "ratio": 0.0, "mode": "compare"}
    assert inp["sorted_tokens"].shape == (8, 256)
    assert inp["weights"][0].shape == (4 * 256, 256) and inp["weights"][1].shape == (4 * 128, 256)
    assert inp["expert_cumsum"].dtype == np.int32
    assert inp["expert_cumsum"].tolist() == [0, 1, 1, 4, 8]
    assert p["dims"] == MoeDims(4, 256, 128, "swigluoai")
    assert p["tiling"].unroll == (4, 2, 1) and p["tiling"].vec_tile == 256
    assert p["round_activation"] is True
    y = moe_grouped_gemm(**inp, **p)
    assert y.shape == (8, 256)


@pytest.mark.torch
def test_data_rule_is_bf16_randn_times_python_float_in_torch():
    """bf16(fp32(x) * fp32(scale)) is what `randn(..., dtype=bf16) * 0.3` does in torch."""
    from tilesim.shared.interop import to_numpy, to_torch

    rng = np.random.default_rng(3)
    got = scaled_bf16_normal(rng, (64, 96), 0.3)
    base = to_bf16_ref(np.random.default_rng(3).standard_normal((64, 96), dtype=np.float32))
    want = to_numpy(to_torch(base) * 0.3)
    assert want.dtype == got.dtype
    assert got.tobytes() == want.tobytes()


def to_bf16_ref(a32: np.ndarray) -> np.ndarray:
    """FP32 -> BF16 by torch (independent of tilesim's cast)."""
    import torch
    from tilesim.shared.interop import to_numpy

    return to_numpy(torch.from_numpy(a32).to(torch.bfloat16))


def test_draw_order_and_layout():
    """Tokens, then gate_up_proj [E,2I,H], then down_proj [E,H,I], in kernel layout."""
    case = moe_make_case(None, seed=5, counts=(2, 1, 0, 3), hidden_size=32, intermediate_size=16)
    rng = np.random.default_rng(5)
    tok = scaled_bf16_normal(rng, (6, 32), 1.0)
    gu = scaled_bf16_normal(rng, (4, 32, 32), 0.0625)
    dn = scaled_bf16_normal(rng, (4, 32, 16), 0.0625)
    assert case["inputs"]["sorted_tokens"].tobytes() == tok.tobytes()
    gu2, dn2 = unconvert_minimax_weights(*case["inputs"]["weights"], 4)
    assert gu2.tobytes() == gu.tobytes() and dn2.tobytes() == dn.tobytes()


def test_determinism_seed_override_and_custom_defaults():
    a = moe_make_case(None)
    b = moe_make_case(None)
    c = moe_make_case(None, seed=1)
    assert a["inputs"]["sorted_tokens"].tobytes() == b["inputs"]["sorted_tokens"].tobytes()
    assert a["inputs"]["sorted_tokens"].tobytes() != c["inputs"]["sorted_tokens"].tobytes()
    assert c["meta"]["seed"] == 1 and a["name"] is None and a["op"] == "moe_grouped_gemm"
    # no published tolerance for a custom case: the op's ULP budget judges it
    assert a["tolerance"] == {"atol": None, "rtol": None, "ratio": 0.0, "mode": "ulp"}
    m3 = moe_make_case("m3_case_smoke_edge", seed=100)
    assert m3["meta"]["seed"] == 100 and m3["tolerance"]["atol"] == 0.5
    given = moe_make_case(None, rtol=0.01, atol=0.02)["tolerance"]
    assert given == {"atol": 0.02, "rtol": 0.01, "ratio": 0.0, "mode": "compare"}


def test_overrides_reach_dims_and_tiling():
    case = moe_make_case(
        None, activation="swigluoai", alpha=1.5, limit=6.0, beta=0.5,
        gate_up_layout="interleaved", mm1_k=64, mm2_k=32, unroll=(1, 8), round_activation=False,
    )  # fmt: skip
    d, t = case["params"]["dims"], case["params"]["tiling"]
    assert (d.alpha, d.limit, d.beta, d.gate_up_layout) == (1.5, 6.0, 0.5, "interleaved")
    assert (t.mm1_k, t.mm2_k, t.unroll) == (64, 32, (8, 1))
    assert (t.swiglu_alpha, t.swiglu_limit) == (1.5, 6.0)  # consistent with dims
    assert case["params"]["round_activation"] is False
    moe_grouped_gemm(**case["inputs"], **case["params"])  # consistent: runs


@pytest.mark.parametrize(
    "name, kw, exc, match",
    [
        ("nope", {}, ValueError, "name: expected None or one of"),
        (3, {}, ValueError, "name: expected None or one of"),
        (None, {"colour": 3}, ValueError, "unknown parameter"),
        (None, {"counts": (1, 2)}, ValueError, "counts: expected 4 non-negative ints"),
        (None, {"counts": (1, -2, 0, 0)}, ValueError, "counts\\[1\\]: expected an int in \\[0"),
        (None, {"counts": (1, 2.5, 0, 0)}, TypeError, "counts\\[1\\]: expected an int, got float"),
        (None, {"counts": ("1", 2, 0, 0)}, TypeError, "counts\\[0\\]: expected an int, got str"),
        (None, {"counts": "1200"}, TypeError, "counts: expected a tuple"),
        (None, {"activation": "gelu"}, ValueError, "activation: expected one of"),
        (None, {"seed": True}, TypeError, "seed: expected an int, got bool"),
        (None, {"seed": -1}, ValueError, "seed: expected an int in \\[0"),
        (None, {"seed": 1.5}, TypeError, "seed: expected an int"),
        (None, {"input_scale": float("nan")}, ValueError, "input_scale: expected a finite"),
        (None, {"weight_scale": "0.1"}, TypeError, "weight_scale: expected a real number"),
        (None, {"weight_scale": 1e300}, ValueError, "weight_scale: expected a value FP32"),
        (None, {"hidden_size": 0}, ValueError, "hidden_size: expected an int in \\[1"),
        (None, {"num_experts": 2.0}, TypeError, "num_experts: expected an int"),
        (None, {"rtol": -0.1}, ValueError, "rtol: expected a number >= 0"),
        (None, {"unroll": (1, True)}, TypeError, "unroll\\[1\\]: expected an int, got bool"),
        (None, {"round_activation": 1}, TypeError, "round_activation: expected a bool"),
        (None, {"progress": "yes"}, TypeError, "progress: expected a bool"),
    ],
)  # fmt: skip
def test_bad_case_requests(name, kw, exc, match):
    kw = dict(kw)
    progress = kw.pop("progress", None)
    with pytest.raises(exc, match=match):
        moe_make_case(name, progress=progress, **kw)


@pytest.mark.parametrize("progress", [None, True, False])
def test_progress_is_accepted_and_changes_nothing(progress):
    a = moe_make_case(None, progress=progress, hidden_size=32, intermediate_size=16)
    b = moe_make_case(None, hidden_size=32, intermediate_size=16)
    assert a["inputs"]["sorted_tokens"].tobytes() == b["inputs"]["sorted_tokens"].tobytes()


def test_case_info_describes_the_named_cases():
    """CASE_INFO holds the seeds' published values (test_cases.json of both seed tests)."""
    assert set(CASE_INFO) == set(MOE_CASES) == {"m27_case_001", "m3_case_smoke_edge"}
    m27, m3 = CASE_INFO["m27_case_001"], CASE_INFO["m3_case_smoke_edge"]
    assert isinstance(m27, CaseInfo)
    assert (m27.family, m27.op, m27.model, m27.seed) == (
        "moe", "moe_grouped_gemm", "MiniMax-M2.7", 321
    )  # fmt: skip
    assert m27.tolerance == {"atol": 0.008, "rtol": 0.008, "ratio": 0.0, "mode": "compare"}
    assert (m3.model, m3.seed, m3.size) == ("MiniMax-M3", 99, "small")
    assert m3.tolerance == {"atol": 0.5, "rtol": 0.015, "ratio": 0.0, "mode": "compare"}
    for name, info in CASE_INFO.items():
        assert (info.name, info.kind, info.soc, info.status) == (name, "", (), "runs")
        assert "910B" in info.notes["soc_note"]
        module, func = info.builder.split(":")
        import importlib

        builder = getattr(importlib.import_module(module), func)
        assert builder is moe_make_case
