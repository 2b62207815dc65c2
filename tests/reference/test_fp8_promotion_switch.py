"""The ``fp8_promotion`` switch of the FP8 linears: declared once in each contract's keyword
prototype (DeepSeek's ``"fma"`` the default), checked before any work with a ``ValueError``
naming it, passed by the layer step to both prologs, and without effect on the INT8 path."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from tilesim.reference import dsa_indexer_prolog, dsa_indexer_prolog_make_case
from tilesim.reference.cases.dsa_attention_step import dsa_attention_step_make_case
from tilesim.reference.cases.mla_prolog import mla_prolog_make_case
from tilesim.reference.dsa_attention_step import dsa_attention_step, step_args
from tilesim.reference.mla_prolog import mla_prolog

BAD = r"fp8_promotion: expected one of \('fma', 'two_roundings'\), got 'fused'"


@pytest.mark.parametrize("op", [mla_prolog, dsa_indexer_prolog, dsa_attention_step])
def test_the_switch_is_in_each_signature_with_deepseeks_default(op):
    param = inspect.signature(op).parameters["fp8_promotion"]
    assert param.kind is inspect.Parameter.KEYWORD_ONLY and param.default == "fma"


def _indexer_case(path: str):
    return dsa_indexer_prolog_make_case(None, path=path, seq_lens=(40, 70), s1=2, block_size=16,
                                        hidden=256, rank=256, seed=2)  # fmt: skip


def test_a_bad_value_is_refused_by_name(monkeypatch):
    """Each op refuses an unknown promotion before its arithmetic runs (the linear is
    replaced by one that fails, so any work before the check would show)."""
    import tilesim.reference.util.arith as arith

    def boom(*a, **k):
        raise AssertionError("work began before the check")

    monkeypatch.setattr(arith, "matmul_fp32", boom)
    mla = mla_prolog_make_case(None, path="fp8", b=1, s1=1, seq_lens=(10,), seed=1)
    with pytest.raises(ValueError, match=BAD):
        mla_prolog(**mla["inputs"], **mla["params"], fp8_promotion="fused")
    ip = _indexer_case("fp8")
    with pytest.raises(ValueError, match=BAD):
        dsa_indexer_prolog(**ip["inputs"], **ip["params"], fp8_promotion="fused")
    with pytest.raises(ValueError, match=r"fp8_promotion: expected one of .*, got 1$"):
        mla_prolog(**mla["inputs"], **mla["params"], fp8_promotion=1)  # not a string
    step = dsa_attention_step_make_case(None, path="fp8", seq_lens=(10,), s1=1, seed=1)
    with pytest.raises(ValueError, match=BAD):
        step_args(**step["inputs"], **step["params"], fp8_promotion="fused")


def test_the_step_hands_the_switch_to_both_prologs():
    step = dsa_attention_step_make_case(None, path="fp8", seq_lens=(10,), s1=1, seed=1)
    a = step_args(**step["inputs"], **step["params"], fp8_promotion="two_roundings")
    assert a.mla.fp8_promotion == "two_roundings" and a.iprolog.fp8_promotion == "two_roundings"
    a = step_args(**step["inputs"], **step["params"])
    assert a.mla.fp8_promotion == "fma" and a.iprolog.fp8_promotion == "fma"


def _same_bits(x, y) -> bool:
    if x is None or y is None:
        return x is y
    x, y = np.ascontiguousarray(x), np.ascontiguousarray(y)
    return x.dtype == y.dtype and np.array_equal(x.view(np.uint8), y.view(np.uint8))


def test_int8_path_does_not_depend_on_the_switch():
    """The INT8 linears (pypto-gym's) have no FP8 block promotion: every output's bytes are
    the same under either value."""
    mla = mla_prolog_make_case(None, path="int8", b=1, s1=2, seq_lens=(10,), seed=3)
    one = mla_prolog(**mla["inputs"], **mla["params"], fp8_promotion="fma")
    two = mla_prolog(**mla["inputs"], **mla["params"], fp8_promotion="two_roundings")
    assert all(_same_bits(a, b) for a, b in zip(one, two, strict=True))
    ip = _indexer_case("int8")
    one = dsa_indexer_prolog(**ip["inputs"], **ip["params"], fp8_promotion="fma")
    two = dsa_indexer_prolog(**ip["inputs"], **ip["params"], fp8_promotion="two_roundings")
    assert all(_same_bits(a, b) for a, b in zip(one, two, strict=True))


def _powers_of_two(s) -> bool:
    return bool((np.frexp(np.asarray(s, np.float64))[0] == 0.5).all())


@pytest.mark.parametrize("kind", ["amax448", "ue8m0"])
def test_the_builders_draw_the_weight_scales_asked_for(kind):
    """``weight_scale="ue8m0"``: every FP8 weight block scale a power of two (DeepSeek-V3.2's
    checkpoints); ``"amax448"``: ``amax / 448``, almost none a power of two."""
    mla = mla_prolog_make_case(None, path="fp8", b=1, s1=1, seq_lens=(10,), seed=1,
                               weight_scale=kind)  # fmt: skip
    ip = dsa_indexer_prolog_make_case(None, path="fp8", seq_lens=(40,), s1=1, block_size=16,
                                      hidden=256, rank=256, seed=2, weight_scale=kind)  # fmt: skip
    scales = [mla["inputs"][n] for n in ("w_dq_scale", "w_uq_qr_scale", "w_dkv_kr_scale")]
    scales += [ip["inputs"][n] for n in ("w_qb_scale", "w_k_scale")]
    if kind == "ue8m0":
        assert all(_powers_of_two(s) for s in scales)
    else:
        assert not any(_powers_of_two(s) for s in scales)
    with pytest.raises(ValueError, match="weight_scale: expected one of"):
        mla_prolog_make_case(None, path="fp8", b=1, s1=1, seq_lens=(10,), weight_scale="e8m0")
