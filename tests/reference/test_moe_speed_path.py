"""The MoE speed path (:mod:`tilesim.reference._moe_fast`, chosen by the one switch
``tilesim.reference.moe._FAST``): every expert's rows in one product, BF16 weights widened one
K tile at a time, experts on the reference worker pool. On every named case (the big one with
reduced sizes, as tests/digests/golden_digests.py reduces them) and on a few custom ones
(interleaved gate/up, FP32 activation, short last K tiles with an ``out`` whose extra rows no
expert owns), it must give the golden chunk loop's bits and trace records. No timing here."""

from __future__ import annotations

import numpy as np
import pytest
import tilesim.reference.moe as moe_mod
from tilesim.reference import MOE_CASES, moe_grouped_gemm, moe_make_case

#: named cases, reduced where the plain loop would be slow (H, I of m27 / 8; seed and counts kept)
_REDUCED = {"m27_case_001": {"hidden_size": 384, "intermediate_size": 192}}
_CUSTOM = {
    "custom_swigluoai_interleaved": dict(
        seed=31, activation="swigluoai", gate_up_layout="interleaved", hidden_size=384,
        intermediate_size=160, num_experts=6, counts=(1, 0, 45, 2, 0, 9), unroll=(8, 4, 1),
        input_scale=3.0,
    ),
    "custom_round_activation_false": dict(seed=32, counts=(9, 0, 17), num_experts=3,
                                          round_activation=False),
    "custom_short_k_tiles": dict(seed=5, hidden_size=160, intermediate_size=80,
                                 counts=(3, 7, 0, 1), mm1_k=96, mm2_k=64),
}  # fmt: skip


def _case(name: str) -> dict:
    if name in MOE_CASES:
        return moe_make_case(name, **_REDUCED.get(name, {}))
    return moe_make_case(None, **_CUSTOM[name])


def _run(case: dict, fast: bool, monkeypatch) -> tuple[bytes, list]:
    """Output bytes (an ``out`` of two extra rows past ``c[E]``, filled with 7) and records."""
    monkeypatch.setattr(moe_mod, "_FAST", fast)
    x = case["inputs"]["sorted_tokens"]
    n = x.shape[0]
    out = np.full((n + 2, x.shape[1]), 7, dtype=x.dtype)
    tokens = np.concatenate([x, out[:2]])
    seen = []
    moe_grouped_gemm(**{**case["inputs"], "sorted_tokens": tokens}, **case["params"], out=out,
                     trace=seen.append)  # fmt: skip
    assert (out[n:].astype(np.float32) == 7).all()  # rows no expert owns keep their values
    return out.tobytes(), seen


@pytest.mark.parametrize("name", [*MOE_CASES, *_CUSTOM])
def test_speed_path_is_bit_equal_to_the_golden_loop(name, monkeypatch):
    monkeypatch.setenv("TILESIM_REF_THREADS", "3")
    case = _case(name)
    plain, fast = _run(case, False, monkeypatch), _run(case, True, monkeypatch)
    assert fast[0] == plain[0]
    assert fast[1] == plain[1] and len(plain[1]) >= 3  # the chunk schedule, in order
    assert np.frombuffer(plain[0], np.uint16).any()  # not a trivial all-zero output
