"""One DeepSeek step: the stage records written once, the decode step as the layer step
entered at the indexer, and a legal overflow computed through the whole step
(``docs/ops/dsa_attention_step.md``, "Stages", "The decode step", "Bad input and overflow")."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
from tilesim.reference import dsa_attention_step, dsa_decode_step
from tilesim.reference.cases.dsa_attention_step import dsa_attention_step_make_case
from tilesim.reference.util.numerics import NumericsWarning
from tilesim.shared import dsa_attention_step as contract
from tilesim.shared.casts import BF16
from tilesim.shared.registry import ops

PATHS = ("int8", "fp8")
#: BF16's largest finite value: x @ w overflows FP32 in the MLA prolog's first linear
BF16_MAX = float(np.finfo(BF16).max)
#: the token given BF16_MAX: batch 0's second (last) new token, whose position no other row
#: sees (decode rows see the positions before them)
BIG = 1


@functools.lru_cache(maxsize=2)
def _case(path: str) -> dict:
    return dsa_attention_step_make_case(f"dsa_attention_step_short_{path}")


@functools.lru_cache(maxsize=2)
def _clean(path: str):
    case = _case(path)
    return dsa_attention_step(**case["inputs"], **case["params"])


def _bits(v) -> np.ndarray:
    a = np.ascontiguousarray(np.asarray(v))
    return a.view(np.uint8).reshape(a.shape[0], -1) if a.ndim else a.view(np.uint8)


# ----------------------------------------------------------------------------- stage records
def test_the_stage_outputs_are_the_stage_ops_records_outputs():
    """Each stage's outputs are its op record's outputs (renamed where the step's names
    differ), the step's fields are their concatenation, and the stage judge reads them."""
    from tilesim.reference.judging import stages as judge_stages

    own = {
        "mla_prolog": ops.record("mla_prolog").call("mla_prolog").output_names,
        "dsa_indexer_prolog": ("q", "q_scale", "weights", "k_cache", "k_scale"),
        "dsa_indexer": ("topk_indices", "scores"),
        "sparse_attention": ("out",),
    }
    assert contract.STAGE_NAMES == tuple(own)
    for st in contract.STAGES:
        assert st.own == own[st.name]
        assert len(st.outputs) == len(st.own)
        assert all(r in contract.STEP_FIELDS for r in st.reads)
        earlier = contract.STEP_FIELDS[: contract.STEP_FIELDS.index(st.outputs[0])]
        assert set(st.reads) <= set(earlier), st.name  # a stage reads only earlier outputs
    assert contract.STEP_FIELDS == tuple(n for st in contract.STAGES for n in st.outputs)
    assert contract.STEP_FIELDS[-1] == "attn_out" and "index_q" in contract.STEP_FIELDS
    assert judge_stages.STAGE_OF is contract.STAGE_OF
    step = ops.record("dsa_attention_step")
    assert step.call("dsa_attention_step").output_names == contract.STEP_FIELDS
    assert step.call("dsa_decode_step").output_names == contract.DECODE_OUTPUTS
    assert contract.DECODE_OUTPUTS == ("topk_indices", "scores", "out")


def test_an_unknown_stage_is_named():
    with pytest.raises(ValueError, match=r"^stage: expected one of .*'sparse_attention'"):
        contract.stage("attention")


# ----------------------------------------------------------------------------- decode step
def _decode_arguments(res, case: dict) -> dict:
    """The decode step's arguments from a layer step's own stage outputs: its index queries,
    index cache, queries and updated latent cache, in the decode step's names."""
    p, inp = case["params"], case["inputs"]
    int8 = p["path"] == "int8"
    t = res.query_nope.shape[0]
    args = dict(q=res.index_q, weights=res.index_weights, k_cache=res.k_cache,
                block_table=inp["block_table"], seq_lens=inp["seq_lens"],
                query_nope=res.query_nope.reshape(t * 128, 512),
                query_rope=res.query_rope.reshape(t * 128, 64),
                q_scale=res.index_q_scale if int8 else None,
                k_scale=res.k_scale if int8 else None, path=p["path"], topk=p["topk"],
                block_size=p["block_size"], nq=128, tiling=p["tiling"],
                softmax_scale=contract.step_keywords.__kwdefaults__["softmax_scale"])  # fmt: skip
    if int8:  # the INT8 path's latent cache is the kv_split triple
        return {
            **args,
            "layout": "kv_split",
            "kn_quant": res.kv_cache.reshape(-1, 512),
            "kr": res.kr_cache.reshape(-1, 64),
            "kn_scales": res.kv_scale_cache.reshape(-1, 4),
        }
    return {**args, "layout": "pypto", "nope_cache": res.kv_cache}


