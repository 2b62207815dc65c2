"""DeepSeek-V3.2 lightning-indexer prolog golden (``dsa_indexer_prolog``): the float64 oracle
within a stated bound, the cache writes (slots, padding, NaN-poisoned rows), the composition
with the indexer golden, trace and cost.

Oracle (``tests/oracles/dsa_indexer_prolog.py``): the prolog's math in float64 from the same
inputs, no BF16 / FP32 rounding and no final quantization. Bound per 128-vector ``v`` (the
rotated q head or key) between the golden's dequantized output ``codes * scale`` and the
oracle: the BF16 roundings of the chain (each at most ``u = 2^-8`` relative per element; the
RoPE rotation and the orthonormal Hadamard keep L2 norms, so they add up in L2: ``n_bf16 * u
* ||v||``, ``n_bf16`` = 3 for q, 6 for k with the LayerNorm's gain up to 3 for gamma in
[0.5, 1.5]) plus the quantization (INT8: half a code step, ``sqrt(128) * amax / 254``; FP8:
``2^-4`` relative per element), plus 2^-7 ``||v||`` for the FP32 steps and the BF16 Hadamard
matrix's ``1.1e-4`` offset. Data: the case builder at ``hidden = rank = 256``.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import numpy as np
import pytest
from oracles.dsa_indexer import oracle_indexer
from oracles.dsa_indexer_prolog import fp8_page_row, oracle_prolog
from tilesim.reference import dsa_indexer, dsa_indexer_prolog, dsa_indexer_prolog_make_case
from tilesim.shared.dsa_indexer_prolog import check_meta, check_values, cost
from tilesim.shared.layouts.index_cache import unpack_fp8_pages
from tilesim.shared.trace import check_record

BS = 16
SMALL = dict(hidden=256, rank=256, block_size=BS)


def _case(**kw):
    kw = {**SMALL, **kw}
    return dsa_indexer_prolog_make_case(None, seed=kw.pop("seed", 5), **kw)


def _run(case, **over):
    return dsa_indexer_prolog(**case["inputs"], **{**case["params"], **over})


def _dequant(res, path, slots, bs):
    """Dequantized rotated q ``[T, 64, 128]`` and keys of the written tokens (float64)."""
    q = np.asarray(res.q).astype(np.float64) * np.asarray(res.q_scale, np.float64)[..., None]
    keys = []
    for s in slots:
        if path == "int8":
            codes = res.k_cache[s // bs, s % bs].astype(np.float64)
            keys.append(codes * float(res.k_scale[s // bs, s % bs]))
        else:
            codes, scale = fp8_page_row(res.k_cache, int(s), bs)
            keys.append(codes * scale)
    return q, np.array(keys)


def _check_bound(got, want, path, n_bf16):
    norm = np.linalg.norm(want, axis=-1)
    amax = np.abs(want).max(axis=-1)
    quant = np.sqrt(128) * amax / 254 if path == "int8" else 2.0**-4 * norm + 2.0**-20
    bound = (n_bf16 * 2.0**-8 + 2.0**-7) * norm + quant
    err = np.linalg.norm(got - want, axis=-1)
    assert (err <= bound).all(), float((err / bound).max())
    return float((err / norm).max())


CONFIGS = [
    dict(path="int8"),
    dict(path="fp8"),
    dict(path="int8", rope_pairing="interleaved"),
    dict(path="fp8", rope_pairing="interleaved"),
    dict(path="fp8", q_lens=(5, 3), seq_lens=(40, 3)),
]


@pytest.mark.parametrize("kw", CONFIGS, ids=lambda k: "-".join(map(str, k.values())))
def test_golden_is_the_float64_math_within_the_rounding_bound(kw):
    if kw.get("rope_pairing") == "interleaved" and kw["path"] == "int8":
        case = _case(**kw)
        inp = case["inputs"]
        # the interleaved rotation reads one angle per pair: a [T, 32] table
        inp["cos"], inp["sin"] = inp["cos"][:, :32], inp["sin"][:, :32]
    else:
        case = _case(**kw)
    p = case["params"]
    res = _run(case)
    ora = oracle_prolog(case["inputs"], path=p["path"], rope_pairing=p["rope_pairing"])
    slots = case["inputs"]["slot_mapping"]
    q, k = _dequant(res, p["path"], slots[slots >= 0], BS)
    rel_q = _check_bound(q, ora["q"], p["path"], 3)
    rel_k = _check_bound(k, ora["k"][slots >= 0], p["path"], 6)
    assert rel_q > 0 and rel_k > 0  # quantized: not the float64 values themselves
    w = np.asarray(res.weights, np.float64)
    want = ora["weights"]
    if p["path"] == "fp8":
        want = want * np.asarray(res.q_scale, np.float64)  # the q scale folded in
        assert np.abs(w - want).max() <= (3 * 2.0**-24) * np.abs(want).max()
    else:  # BF16 projection, then FP16: 2^-8 + 2^-11 relative, FP16 subnormal floor
        assert (np.abs(w - want) <= (2.0**-8 + 2.0**-10) * np.abs(want) + 2.0**-24).all()


def test_wrong_rope_pairing_or_missing_hadamard_leaves_the_bound():
    """The bound is tight enough to see a wrong arithmetic: the pre-fix layout against the
    post-fix oracle, or the keys of an unrotated chain, fail it."""
    case = _case(path="fp8")
    res = _run(case, rope_pairing="interleaved")
    ora = oracle_prolog(case["inputs"], path="fp8", rope_pairing="halves")
    q, _ = _dequant(res, "fp8", [], BS)
    with pytest.raises(AssertionError):
        _check_bound(q, ora["q"], "fp8", 3)
    slots = case["inputs"]["slot_mapping"]
    _, k = _dequant(_run(case), "fp8", slots, BS)
    unrotated = ora["k"] @ np.linalg.inv(_hadamard())
    with pytest.raises(AssertionError):
        _check_bound(k, unrotated, "fp8", 6)


def _hadamard():
    from oracles.dsa_indexer_prolog import hadamard_orthonormal

    return hadamard_orthonormal(128)


# ----------------------------------------------------------------------------- cache writes
@pytest.mark.parametrize("path", ["int8", "fp8"])
def test_only_the_written_slots_change_in_a_poisoned_cache(path):
    case = _case(path=path, seq_lens=(20, 33, 1), s1=1, pad=2, spare_blocks=2)
    inp = case["inputs"]
    before = {k: np.array(v, copy=True) for k, v in inp.items()}
    res = _run(case)
    for k, v in inp.items():  # inputs never written, bit for bit (NaNs included)
        assert np.array_equal(np.asarray(v).view(np.uint8), before[k].view(np.uint8)), k
    slots = inp["slot_mapping"]
    assert (slots == -1).sum() == 2
    live = slots[slots >= 0]
    if path == "int8":
        rows_new = res.k_cache.reshape(-1, 128).view(np.uint8)
        rows_old = inp["k_cache"].reshape(-1, 128).view(np.uint8)
        sc_new, sc_old = res.k_scale.reshape(-1), inp["k_scale"].reshape(-1)
    else:
        new = unpack_fp8_pages(res.k_cache, block_size=BS)
        old = unpack_fp8_pages(inp["k_cache"], block_size=BS)
        rows_new = new.codes.reshape(-1, 128).view(np.uint8)
        rows_old = old.codes.reshape(-1, 128).view(np.uint8)
        sc_new, sc_old = new.scales.reshape(-1), old.scales.reshape(-1)
    sc_new_b = sc_new.view(np.uint8).reshape(sc_new.size, -1)
    sc_old_b = sc_old.view(np.uint8).reshape(sc_old.size, -1)
    changed = np.flatnonzero(
        (rows_new != rows_old).any(axis=1) | (sc_new_b != sc_old_b).any(axis=1)
    )
    assert set(changed.tolist()) == set(live.tolist())  # the poisoned slots were overwritten
    assert np.isfinite(sc_new[live]).all() and np.isnan(sc_old[live]).all()
    untouched = np.setdiff1d(np.arange(sc_new.size), live)
    assert np.array_equal(sc_new[untouched].view(np.uint8), sc_old[untouched].view(np.uint8))
    assert np.isnan(sc_new[untouched]).any()  # poisoned rows stay poisoned


def test_padding_tokens_still_get_queries_and_weights():
    case = _case(seq_lens=(3,), s1=1, pad=3)
    res = _run(case)
    assert res.q.shape[0] == 4 and (case["inputs"]["slot_mapping"][1:] == -1).all()
    assert np.isfinite(res.q_scale.astype(np.float64)).all()
    # a padding token's query is the same function of its own inputs as any other token's
    solo = dict(case["inputs"])
    for k in ("x", "q_norm", "q_norm_scale", "cos", "sin", "slot_mapping"):
        solo[k] = solo[k][2:3]
    res1 = dsa_indexer_prolog(**solo, **case["params"])
    np.testing.assert_array_equal(res1.q[0], res.q[2])
    np.testing.assert_array_equal(res1.weights[0], res.weights[2])


@pytest.mark.parametrize(
    "slot, words",
    [(-2, ["slot_mapping[1]", "-2", "-1 (skip)"]), (10**6, ["slot_mapping[1]", "1000000"])],
)
def test_out_of_range_slots_are_named(slot, words):
    case = _case(seq_lens=(5, 6), s1=1)
    case["inputs"]["slot_mapping"] = case["inputs"]["slot_mapping"].copy()
    case["inputs"]["slot_mapping"][1] = slot
    with pytest.raises(ValueError) as e:
        _run(case)
    for w in words + ["num_blocks"]:
        assert w in str(e.value)


def test_a_slot_given_twice_is_refused():
    case = _case(seq_lens=(5, 6), s1=1)
    s = case["inputs"]["slot_mapping"].copy()
    s[1] = s[0]
    case["inputs"]["slot_mapping"] = s
    with pytest.raises(ValueError, match=r"at most once.*tokens \[0, 1\]"):
        _run(case)


# ----------------------------------------------------------------------------- composition
@pytest.mark.parametrize("path", ["int8", "fp8"])
def test_prolog_then_indexer_is_the_oracle_chain(path):
    """The prolog writes the new keys, the indexer golden reads that cache with the prolog's
    q and weights: its scores and ids equal the independent indexer oracle's on the same
    bytes, and the new keys decode (shared/layouts/index_cache.py and by hand) to what was
    written."""
    case = _case(path=path, seq_lens=(40, 70), s1=2, poison_unused=False)
    meta, inp = case["meta"], case["inputs"]
    res = _run(case)
    idx_in = {"q": res.q, "weights": res.weights, "k_cache": res.k_cache,
              "block_table": meta["block_table"], "seq_lens": meta["seq_lens"]}  # fmt: skip
    if path == "int8":
        idx_in.update(q_scale=res.q_scale, k_scale=res.k_scale)
    ids, scores = dsa_indexer(**idx_in, path=path, topk=32, block_size=BS)
    want_ids, want_scores = oracle_indexer(idx_in, path=path, topk=32, block_size=BS)
    np.testing.assert_array_equal(scores, want_scores)
    np.testing.assert_array_equal(ids, want_ids)
    # the newest token of each sequence sees itself: its own key is in its scores
    assert np.isfinite(scores[1, 39]) and np.isfinite(scores[3, 69])
    if path == "fp8":
        pages = unpack_fp8_pages(res.k_cache, block_size=BS)
        for s in inp["slot_mapping"]:
            codes, scale = fp8_page_row(res.k_cache, int(s), BS)
            np.testing.assert_array_equal(pages.codes[s // BS, s % BS].astype(np.float64), codes)
            assert pages.scales[s // BS, s % BS] == np.float32(scale)
            assert scale > 0 and np.log2(scale) == np.round(np.log2(scale))  # UE8M0


def test_scores_follow_the_float64_chain():
    """The quantized chain keeps the ranking's meaning: scores of the new tokens against the
    cache's keys, recomputed in float64 from the oracle's unquantized q, k and weights for the
    new keys, agree within the quantization's size (relative L2 below 0.1)."""
    case = _case(path="fp8", seq_lens=(8,), s1=4, poison_unused=False)
    inp, meta = case["inputs"], case["meta"]
    res = _run(case)
    ids, scores = dsa_indexer(res.q, res.weights, res.k_cache, meta["block_table"],
                              meta["seq_lens"], path="fp8", topk=8, block_size=BS)  # fmt: skip
    ora = oracle_prolog(inp, path="fp8")
    w = ora["weights"] * np.asarray(res.q_scale, np.float64)  # folded scale: compare like
    qd = ora["q"] / np.asarray(res.q_scale, np.float64)[..., None]
    for r, pos in enumerate(range(4, 8)):
        got = scores[r, 4 : pos + 1]
        k = ora["k"][: pos - 3]
        want = np.einsum("h,hj->j", w[r], np.maximum(qd[r] @ k.T, 0))
        assert np.linalg.norm(got - want) <= 0.1 * np.linalg.norm(want)


