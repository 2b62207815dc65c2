"""The MoE speed path (``tilesim.reference.moe._FAST``): every expert's rows in one product,
BF16 weights widened one K tile at a time (``matmul_fp32_widening``), experts on the
reference worker pool. It must give the plain chunk loop's bits and trace records, whatever
the worker count, the tiling and the rounding options. No timing here (see tests/bench)."""

from __future__ import annotations

import pytest
import tilesim.reference.moe as moe_mod
from tilesim.reference import moe_grouped_gemm, moe_make_case


def _both(case, monkeypatch, **over):
    params = {**case["params"], **over}
    out = {}
    for fast in (False, True):
        seen = []
        monkeypatch.setattr(moe_mod, "_FAST", fast)
        res = moe_grouped_gemm(**case["inputs"], **params, trace=seen.append)
        out[fast] = (res.tobytes(), seen)
    return out[False], out[True]


@pytest.mark.parametrize("workers", ["1", "2", "3"])
@pytest.mark.parametrize(
    ("activation", "layout", "round_activation"),
    [("silu", "halves", True), ("swigluoai", "interleaved", True), ("silu", "halves", False)],
)
def test_speed_path_equals_the_chunk_loop(
    activation, layout, round_activation, workers, monkeypatch
):
    monkeypatch.setenv("TILESIM_REF_THREADS", workers)
    case = moe_make_case(
        None, seed=31, activation=activation, gate_up_layout=layout, hidden_size=384,
        intermediate_size=160, num_experts=6, counts=(1, 0, 45, 2, 0, 9), unroll=(8, 4, 1),
        input_scale=1.0 if activation == "silu" else 3.0, round_activation=round_activation,
    )  # fmt: skip
    plain, fast = _both(case, monkeypatch)
    assert fast[0] == plain[0]
    assert fast[1] == plain[1] and len(plain[1]) > 4  # the chunk schedule, in order


def test_speed_path_with_short_last_k_tiles_and_out(monkeypatch):
    """K not a multiple of the K tiles (mm1_k 96 over H 160, mm2_k 64 over I 80); an ``out``
    keeps the rows no expert owns."""
    import numpy as np

    case = moe_make_case(None, seed=5, hidden_size=160, intermediate_size=80,
                         counts=(3, 7, 0, 1), mm1_k=96, mm2_k=64)  # fmt: skip
    n = int(case["inputs"]["expert_cumsum"][-1])
    res = {}
    for fast in (False, True):
        monkeypatch.setattr(moe_mod, "_FAST", fast)
        out = np.full((n + 2, 160), 7, dtype=case["inputs"]["sorted_tokens"].dtype)
        tokens = np.concatenate([case["inputs"]["sorted_tokens"], out[:2]])
        moe_grouped_gemm(**{**case["inputs"], "sorted_tokens": tokens}, **case["params"], out=out)
        res[fast] = out
    assert res[True].tobytes() == res[False].tobytes()
    assert (res[True][n:].astype(np.float32) == 7).all()
    assert (res[True][:n].astype(np.float32) != 7).any()
