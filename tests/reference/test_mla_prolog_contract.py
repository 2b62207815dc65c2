"""The MLA prolog's promises: float64 oracle agreement, composition with the ``dsa`` golden's
cache readers, cache rows other than the written slots untouched, caller arrays never written,
the case's padding slots and the bad-input messages (docs/ops/mla_prolog.md)."""

from __future__ import annotations

import numpy as np
import pytest
from oracles.mla_prolog import mla_prolog_oracle, yarn_table_f64
from tilesim.reference.cases.mla_prolog import mla_prolog_make_case
from tilesim.reference.mla_prolog import mla_prolog
from tilesim.shared.casts import to_bf16
from tilesim.shared.layouts.mla_cache import unpack_kv_split, unpack_rows
from tilesim.shared.quant import dequantize_latent


def _run(case, **kw):
    return mla_prolog(**case["inputs"], **{**case["params"], **kw})


@pytest.fixture(scope="module")
def cases():
    built = {}
    for name in ("mla_prolog_int8_pad", "mla_prolog_fp8_b4_s2_flashmla"):
        c = mla_prolog_make_case(name, seed=11)
        snap = {k: np.array(v, copy=True) for k, v in c["inputs"].items()}
        built[name] = (c, _run(c), snap)
    return built


def _bits(a) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def _rows(case, out):
    """The (codes, rope, scales) rows of the output cache, as the dsa golden reads them."""
    layout = case["params"]["cache_layout"]
    if layout == "kv_split":
        return unpack_kv_split(out.kv_cache.reshape(-1, 512), out.kr_cache.reshape(-1, 64),
                               out.kv_scale_cache.reshape(-1, 4))  # fmt: skip
    return unpack_rows(out.kv_cache, layout)


@pytest.mark.parametrize("name", ["mla_prolog_int8_pad", "mla_prolog_fp8_b4_s2_flashmla"])
def test_float64_oracle_agreement(cases, name):
    """Against the float64 oracle (BF16 stage outputs, float64 in between): queries within
    2^-7 of the output's largest magnitude, 99.5 % of elements within pypto-gym's query limits
    and 90 % bit-equal to the oracle rounded to BF16 (measured: 92-99.99 %); the
    dequantized latent within half a quantization step plus 2^-6 relative; the cached rope
    within 2^-6 relative of the largest."""
    case, out, _ = cases[name]
    p = case["params"]["path"]
    ref = mla_prolog_oracle(case["inputs"], rope_pairing="deinterleave" if p == "int8" else
                            "interleaved", rms_eps=0.0 if p == "int8" else 1e-6)  # fmt: skip
    for key in ("query_nope", "query_rope"):
        got = getattr(out, key).astype(np.float64)
        err = np.abs(got - ref[key])
        assert err.max() <= 2.0**-7 * np.abs(ref[key]).max(), key
        assert (err <= 0.005 + 2.0**-7 * np.abs(ref[key])).mean() >= 0.995, key
        rounded = to_bf16(ref[key].astype(np.float32)).astype(np.float64)
        assert (got == rounded).mean() >= 0.9, key
    slots = case["inputs"]["slot_mapping"]
    live = slots >= 0
    rows = _rows(case, out)
    deq = dequantize_latent(rows.nope[slots[live]], rows.scales[slots[live]]).astype(np.float64)
    step = np.repeat(rows.scales[slots[live]], 128, axis=1).astype(np.float64)
    kvn = ref["kvn"][live]
    if p == "int8":  # half a code step, the BF16 dequant rounding, a stage-rounding margin
        limit = 0.5 * step * (1 + 2**-6) + 2.0**-6 * np.abs(kvn) + 1e-3
    else:  # E4M3 keeps 3 mantissa bits: half an ulp is 2^-4 relative (2^-10 s subnormal)
        limit = (2.0**-4 + 2.0**-6) * np.abs(kvn) + step * 2.0**-9
    assert (np.abs(deq - kvn) <= limit).all()
    kr = rows.rope[slots[live]].astype(np.float64)
    assert np.abs(kr - ref["kr"][live]).max() <= 2.0**-6 * np.abs(ref["kr"]).max()


