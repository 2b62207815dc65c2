"""Cases of the lightning indexer (``reference/cases/dsa_indexer.py``) and of the decode step
(the layer step entered at the indexer: ``reference/dsa_attention_step.py``, its cases in
``reference/cases/dsa_attention_step.py``): the published shapes, the builders' determinism
and checks, and the step as the composition of its two goldens."""

from __future__ import annotations

import numpy as np
import pytest
from tilesim.reference import (
    dsa_attention_step_make_case,
    dsa_decode_step,
    dsa_indexer,
    dsa_indexer_make_case,
    sparse_attention_antiquant,
    sparse_attention_antiquant_kv_split,
)
from tilesim.reference.cases.dsa import DSA_CASES
from tilesim.reference.cases.dsa_attention_step import CASE_INFO as STEP_CASES
from tilesim.reference.cases.dsa_indexer import CASE_INFO, UNIFORM_64
from tilesim.shared.registry.case_schema import CASE_KEYS


def test_case_table_holds_the_published_shapes():
    gym = dsa_indexer_make_case  # the pypto-gym LI test's act_seq lists, as published
    assert CASE_INFO["li_quant_b4_s1_2_64k"].family == "dsa_indexer"
    assert UNIFORM_64 is DSA_CASES["sfa_bf16_b64_s2_seq64K_uniform_per_int8_d_950"].actual_seq
    assert len(UNIFORM_64) == 64 and min(UNIFORM_64) == 16384 and max(UNIFORM_64) == 114688
    assert {(i.kind, i.op, i.tolerance["mode"]) for i in CASE_INFO.values()} == {
        ("indexer", "dsa_indexer", "set")
    }
    steps = {n: i for n, i in STEP_CASES.items() if i.kind == "decode_step"}
    assert sorted(steps) == ["dsa_step_b2_s2_fp8", "dsa_step_b2_s2_int8"]  # one family: the step's
    for info in steps.values():
        assert (info.family, info.op, info.tolerance["mode"]) == (
            "dsa_attention_step", "dsa_decode_step", "compare")  # fmt: skip
    assert callable(gym)