@pytest.mark.parametrize("path", PATHS)
def test_the_decode_step_is_the_layer_step_entered_at_the_indexer(path):
    """Given the layer step's own index queries, index cache, queries and latent cache, the
    decode step returns exactly the layer step's ids, scores and attention output."""
    res = _clean(path)
    got = dsa_decode_step(**_decode_arguments(res, _case(path)))
    assert list(got) == list(contract.DECODE_OUTPUTS)
    np.testing.assert_array_equal(got["topk_indices"], res.topk_indices)
    np.testing.assert_array_equal(_bits(got["scores"]), _bits(res.scores))
    assert got["out"].shape == (res.attn_out.shape[0] * 128, 512)
    np.testing.assert_array_equal(_bits(got["out"]), _bits(res.attn_out.reshape(-1, 512)))


# ----------------------------------------------------------------------------- overflow
def _overflowing(path: str):
    case = _case(path)
    x = case["inputs"]["x"].copy()
    x[BIG] = np.asarray(BF16_MAX, np.float32).astype(BF16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = dsa_attention_step(**{**case["inputs"], "x": x}, **case["params"])
    return res, [str(w.message) for w in caught if w.category is NumericsWarning], caught


@pytest.mark.parametrize("path", PATHS)
def test_a_legal_overflow_is_computed_through_the_whole_step(path):
    """A BF16-max hidden state (legal input) overflows FP32 in the MLA prolog: the step does
    not refuse the NaN / inf its own stages produce at a later stage's value scan, it computes
    through, every warning names its stage, and the outputs carry the NaN where the stages'
    arithmetic puts it: the token's queries and attention output; its index scores NaN, ranked
    by tilesim's rule (NaN last, lower position first). Every other token row, which does not
    see the token, is bit-equal to the step without the overflow."""
    res, msgs, caught = _overflowing(path)
    assert not [w for w in caught if w.category is RuntimeWarning]  # no bare NumPy warning
    assert any(m.startswith("mla_prolog: stage q_a (x @ w_dq") and "became inf in token row [1]"
               in m for m in msgs), msgs  # fmt: skip
    nan_rank = [m for m in msgs if m.startswith("dsa_attention_step: stage dsa_indexer ")]
    assert len(nan_rank) == 1 and "NaN scores in token rows [1]" in nan_rank[0], msgs
    clean, case = _clean(path), _case(path)
    others = [r for r in range(res.query_nope.shape[0]) if r != BIG]
    assert np.isnan(res.query_nope[BIG].astype(np.float32)).all()
    assert np.isnan(res.attn_out[BIG].astype(np.float32)).all()
    visible = int(case["inputs"]["seq_lens"][0])  # the batch's last token sees every position
    assert np.isnan(res.scores[BIG, :visible]).all()
    want = np.full(res.topk_indices.shape[1], -1, np.int32)
    want[: min(visible, want.size)] = np.arange(min(visible, want.size))  # NaN ties: low first
    np.testing.assert_array_equal(res.topk_indices[BIG], want)
    for field in ("query_nope", "query_rope", "index_q", "index_weights", "topk_indices",
                  "scores", "attn_out"):  # fmt: skip
        got, ref = np.asarray(getattr(res, field)), np.asarray(getattr(clean, field))
        np.testing.assert_array_equal(_bits(got[others]), _bits(ref[others]), err_msg=field)


def test_the_overflow_changes_only_the_tokens_own_cache_rows():
    """The INT8 step with the overflow writes the token's key and latent rows (non-finite)
    at its slot; every other cache row keeps the clean step's bytes."""
    res, _, _ = _overflowing("int8")
    clean, case = _clean("int8"), _case("int8")
    slot = int(case["meta"]["slots"][BIG])
    n_slots = case["meta"]["n_blocks"] * case["params"]["block_size"]
    rows = np.ones(n_slots, bool)
    rows[slot] = False
    for field in ("kv_cache", "kr_cache", "kv_scale_cache", "k_cache", "k_scale"):
        got = np.ascontiguousarray(getattr(res, field)).reshape(n_slots, -1)
        ref = np.ascontiguousarray(getattr(clean, field)).reshape(n_slots, -1)
        np.testing.assert_array_equal(_bits(got[rows]), _bits(ref[rows]), err_msg=field)
        assert not np.array_equal(_bits(got[slot : slot + 1]), _bits(ref[slot : slot + 1])), field