def test_yarn_table_matches_the_float64_formula():
    from tilesim.shared.rope import yarn_rope_table

    pos = np.array([0, 1, 4095, 4096, 16383])
    cos, sin = yarn_rope_table(pos)
    ang = yarn_table_f64(pos)
    assert np.abs(cos - np.cos(ang)).max() < 2e-3 and np.abs(sin - np.sin(ang)).max() < 2e-3


@pytest.mark.parametrize("name", ["mla_prolog_int8_pad", "mla_prolog_fp8_b4_s2_flashmla"])
def test_composition_dsa_reader_sees_what_the_prolog_quantized(cases, name):
    """Rows read back through shared/layouts/mla_cache.py (the dsa golden's readers) hold the
    prolog's codes, scales and rope, and dequantize to the rule's values of the normed latent."""
    case, out, _ = cases[name]
    slots = case["inputs"]["slot_mapping"]
    live = slots[slots >= 0]
    rows = _rows(case, out)
    assert np.isfinite(rows.scales[live]).all() and (rows.scales[live] > 0).all()
    deq = dequantize_latent(rows.nope[live], rows.scales[live])
    again = _run(case)  # deterministic: the same call writes the same bytes
    rows2 = _rows(case, again)
    assert np.array_equal(_bits(dequantize_latent(rows2.nope[live], rows2.scales[live])),
                          _bits(deq))  # fmt: skip


def test_composition_with_sparse_attention_golden(cases):
    """The written INT8 kv_split cache is read by sparse_attention_antiquant_kv_split: with one
    top-k entry (the new token), the attention output is that token's dequantized latent."""
    from tilesim.reference import sparse_attention_antiquant_kv_split

    case, out, _ = cases["mla_prolog_int8_pad"]
    table, pos = case["meta"]["block_table"], case["meta"]["positions"]
    slots = case["inputs"]["slot_mapping"]
    t = int(np.flatnonzero(slots >= 0)[0])  # batch 0, token 0 (position 298)
    rows = _rows(case, out)
    q_n = out.query_nope[t : t + 1].reshape(128, 512)
    q_r = out.query_rope[t : t + 1].reshape(128, 64)
    res = sparse_attention_antiquant_kv_split(
        q_n, q_r, rows.nope, rows.rope, rows.scales,
        np.array([[pos[t]] + [-1] * 2047]), table[:1], np.array([pos[t] + 1]),
        softmax_scale=0.1,
    )  # fmt: skip
    deq = dequantize_latent(
        rows.nope[slots[t] : slots[t] + 1], rows.scales[slots[t] : slots[t] + 1]
    )
    assert np.array_equal(_bits(res), _bits(np.repeat(deq, 128, axis=0)))


@pytest.mark.parametrize("name", ["mla_prolog_int8_pad", "mla_prolog_fp8_b4_s2_flashmla"])
def test_only_written_slots_change_and_inputs_are_not_written(cases, name):
    """NaN-poisoned caches: every row but the written slots keeps its bytes; every input array
    (caches included) is bit-identical after the call; the written rows are finite."""
    case, out, snap = cases[name]
    for k, v in case["inputs"].items():
        assert np.array_equal(_bits(v), _bits(snap[k])), k
    slots = case["inputs"]["slot_mapping"]
    live = slots[slots >= 0]
    for key in ("kv_cache", "kr_cache", "kv_scale_cache"):
        src = case["inputs"].get(key)
        if src is None:
            continue
        a = _bits(getattr(out, key)).reshape(-1, src.shape[-1])
        b = _bits(src).reshape(-1, src.shape[-1])
        changed = np.flatnonzero((a != b).any(axis=1))
        assert set(changed.tolist()) <= set(live.tolist()), key
        assert set(changed.tolist()) == set(live.tolist()) or key == "kv_cache", key
    rows = _rows(case, out)
    assert np.isfinite(rows.rope[live].astype(np.float32)).all()


