"""Bad input to ``dsa_indexer_prolog`` and its case builder: ``ValueError`` / ``TypeError``
naming the argument, what was expected and what was given, raised before any work (the
trace hook never runs, no output is produced)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from tilesim.reference import dsa_indexer_prolog, dsa_indexer_prolog_make_case

BS = 16


@pytest.fixture(scope="module")
def cases():
    kw = dict(hidden=256, rank=256, block_size=BS, seq_lens=(5, 6), s1=1)
    return {p: dsa_indexer_prolog_make_case(None, path=p, **kw) for p in ("int8", "fp8")}


def _call(case, **over):
    inputs = {**case["inputs"], **{k: v for k, v in over.items() if k in case["inputs"]}}
    params = {**case["params"], **{k: v for k, v in over.items() if k not in case["inputs"]}}
    calls = []
    with pytest.raises((ValueError, TypeError)) as e:
        dsa_indexer_prolog(**inputs, **params, trace=calls.append)
    assert calls == []  # refused before any work
    return e


BAD = [
    ("int8", dict(x=np.zeros((2, 256), np.float32)), TypeError, ["x", "bfloat16", "float32"]),
    ("int8", dict(q_norm=np.zeros((2, 256), np.int16)), TypeError, ["q_norm", "int8", "int16"]),
    ("int8", dict(q_norm_scale=None), TypeError, ["q_norm_scale", "None", "int8"]),
    ("int8", dict(hadamard_q=np.zeros((128, 64), ml_dtypes.bfloat16)), ValueError,
     ["hadamard_q", "(128, 128)", "(128, 64)"]),
    ("int8", dict(w_qb=np.zeros((256, 4096), np.int8)), ValueError, ["w_qb", "8192", "4096"]),
    ("int8", dict(w_k_scale=np.ones((2, 1), np.float32)), ValueError, ["w_k_scale", "None"]),
    ("int8", dict(cos=np.zeros((2, 48), np.float32)), ValueError, ["cos", "[2, 32]", "48"]),
    ("int8", dict(rope_pairing="interleaved"), ValueError, ["cos", "[2, 32]", "interleaved"]),
    ("int8", dict(k_scale=np.zeros((4, BS), np.float32)), TypeError, ["k_scale", "float16"]),
    ("int8", dict(block_size=32), ValueError, ["k_cache", "block_size=32"]),
    ("int8", dict(slot_mapping=np.zeros(3, np.int64)), ValueError, ["slot_mapping", "(2)", "(3,)"]),
    ("int8", dict(slot_mapping=np.zeros(2, np.float32)), TypeError, ["slot_mapping", "integer"]),
    ("int8", dict(path="bf16"), ValueError, ["path", "'bf16'"]),
    ("int8", dict(eps=0.0), ValueError, ["eps", "> 0"]),
    ("int8", dict(ue8m0=1), TypeError, ["ue8m0", "bool"]),
    ("int8", dict(amax_floor=-1.0), ValueError, ["amax_floor"]),
    ("int8", dict(amax_floor=1e-40), ValueError, ["amax_floor", "int8"]),
    ("int8", dict(amax_floor=1e7), ValueError, ["amax_floor", "int8"]),
    ("fp8", dict(amax_floor=1e-44), ValueError, ["amax_floor", "fp8"]),
    ("fp8", dict(hadamard_k=np.zeros((128, 128), ml_dtypes.bfloat16)), ValueError,
     ["hadamard_k", "None", "path='fp8'"]),
    ("fp8", dict(w_k_scale=None), TypeError, ["w_k_scale", "None"]),
    ("fp8", dict(w_proj=np.zeros((256, 64), ml_dtypes.bfloat16)), TypeError,
     ["w_proj", "float32", "bfloat16"]),
    ("fp8", dict(k_cache=np.zeros((4, BS, 128), np.int8)), TypeError, ["k_cache", "uint8"]),
    ("fp8", dict(x=np.zeros((2, 200), ml_dtypes.bfloat16)), ValueError, ["multiple of 128"]),
]  # fmt: skip


@pytest.mark.parametrize("path, over, exc, words", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_metadata_is_named(cases, path, over, exc, words):
    e = _call(cases[path], **over)
    assert e.type is exc
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def _poke(a, idx, value):
    a = np.array(a, copy=True)
    a[idx] = value
    return a


NAN_AT = [
    ("int8", "x", (1, 3)),
    ("int8", "q_norm_scale", (0, 0)),
    ("int8", "hadamard_k", (5, 5)),
    ("fp8", "w_proj", (2, 1)),
    ("fp8", "cos", (1, 0)),
    ("fp8", "ln_beta", (7,)),
]


@pytest.mark.parametrize("path, name, idx", NAN_AT)
def test_non_finite_inputs_are_named(cases, path, name, idx):
    a = cases[path]["inputs"][name]
    e = _call(cases[path], **{name: _poke(a, idx, np.nan)})
    assert e.type is ValueError and name in str(e.value) and "finite" in str(e.value)


def test_fp8_nan_weight_code_and_bad_scales_are_named(cases):
    c = cases["fp8"]
    w = c["inputs"]["w_qb"].copy()
    w.view(np.uint8)[3, 9] = 0x7F
    assert "w_qb" in str(_call(c, w_qb=w).value)
    e = _call(c, w_k_scale=_poke(c["inputs"]["w_k_scale"], (0, 0), 0.0))
    assert "w_k_scale" in str(e.value) and "> 0" in str(e.value)


@pytest.mark.parametrize(
    "kw, exc, words",
    [
        (dict(path="fp16"), ValueError, ["path"]),
        (dict(recipe="gym", path="fp8"), ValueError, ["recipe", "INT8"]),
        (dict(seq_lens=(3,), s1=4), ValueError, ["s1", "[1, 3]"]),  # past the longest
        (dict(seq_lens=(3, 5), s1=4), ValueError, ["seq_lens[0]", ">= 4"]),
        (dict(hidden=200), ValueError, ["hidden", "multiple of 128"]),
        (dict(q_lens=(1, 2)), ValueError, ["q_lens", "1 values"]),
        (dict(colour=1), TypeError, ["unknown parameter", "colour"]),
    ],
    ids=[f"case{i}" for i in range(7)],
)
def test_case_builder_refuses_bad_parameters(kw, exc, words):
    with pytest.raises(exc) as e:
        dsa_indexer_prolog_make_case(None, **{"seq_lens": (5,), **kw})
    for w in words:
        assert w in str(e.value)


# ----------------------------------------------------------------------------- T = 0, overflow
@pytest.mark.parametrize("path", ["int8", "fp8"])
def test_zero_tokens_are_refused(cases, path):
    i = cases[path]["inputs"]
    over = {k: i[k][:0] for k in ("x", "q_norm", "cos", "sin", "slot_mapping")}
    if path == "int8":
        over["q_norm_scale"] = i["q_norm_scale"][:0]
    e = _call(cases[path], **over)
    assert e.type is ValueError
    assert str(e.value).startswith("x: expected at least one token") and "(0, 256)" in str(e.value)


def test_fp8_nan_code_0xff_in_w_k_is_named(cases):
    c = cases["fp8"]
    w = c["inputs"]["w_k"].copy()
    w.view(np.uint8)[2, 5] = 0xFF
    e = _call(c, w_k=w)
    assert e.type is ValueError and str(e.value).startswith("w_k: expected finite values")
    assert "[2, 5]" in str(e.value)


def _warned(case, **over):
    import warnings

    inputs = {**case["inputs"], **{k: v for k, v in over.items() if k in case["inputs"]}}
    params = {**case["params"], **{k: v for k, v in over.items() if k not in case["inputs"]}}
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        out = dsa_indexer_prolog(**inputs, **params)
    assert not [w for w in got if issubclass(w.category, RuntimeWarning)], "a bare NumPy warning"
    return out, [str(w.message) for w in got if w.category.__name__ == "NumericsWarning"]


def _stage(messages, stage):
    hits = [m for m in messages if m.startswith(f"dsa_indexer_prolog: stage {stage} (")]
    assert len(hits) == 1, messages
    return hits[0]


BF16_MAX = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)


def test_valid_calls_give_no_numerics_warning(cases):
    for c in cases.values():
        assert _warned(c)[1] == []


def test_bf16_max_in_x_warns_and_computes_int8(cases):
    """A BF16-max element in ``x`` (legal: finite) used to fail inside the key quantizer
    ("quantize_index_int8(x): expected finite values, got nan") after work began: ``x @ w_k``
    is finite but its LayerNorm squares overflow FP32 (``d * d = inf``, ``inf / inf = NaN``).
    Now the golden finishes, warns at the LayerNorm, and quantizes the NaN key as the rule
    does (scale NaN, INT8 codes 0); ``x @ w_proj`` overflows FP16 in the weights."""
    c = cases["int8"]
    x = c["inputs"]["x"].copy()
    x[0, 5] = BF16_MAX
    out, messages = _warned(c, x=x)
    m = _stage(messages, "k_layernorm")
    assert "ln_gamma" in m and "eps=1e-06" in m and "became NaN" in m and "token row [0]" in m
    m = _stage(messages, "weights")
    assert "x @ w_proj" in m and "FP16" in m and "became inf" in m and "token row [0]" in m
    assert np.isinf(out.weights[0].astype(np.float32)).any()
    slot = int(c["inputs"]["slot_mapping"][0])
    blk, off = divmod(slot, BS)
    assert np.isnan(out.k_scale[blk, off]) and (out.k_cache[blk, off] == 0).all()
    other = int(c["inputs"]["slot_mapping"][1])
    assert np.isfinite(out.k_scale[other // BS, other % BS])


def test_bf16_max_in_x_warns_fp8(cases):
    """FP8 path: the same element overflows ``x @ w_k`` to inf in BF16 (DeepSeek's linear);
    the warning names the stage and its arguments."""
    c = cases["fp8"]
    x = c["inputs"]["x"].copy()
    x[1, 0] = BF16_MAX
    _out, messages = _warned(c, x=x)
    m = _stage(messages, "k_linear")
    assert "x @ w_k" in m and "w_k_scale" in m and "became inf" in m and "token row [1]" in m


def test_fp16_key_scale_overflow_warns(cases):
    """``ln_gamma`` at BF16 max: a finite key of ~1e38; its INT8 scale ``FP16(amax / 127)``
    overflows FP16 (max 65504) to inf -- written into the cache, and warned at the quant."""
    c = cases["int8"]
    g = c["inputs"]["ln_gamma"].copy()
    g[3] = BF16_MAX
    out, messages = _warned(c, ln_gamma=g)
    m = _stage(messages, "k_quant")
    assert "became inf" in m and "cache" in m
    s = c["inputs"]["slot_mapping"]
    scales = np.array([out.k_scale[v // BS, v % BS] for v in s if v >= 0], np.float32)
    assert np.isinf(scales).any()