def test_builder_is_deterministic_and_follows_the_schema():
    a = dsa_indexer_make_case("dsa_indexer_short_fp8", progress=False)
    b = dsa_indexer_make_case("dsa_indexer_short_fp8", progress=True)
    c = dsa_indexer_make_case("dsa_indexer_short_fp8", seed=1)
    assert tuple(a) == CASE_KEYS and a["op"] == "dsa_indexer"
    for k in a["inputs"]:
        assert np.array_equal(a["inputs"][k].view(np.uint8), b["inputs"][k].view(np.uint8)), k
    assert not np.array_equal(a["inputs"]["k_cache"], c["inputs"]["k_cache"])
    assert a["inputs"]["block_table"].dtype == np.int32
    assert (a["inputs"]["block_table"][0, -(-300 // 128) :] == -1).all()  # unused entries


@pytest.mark.parametrize(
    "over, exc, match",
    [
        (dict(path="bf16"), ValueError, "path"),
        (dict(s1=5), ValueError, "s1"),
        (dict(seq_lens=(10,), q_lens=(11,)), ValueError, "seq_lens"),
        (dict(seq_lens=(10, 20), q_lens=(1,)), ValueError, "q_lens"),
        (dict(op="dsa_decode_step"), ValueError, "dsa_attention_step_make_case"),
        (dict(colour=1), TypeError, "colour"),
        (dict(spare_blocks=-1), ValueError, "spare_blocks"),
    ],
)
def test_builder_checks_its_parameters(over, exc, match):
    with pytest.raises(exc, match=match):
        dsa_indexer_make_case(None, **over)
    with pytest.raises(ValueError, match="name"):
        dsa_indexer_make_case("no_such_case")


@pytest.mark.parametrize(
    "over, exc, match",
    [
        (dict(q_lens=(1, 1)), ValueError, "q_lens"),
        (dict(attn_quant="bf16"), ValueError, "attn_quant"),
        (dict(layout="paged"), ValueError, "layout"),
        (dict(path="bf16"), ValueError, "path"),
        (dict(colour=1), TypeError, "colour"),
    ],
)
def test_decode_step_builder_checks_its_parameters(over, exc, match):
    with pytest.raises(exc, match=match):
        dsa_attention_step_make_case(None, op="dsa_decode_step", **over)


@pytest.mark.parametrize("name", ["dsa_step_b2_s2_int8", "dsa_step_b2_s2_fp8"])
def test_decode_step_is_indexer_then_attention(name):
    case = dsa_attention_step_make_case(name)
    assert case["op"] == "dsa_decode_step"
    got = dsa_decode_step(**case["inputs"], **case["params"])
    assert list(got) == ["topk_indices", "scores", "out"]
    inp, par = case["inputs"], case["params"]
    idx_keys = ("q", "weights", "k_cache", "block_table", "seq_lens", "q_scale", "k_scale")
    ids, scores = dsa_indexer(**{k: inp[k] for k in idx_keys if k in inp},
                              **{k: par[k] for k in ("path", "topk", "block_size")})  # fmt: skip
    np.testing.assert_array_equal(got["topk_indices"], ids)
    np.testing.assert_array_equal(got["scores"], scores)
    kw = {k: par[k] for k in ("nq", "softmax_scale", "topk", "block_size", "tiling")}
    if par["layout"] == "kv_split":
        out = sparse_attention_antiquant_kv_split(
            inp["query_nope"], inp["query_rope"], inp["kn_quant"], inp["kr"], inp["kn_scales"],
            ids, inp["block_table"], inp["seq_lens"], **kw)  # fmt: skip
    else:
        out = sparse_attention_antiquant(
            inp["query_nope"], inp["query_rope"], inp["nope_cache"], ids, inp["block_table"],
            inp["seq_lens"], layout=par["layout"], **kw)  # fmt: skip
    assert got["out"].shape == (4 * 128, 512)
    np.testing.assert_array_equal(got["out"].view(np.uint16), out.view(np.uint16))
    # batch 0 (300 tokens): rows see 299 / 300, then -1; batch 1 (2100): 2048 ids each
    assert (ids[0, :299] >= 0).all() and (ids[0, 299:] == -1).all()
    assert (ids[1, :300] >= 0).all() and (ids[1, 300:] == -1).all()
    assert (ids[2:] >= 0).all()


def test_decode_step_refuses_a_cache_that_does_not_fit_the_layout():
    """A cache the layout reads given as None: TypeError (the input policy's kind for None);
    one it does not read given as an array: ValueError; each names the cache and the layout."""
    case = dsa_attention_step_make_case("dsa_step_b2_s2_fp8")
    args = {**case["inputs"], **case["params"]}
    with pytest.raises(TypeError, match=r"^kn_quant: expected an array \(layout='kv_split'"):
        dsa_decode_step(**{**args, "layout": "kv_split"})
    with pytest.raises(TypeError, match=r"^nope_cache: expected an array \(layout='pypto'"):
        dsa_decode_step(**{**args, "nope_cache": None})
    split = {"kn_quant": np.zeros(1), "kr": np.zeros(1), "kn_scales": np.zeros(1)}
    with pytest.raises(ValueError, match=r"^nope_cache: expected None \(layout='kv_split'"):
        dsa_decode_step(**{**args, **split, "layout": "kv_split"})
    with pytest.raises(ValueError, match=r"^kr: expected None \(layout='pypto'"):
        dsa_decode_step(**{**args, "kr": np.zeros(1)})


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dsa_indexer_b64_s2_uniform_int8",
                                  "dsa_indexer_b64_s2_uniform_fp8"])  # fmt: skip
def test_b64_s2_uniform_decode_runs(name):
    case = dsa_indexer_make_case(name)
    ids, scores = dsa_indexer(**case["inputs"], **case["params"])
    assert ids.shape == (128, 2048) and (ids >= 0).all()
    assert scores.shape == (128, 896 * 128)
    vis = np.repeat(np.asarray(UNIFORM_64), 2) - np.tile([1, 0], 64)
    assert np.array_equal(np.isfinite(scores).sum(axis=1), vis)
    for r in (0, 127):  # the ids are the top of the row's scores
        assert scores[r, ids[r]].min() >= np.sort(scores[r, : vis[r]])[-2048]