def test_padding_slot_is_skipped_and_outputs_still_computed(cases):
    case, out, _ = cases["mla_prolog_int8_pad"]
    slots = case["inputs"]["slot_mapping"]
    assert (slots == -1).sum() == 3  # a 1-token sequence's missing token + 2 padding tokens
    assert np.isfinite(out.query_nope.astype(np.float32)).all()


# ----------------------------------------------------------------------------- bad input
@pytest.fixture(scope="module")
def small():
    return mla_prolog_make_case("mla_prolog_int8_pad", seed=2)


@pytest.mark.parametrize(
    ("change", "exc", "pattern"),
    [
        (dict(slot_mapping=np.array([0, 1, 2, 3, 4, 512])), ValueError,
         r"slot_mapping\[5\]: expected -1 \(skip\) or a cache row in \[0, 512\).*got 512"),
        (dict(slot_mapping=np.array([0, 1, 2, -2, -1, -1])), ValueError,
         r"slot_mapping\[3\]: expected -1 .* got -2"),
        (dict(slot_mapping=np.array([7, 1, 7, -1, -1, -1])), ValueError,
         r"slot_mapping\[2\]: expected a row no other token writes, got 7"),
        (dict(slot_mapping=np.array([0.0, 1, 2, 3, 4, 5])), TypeError, r"slot_mapping"),
        (dict(path="fp16"), ValueError, r"path: expected one of \('int8', 'fp8'\), got 'fp16'"),
        (dict(rope_pairing="neox"), ValueError, r"rope_pairing: expected one of"),
        (dict(rms_eps=-1.0), ValueError, r"rms_eps: expected a value >= 0, got -1.0"),
        (dict(kv_quant="fp8_ue8m0_deepseek"), TypeError, r"kv_cache: expected dtype"),
        (dict(cache_layout="pypto"), ValueError, r"kr_cache: expected None with cache_lay"),
        (dict(w_uq_qr_scale=None), TypeError, r"w_uq_qr_scale: expected an FP32 scale array"),
        (dict(kr_cache=None), TypeError, r"kr_cache: expected an array with cache_layout"),
    ],
)  # fmt: skip
def test_bad_input_names_argument_expected_and_actual(small, change, exc, pattern):
    inputs = {**small["inputs"]}
    params = {**small["params"]}
    for k, v in change.items():
        (inputs if k in inputs else params)[k] = v
    with pytest.raises(exc, match=pattern):
        mla_prolog(**inputs, **params)


def test_bad_shapes_and_dtypes_raise_before_work(small):
    inputs = dict(small["inputs"])
    for key, bad, pattern in (
        ("x", inputs["x"][:, :100], r"x: expected shape \[T, 7168\]"),
        ("x", inputs["x"].astype(np.float32), r"x: expected dtype"),
        ("cos", inputs["cos"][:3], r"cos: expected shape \[6, 32\] or \[6, 64\]"),
        ("w_uk", inputs["w_uk"][:64], r"w_uk: expected shape"),
    ):
        with pytest.raises((ValueError, TypeError), match=pattern):
            mla_prolog(**{**inputs, key: bad}, **small["params"])
    x = inputs["x"].copy()
    x[0, 0] = np.nan
    with pytest.raises(ValueError, match=r"^x"):
        mla_prolog(**{**inputs, "x": x}, **small["params"])


# ----------------------------------------------------------------------------- bad input (item 7)
@pytest.fixture(scope="module")
def small_fp8():
    return mla_prolog_make_case("mla_prolog_fp8_b4_s2_flashmla", seed=2)


def _refused(case, **change):
    """The call with ``change`` raises before any work (the trace hook never runs) and writes
    no argument; returns the exception."""
    inputs = {**case["inputs"], **{k: v for k, v in change.items() if k in case["inputs"]}}
    params = {**case["params"], **{k: v for k, v in change.items() if k not in inputs}}
    snap = {k: np.array(v, copy=True) for k, v in inputs.items() if v is not None}
    calls = []
    with pytest.raises((ValueError, TypeError)) as info:
        mla_prolog(**inputs, **params, trace=calls.append)
    assert calls == [], "work began before the error"
    for k, v in snap.items():
        assert np.array_equal(_bits(inputs[k]), _bits(v)), k
    return info.value


