"""Bad input to ``dsa_attention_step`` is refused before any stage runs, with a message that
names the step's own argument: every stage golden is replaced by one that fails the test if
it is called, so an error raised after some work cannot pass."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from tilesim.reference.cases.dsa_attention_step import dsa_attention_step_make_case
from tilesim.shared.casts import BF16, FP8_E4M3
from tilesim.shared.layouts.index_cache import fp8_page_views

#: the golden's module (``tilesim.reference.dsa_attention_step`` as an attribute is the function)
step_mod = importlib.import_module("tilesim.reference.dsa_attention_step")
#: every stage golden the step's module calls (the step's own from-args entries and the
#: checked goldens run_stage uses)
STAGES = ("mla_from_args", "iprolog_from_args", "dsa_indexer_prolog", "dsa_indexer",
          "indexer_from_args", "step_attention")  # fmt: skip


@pytest.fixture(scope="module")
def cases():
    small = dict(seq_lens=(300, 1000), s1=2, topk=128)
    return {p: dsa_attention_step_make_case(path=p, **small) for p in ("int8", "fp8")}


@pytest.fixture
def no_stage(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("a stage ran before the step's checks finished")

    for name in STAGES:
        monkeypatch.setattr(step_mod, name, refuse)


def _visible_row(case, b: int, pos: int) -> tuple[int, int]:
    bs = case["params"]["block_size"]
    return int(case["inputs"]["block_table"][b, pos // bs]), pos % bs


def _nan_history_scale(case):
    blk, off = _visible_row(case, 1, 5)
    inp = case["inputs"]
    if case["params"]["path"] == "int8":
        ks = inp["k_scale"].copy()
        ks[blk, off] = np.nan
        return {"k_scale": ks}
    kc = inp["k_cache"].copy()
    fp8_page_views(kc, block_size=case["params"]["block_size"]).scales[blk, off] = np.nan
    return {"k_cache": kc}


def _bad_block(case):
    bt = case["inputs"]["block_table"].copy()
    bt[1, 2] = -1
    return {"block_table": bt}


def _slot(case, value):
    s = case["meta"]["slots"].copy()
    s[0] = value if value is not None else s[0] + 1
    return {"slot_mapping": s}


def _nan_x(case):
    x = case["inputs"]["x"].copy()
    x[1, 7] = np.nan
    return {"x": x}


def _tripled(case):
    """12 tokens over 2 sequences: s1 = 6, more than a decode step takes without q_lens."""
    return {k: np.concatenate([case["inputs"][k]] * 3) for k in ("x", "cos", "sin")}


#: (id, path, overrides(case) -> dict, params overrides, exception, message start)
BAD = [
    ("path", "int8", lambda c: {}, {"path": "fp16"}, ValueError, "path:"),
    ("x_dtype", "int8", lambda c: {"x": c["inputs"]["x"].astype(np.float32)}, {}, TypeError,
     "x:"),
    ("x_width", "fp8", lambda c: {"x": c["inputs"]["x"][:, :7040]}, {}, ValueError, "x:"),
    ("x_nan", "fp8", _nan_x, {}, ValueError, "x"),
    ("decode_rows", "int8", lambda c: _tripled(c), {}, ValueError, "x, seq_lens:"),
    ("w_uq_qr_path", "int8", lambda c: {"w_uq_qr": c["inputs"]["w_uq_qr"].view(np.uint8)},
     {}, TypeError, "w_uq_qr:"),
    ("w_qb_shape", "int8", lambda c: {"w_qb": c["inputs"]["w_qb"][:, :4096]}, {}, ValueError,
     "w_qb:"),
    ("hadamard_on_fp8", "fp8", lambda c: {"hadamard_q": np.eye(128).astype(BF16)}, {},
     ValueError, "hadamard_q:"),
    ("k_scale_missing", "int8", lambda c: {"k_scale": None}, {}, TypeError, "k_scale:"),
    ("kv_cache_width", "fp8", lambda c: {"kv_cache": c["inputs"]["kv_cache"][:, :640]}, {},
     ValueError, "kv_cache:"),
    ("cos_shape", "fp8", lambda c: {"cos": c["inputs"]["cos"][:2]}, {}, ValueError, "cos:"),
    ("gamma_nan", "int8",
     lambda c: {"gamma_cq": np.full_like(c["inputs"]["gamma_cq"], np.nan)}, {}, ValueError,
     "gamma_cq"),
    ("seq_lens_short", "int8", lambda c: {"seq_lens": np.array([1, 1000], np.int32)}, {},
     ValueError, "seq_lens[0]"),
    ("block_table_hole", "fp8", _bad_block, {}, ValueError, "block_table[1, 2]"),
    ("q_lens_ragged", "int8", lambda c: {"q_lens": np.array([1, 3], np.int32)}, {}, ValueError,
     "q_lens[1]"),
    ("slot_elsewhere", "int8", lambda c: _slot(c, None), {}, ValueError, "slot_mapping[0]"),
    ("slot_skip_poisoned", "fp8", lambda c: _slot(c, -1), {}, ValueError, "k_cache:"),
    ("slot_skip_poisoned_int8", "int8", lambda c: _slot(c, -1), {}, ValueError, "k_scale:"),
    ("index_cache_nan", "int8", _nan_history_scale, {}, ValueError, "k_scale:"),
    ("index_pages_nan", "fp8", _nan_history_scale, {}, ValueError, "k_cache:"),
    ("softmax_scale", "fp8", lambda c: {}, {"softmax_scale": 0.0}, ValueError,
     "softmax_scale:"),
    ("topk", "int8", lambda c: {}, {"topk": 0}, ValueError, "topk:"),
    ("tiling", "int8", lambda c: {}, {"tiling": "decode"}, TypeError, "tiling:"),
    ("index_rope_pairing", "fp8", lambda c: {}, {"index_rope_pairing": "deinterleave"},
     ValueError, "index_rope_pairing:"),
    ("ln_eps", "int8", lambda c: {}, {"ln_eps": -1.0}, ValueError, "ln_eps:"),
    ("index_k_tile", "int8", lambda c: {}, {"index_k_tile": 0}, ValueError, "index_k_tile:"),
    ("index_k_tile_float", "fp8", lambda c: {}, {"index_k_tile": 2.0}, TypeError,
     "index_k_tile:"),
    ("rms_form", "int8", lambda c: {}, {"rms_form": "layer"}, ValueError, "rms_form:"),
    ("trace", "int8", lambda c: {}, {"trace": 3}, TypeError, "trace:"),
    ("progress", "int8", lambda c: {}, {"progress": "yes"}, TypeError, "progress:"),
    ("no_tokens", "fp8", lambda c: {k: c["inputs"][k][:0] for k in ("x", "cos", "sin")}, {},
     ValueError, "x: expected at least one token"),
    ("fp8_path_int8_weights", "int8", lambda c: {}, {"path": "fp8"}, TypeError, "w_uq_qr:"),
    ("int8_path_fp8_weights", "fp8", lambda c: {}, {"path": "int8"}, TypeError, "w_uq_qr:"),
    ("w_qb_other_path", "int8",
     lambda c: {"w_qb": np.zeros(c["inputs"]["w_qb"].shape, np.float32).astype(FP8_E4M3)}, {},
     TypeError, "w_qb:"),
    ("index_rope_table", "int8", lambda c: {}, {"index_rope_pairing": "interleaved"},
     ValueError, "index_rope_pairing:"),
    ("w_dq_nan_code", "fp8", lambda c: _code(c, "w_dq", 0x7F), {}, ValueError, "w_dq:"),
    ("w_uq_qr_nan_code", "fp8", lambda c: _code(c, "w_uq_qr", 0xFF), {}, ValueError, "w_uq_qr:"),
    ("w_uk_inf", "int8", lambda c: _code(c, "w_uk", 0x7F80), {}, ValueError, "w_uk:"),
    ("w_k_nan", "int8", lambda c: _code(c, "w_k", 0x7FC0), {}, ValueError, "w_k:"),
    ("w_dq_scale_zero", "fp8", lambda c: {"w_dq_scale": np.zeros_like(c["inputs"]["w_dq_scale"])},
     {}, ValueError, "w_dq_scale: expected scales > 0"),
]  # fmt: skip


def _code(case, name: str, bits: int) -> dict:
    """``name`` with its element 1 replaced by the raw bits ``bits`` (an E4M3 NaN code, a BF16
    inf or NaN)."""
    a = np.array(case["inputs"][name], copy=True)
    u = np.uint8 if a.dtype.itemsize == 1 else np.uint16
    a.view(u).reshape(-1)[1] = bits
    return {name: a}


@pytest.mark.parametrize("bad", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_refused_before_any_stage(bad, cases, no_stage):
    _id, path, over, params, exc, start = bad
    case = cases[path]
    inputs = {**case["inputs"], **over(case)}
    kw = {**case["params"], "progress": False, **params}
    with pytest.raises(exc) as info:
        step_mod.dsa_attention_step(**inputs, **kw)
    assert str(info.value).startswith(start), str(info.value)


def test_the_stage_guard_would_catch_a_stage_that_runs(cases, no_stage):
    """Good input reaches the first stage, which the guard refuses: the guard is live."""
    case = cases["int8"]
    with pytest.raises(AssertionError, match="a stage ran"):
        step_mod.dsa_attention_step(**case["inputs"], **case["params"], progress=False)


def test_unknown_or_missing_argument_names_the_op(cases):
    case = cases["int8"]
    with pytest.raises(TypeError, match=r"^dsa_attention_step\(\)"):
        step_mod.dsa_attention_step(**case["inputs"], **case["params"], w_qkv=1)
    inputs = dict(case["inputs"])
    del inputs["w_k"]
    with pytest.raises(TypeError, match=r"^dsa_attention_step\(\).*w_k"):
        step_mod.dsa_attention_step(**inputs, **case["params"])


PATH_MESSAGES = [
    ("int8", "fp8", ["w_uq_qr: expected FP8 E4M3", "path='fp8'", "got int8"]),
    ("fp8", "int8", ["w_uq_qr: expected INT8", "path='int8'", "got float8_e4m3fn"]),
]


@pytest.mark.parametrize("built, path, words", PATH_MESSAGES, ids=["fp8_on_int8", "int8_on_fp8"])
def test_path_mismatch_names_the_weight(cases, no_stage, built, path, words):
    """The other path's weights are named by the weight, its expected and its actual dtype
    (before: ``cos`` for ``path="fp8"`` with INT8 weights -- the FP8 path's RoPE default --,
    ``kr_cache`` for ``path="int8"`` with FP8 ones -- the INT8 path's cache layout)."""
    case = cases[built]
    with pytest.raises(TypeError) as info:
        step_mod.dsa_attention_step(**case["inputs"], **{**case["params"], "path": path},
                                    progress=False)  # fmt: skip
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_index_rope_pairing_mistake_names_the_step_switch(cases, no_stage):
    """``index_rope_pairing="interleaved"`` with the INT8 path's [T, 64] table: the message
    names the step's switch (before: the indexer prolog's ``rope_pairing``), what it needs and
    the table's shape."""
    case = cases["int8"]
    with pytest.raises(ValueError) as info:
        step_mod.dsa_attention_step(**case["inputs"], **case["params"], progress=False,
                                    index_rope_pairing="interleaved")  # fmt: skip
    msg = str(info.value)
    assert msg.startswith("index_rope_pairing: expected 'halves'") and "got 'interleaved'" in msg
    assert "(4, 64)" in msg and "[4, 32]" in msg and "rope_pairing=" not in msg