# ----------------------------------------------------------------------------- trace, cost
def test_trace_records_and_cost():
    case = _case(seq_lens=(5, 6), s1=1, pad=1)
    recs = []
    res = _run(case, trace=recs.append)
    flop = sum(r["flop"] for r in recs)  # the stages' matmuls; the writes count none
    recs = [r for r in recs if r["extra"]["stage"] == "cache_write"]
    assert len(recs) == 3
    for t, rec in enumerate(recs):
        check_record(rec)
        assert rec["op"] == "dsa_indexer_prolog" and rec["step"] == t
        got_max = np.abs(np.asarray(res.q[t], np.float64)).max(axis=-1)
        assert rec["row_max"].shape == (64,) and (rec["row_max"] > 0).all()
        assert (got_max <= 127).all()
    assert [r["keys_used"] for r in recs] == [1, 1, 0]
    assert recs[2]["extra"]["slot"] == -1 and recs[2]["extra"]["block"] == -1
    ins = inputs_namespace(case)
    c = cost(check_values(check_meta(ins, **case["params"])))
    assert flop == c["flop"]
    per_tok = 2 * (256 * 8192 + 256 * 128 + 256 * 64) + 2 * 65 * 128 * 128
    assert c["flop"] == 3 * per_tok and c["written"] == 2


def inputs_namespace(case):
    """The case's arrays by the names of the prototype (an optional array it omits: None)."""
    from tilesim.shared.dsa_indexer_prolog import prolog_inputs

    names = inspect.signature(prolog_inputs).parameters
    return SimpleNamespace(**{n: case["inputs"].get(n) for n in names})


@pytest.mark.torch
def test_torch_in_torch_out_same_bits():
    torch = pytest.importorskip("torch")
    from tilesim.shared.interop import to_numpy, to_torch

    case = _case(path="fp8", seq_lens=(5, 6), s1=1)
    res = _run(case)
    tin = {k: to_torch(v) for k, v in case["inputs"].items()}
    tres = dsa_indexer_prolog(**tin, **case["params"])
    assert isinstance(tres.q, torch.Tensor) and isinstance(tres.k_scale, torch.Tensor)
    for a, b in zip(res, tres, strict=True):
        assert np.array_equal(np.asarray(a).view(np.uint8), to_numpy(b).view(np.uint8))
    # FP8: k_scale is a copy of the scales inside the new pages
    np.testing.assert_array_equal(res.k_scale, unpack_fp8_pages(res.k_cache, block_size=BS).scales)