@pytest.mark.parametrize("which", ["small", "small_fp8"])
def test_zero_tokens_are_refused_by_the_contract(request, which):
    """``T = 0`` is refused with the argument's name (it crashed inside the arithmetic: "cannot
    reshape array of size 0")."""
    case = request.getfixturevalue(which)
    i = case["inputs"]
    e = _refused(case, x=i["x"][:0], cos=i["cos"][:0], sin=i["sin"][:0],
                 slot_mapping=i["slot_mapping"][:0])  # fmt: skip
    assert type(e) is ValueError
    assert str(e).startswith("x: expected at least one token") and "(0, 7168)" in str(e)


def _poke(a, flat: int, value):
    a = np.array(a, copy=True)
    a.reshape(-1)[flat] = value
    return a


def _poke_code(a, flat: int, code: int):
    a = np.array(a, copy=True)
    a.view(np.uint8).reshape(-1)[flat] = code
    return a


BAD_WEIGHTS = [
    # (case, argument, corruption, words in the message)
    ("small", "w_dq", lambda a: _poke(a, 7, np.nan), ["w_dq: expected finite", "nan", "[0, 7]"]),
    ("small", "w_dkv_kr", lambda a: _poke(a, 600, np.inf),
     ["w_dkv_kr: expected finite", "inf", "[1, 24]"]),
    ("small", "w_uk", lambda a: _poke(a, 3, -np.inf),
     ["w_uk: expected finite", "-inf", "[0, 0, 3]"]),
    ("small", "w_uq_qr_scale", lambda a: _poke(a, 2, np.nan),
     ["w_uq_qr_scale: expected finite", "nan"]),
    ("small_fp8", "w_dq", lambda a: _poke_code(a, 5, 0x7F),
     ["w_dq: expected finite", "nan", "[0, 5]"]),
    ("small_fp8", "w_uq_qr", lambda a: _poke_code(a, 24576 + 1, 0xFF),
     ["w_uq_qr: expected finite", "nan", "[1, 1]"]),
    ("small_fp8", "w_dkv_kr", lambda a: _poke_code(a, 577, 0x7F),
     ["w_dkv_kr: expected finite", "[1, 1]"]),
    ("small_fp8", "w_uk", lambda a: _poke(a, 512, np.nan), ["w_uk: expected finite", "[0, 1, 0]"]),
    ("small_fp8", "w_dq_scale", lambda a: _poke(a, 13, 0.0),
     ["w_dq_scale: expected scales > 0", "0.0", "[1, 1]"]),
    ("small_fp8", "w_uq_qr_scale", lambda a: _poke(a, 0, -1.0),
     ["w_uq_qr_scale: expected scales > 0", "-1.0", "[0, 0]"]),
    ("small_fp8", "w_dkv_kr_scale", lambda a: _poke(a, 0, np.inf),
     ["w_dkv_kr_scale: expected finite", "inf"]),
]  # fmt: skip


@pytest.mark.parametrize("which, name, corrupt, words", BAD_WEIGHTS,
                         ids=[f"{w[0]}-{w[1]}-{i}" for i, w in enumerate(BAD_WEIGHTS)])  # fmt: skip
def test_non_finite_weights_codes_and_scales_are_refused(request, which, name, corrupt, words):
    """NaN / inf weights, the E4M3 NaN codes 0x7F and 0xFF, non-finite scales and FP8 block
    scales <= 0: refused before any work, naming the weight, what was expected and the bad
    entry (the indexer prolog's rule: ``check_weight_values``)."""
    case = request.getfixturevalue(which)
    e = _refused(case, **{name: corrupt(case["inputs"][name])})
    assert type(e) is ValueError
    for w in words:
        assert w in str(e), (w, str(e))


def _run_warned(case, **change):
    """The call with ``change``: its result and the warnings it gave (all of them recorded)."""
    import warnings

    inputs = {**case["inputs"], **{k: v for k, v in change.items() if k in case["inputs"]}}
    params = {**case["params"], **{k: v for k, v in change.items() if k not in inputs}}
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        out = mla_prolog(**inputs, **params)
    assert not [w for w in got if issubclass(w.category, RuntimeWarning)], "a bare NumPy warning"
    return out, [str(w.message) for w in got if w.category.__name__ == "NumericsWarning"]


