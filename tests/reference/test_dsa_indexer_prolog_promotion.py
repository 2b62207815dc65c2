"""The FP8 indexer prolog's K-block promotion (``fp8_promotion``): on weight block
scales that are not powers of two (``amax / 448``, the builder's ``weight_scale="amax448"``)
DeepSeek's fused multiply-add (``"fma"``) and two roundings (``"two_roundings"``) give
different bits, and both stay within the documented bound of the float64 oracle
(``docs/ops/dsa_indexer_prolog.md``, "What is bit-exact against what"; the bound and its
helpers are those of ``tests/reference/test_dsa_indexer_prolog.py``, imported, not restated).
"""

from __future__ import annotations

import numpy as np
import pytest
from oracles.dsa_indexer_prolog import oracle_prolog
from test_dsa_indexer_prolog import BS, _case, _check_bound, _dequant, _run


def _bits(x) -> np.ndarray:
    return np.ascontiguousarray(x).view(np.uint8)


def _powers_of_two(s) -> bool:
    return bool((np.frexp(np.asarray(s, np.float64))[0] == 0.5).all())


def cancel_in_block_one(inp) -> None:
    """Make token 0's query linear cancel between its first two K blocks (in place): rows
    128..255 of ``w_qb`` repeat rows 0..127, ``q_norm[0, 128:256] = -q_norm[0, :128]`` (so the
    activation codes and scales repeat, negated), ``q_norm[0, 256:] = 0``, and the second K
    block's weight scales are ``FP32(s0 * (1 + 2^-16))``. The sum ``P0 s0 - P0 s1`` is then
    about ``2^-16`` of its terms: the FMA rounds it once, two roundings round ``P0 s1`` first,
    an error of half an FP32 ulp of the terms, about half a BF16 ulp of the sum."""
    w, qn, ws = inp["w_qb"], inp["q_norm"], inp["w_qb_scale"]
    w[128:256] = w[:128]
    qn[0, 128:256] = -qn[0, :128].astype(np.float32)
    qn[0, 256:] = 0
    ws[1] = (ws[0].astype(np.float64) * (1 + 2.0**-16)).astype(np.float32)


@pytest.fixture(scope="module")
def amax448_case():
    """An FP8 case whose weight block scales are ``amax / 448`` (none a power of two), token
    0's query linear made to cancel (:func:`cancel_in_block_one`)."""
    case = _case(path="fp8", weight_scale="amax448", hidden=256, rank=512, seed=11)
    cancel_in_block_one(case["inputs"])
    for name in ("w_qb_scale", "w_k_scale"):
        assert not _any_power_of_two(case["inputs"][name]), name
    return case


def _any_power_of_two(s) -> bool:
    return bool((np.frexp(np.asarray(s, np.float64))[0] == 0.5).any())


def test_the_two_promotions_give_different_bits(amax448_case):
    """Token 0's query codes differ between the promotions (two roundings round the
    product ``partial * scale`` in FP32 first, the FMA does not)."""
    fma = _run(amax448_case, fp8_promotion="fma")
    two = _run(amax448_case, fp8_promotion="two_roundings")
    moved = _bits(fma.q[0]) != _bits(two.q[0])
    assert moved.any(), "token 0's query codes are the same under both promotions"


@pytest.mark.parametrize("promotion", ["fma", "two_roundings"])
def test_each_promotion_is_within_the_float64_bound(amax448_case, promotion):
    """Both promotions: the dequantized q heads and written keys within the oracle bound
    (3 BF16 roundings for q, 6 for k, plus the FP8 quantization), the FP32 weights within 3
    FP32 roundings of the oracle's times the q scale."""
    case = amax448_case
    res = _run(case, fp8_promotion=promotion)
    ora = oracle_prolog(case["inputs"], path="fp8", rope_pairing=case["params"]["rope_pairing"])
    slots = case["inputs"]["slot_mapping"]
    q, k = _dequant(res, "fp8", slots[slots >= 0], BS)
    assert _check_bound(q, ora["q"], "fp8", 3) > 0
    assert _check_bound(k, ora["k"][slots >= 0], "fp8", 6) > 0
    want = ora["weights"] * np.asarray(res.q_scale, np.float64)
    w = np.asarray(res.weights, np.float64)
    assert np.abs(w - want).max() <= (3 * 2.0**-24) * np.abs(want).max()


def test_power_of_two_scales_make_the_promotions_agree():
    """The control: with UE8M0 weight scales every ``partial * scale`` is exact, so both
    promotions give the same bytes on every output."""
    case = _case(path="fp8", weight_scale="ue8m0", hidden=256, rank=512, seed=11)
    assert _powers_of_two(case["inputs"]["w_qb_scale"])
    fma = _run(case, fp8_promotion="fma")
    two = _run(case, fp8_promotion="two_roundings")
    for a, b in zip(fma, two, strict=True):
        assert np.array_equal(_bits(a), _bits(b))