def _one(messages, stage: str) -> str:
    hits = [m for m in messages if m.startswith(f"mla_prolog: stage {stage} (")]
    assert len(hits) == 1, messages
    return hits[0]


def test_valid_call_gives_no_numerics_warning(small):
    _, messages = _run_warned(small)
    assert messages == []


@pytest.mark.parametrize("which", ["small", "small_fp8"])
def test_padding_row_with_rms_eps_zero_warns_and_gives_nan(request, which):
    """An all-zero hidden-state row (a padding token) with ``rms_eps = 0``: the mean square is
    0, so the norm is 0 / 0 = NaN (IEEE); the golden returns it and says so, stage by stage."""
    case = request.getfixturevalue(which)
    x = np.array(case["inputs"]["x"], copy=True)
    x[1] = 0
    out, messages = _run_warned(case, x=x, rms_eps=0.0)
    m = _one(messages, "q_norm")
    assert "gamma_cq" in m and "rms_eps=0" in m and "became NaN" in m and "token row [1]" in m
    m = _one(messages, "kv_norm")
    assert "gamma_ckv" in m and "became NaN" in m and "token row [1]" in m
    assert len(messages) == 2  # reported once, where it starts
    assert np.isnan(out.query_nope[1].astype(np.float32)).all()
    assert np.isfinite(out.query_nope[0].astype(np.float32)).all()
    if case["params"]["path"] == "int8":
        assert np.isnan(out.q_norm_scale[1, 0])
        assert (out.q_norm[1] == 0).all()  # a NaN group: codes 0 (quantize_nonfinite)


def test_huge_weight_warns_where_the_mean_square_overflows(small):
    """A BF16 weight of 1e20: ``q_a`` stays finite, its square overflows FP32 in the norm, so
    the normed row is x / inf = 0 and the queries are all zero: warned, never silent."""
    w = _poke(small["inputs"]["w_dq"], 0, 1e20)  # row 0 of w_dq: x[:, 0] picks it up
    out, messages = _run_warned(small, w_dq=w)
    x0 = small["inputs"]["x"][:, 0].astype(np.float64)
    hit = np.flatnonzero((1e20 * x0) ** 2 > np.finfo(np.float32).max)  # float64 oracle
    assert hit.size
    m = _one(messages, "q_norm")
    assert "became all zero" in m and f"{hit.tolist()[:8]}" in m
    assert (out.query_nope[hit].astype(np.float32) == 0).all()


def test_gamma_at_bf16_max_warns_inf_and_infinite_scale(small):
    """``gamma_cq`` at BF16 max: a normed value above 1 overflows BF16 to inf; the per-token
    INT8 quant of that row then has amax = inf, so its dequant scale is inf."""
    import ml_dtypes

    g = _poke(small["inputs"]["gamma_cq"], 3, ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    out, messages = _run_warned(small, gamma_cq=g)
    m = _one(messages, "q_norm")
    assert "gamma_cq" in m and "became inf" in m
    rows = np.flatnonzero(np.isinf(out.q_norm_scale[:, 0])).tolist()
    assert rows and len(rows) <= 8
    assert f"token row{'s' if len(rows) > 1 else ''} {rows}" in m


def test_huge_fp8_block_scale_warns(small_fp8):
    """An FP8 ``w_dq_scale`` of 1e30: ``q_a`` reaches ~1e30 (finite), its square overflows in
    the norm: every query of the affected tokens is zero, and the warning says so."""
    s = _poke(small_fp8["inputs"]["w_dq_scale"], 0, 1e30)
    out, messages = _run_warned(small_fp8, w_dq_scale=s)
    m = _one(messages, "q_norm")
    assert "became all zero" in m and "gamma_cq" in m
    assert (out.query_nope.astype(np.float32) == 0).all(axis=(1, 2)).any()
