"""One DeepSeek-V3.2 attention layer step (``dsa_attention_step``): the step is the public
goldens composed stage by stage, bit for bit; the written cache slots hold the prologs' own
quantized rows; NaN rows no stage may read change no output bit; a slot of -1 is not written;
no argument is written. Both paths, small shapes (the 7168-wide weights are fixed by the model,
so each case is built once per module)."""

from __future__ import annotations

import numpy as np
import pytest
from tilesim.reference.cases.dsa_attention_step import dsa_attention_step_make_case
from tilesim.reference.dsa import sparse_attention_antiquant, sparse_attention_antiquant_kv_split
from tilesim.reference.dsa_attention_step import AttentionStepResult, dsa_attention_step
from tilesim.reference.dsa_indexer import dsa_indexer
from tilesim.reference.dsa_indexer_prolog import dsa_indexer_prolog
from tilesim.reference.mla_prolog import mla_prolog
from tilesim.shared.dsa_attention_step import STEP_FIELDS
from tilesim.shared.layouts.index_cache import fp8_page_views
from tilesim.shared.layouts.mla_cache import unpack_pypto_rows
from tilesim.shared.layouts.slots import slots_from_block_table
from tilesim.shared.models import DEEPSEEK_V32

PATHS = ("int8", "fp8")
#: visible 300 / 1000 tokens with topk 128: most visible latent rows are never selected
SMALL = dict(seq_lens=(300, 1000), s1=2, topk=128, spare_blocks=2)


def _bits(v) -> np.ndarray:
    a = np.ascontiguousarray(np.asarray(v))
    return a.view(np.uint8).reshape(-1)


def _same_bits(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return np.asarray(a).shape == np.asarray(b).shape and np.array_equal(_bits(a), _bits(b))


def _call(case, **over):
    inputs = {**case["inputs"], **over}
    return dsa_attention_step(**inputs, **case["params"], progress=False)


def compose(inputs: dict, params: dict, slots=None, *, prologs_only=False):
    """The four public goldens called one after the other, by hand (``prologs_only``: the
    two prologs)."""
    path, bs, topk = params["path"], params["block_size"], params["topk"]
    g = inputs.get
    bt, lens = g("block_table"), g("seq_lens")
    if slots is None:
        ql = g("q_lens")
        ql = np.full(lens.size, g("x").shape[0] // lens.size) if ql is None else ql
        slots = slots_from_block_table(bt, lens, q_lens=ql, block_size=bs)
    mla = mla_prolog(
        g("x"), g("w_dq"), g("w_uq_qr"), g("w_uq_qr_scale"), g("w_uk"), g("w_dkv_kr"),
        g("gamma_cq"), g("gamma_ckv"), g("cos"), g("sin"), slots, g("kv_cache"),
        kr_cache=g("kr_cache"), kv_scale_cache=g("kv_scale_cache"), w_dq_scale=g("w_dq_scale"),
        w_dkv_kr_scale=g("w_dkv_kr_scale"), path=path,
    )  # fmt: skip
    int8 = path == "int8"
    ip = dsa_indexer_prolog(
        g("x"), mla.q_norm, g("w_qb"), g("w_k"), g("w_proj"), g("ln_gamma"), g("ln_beta"),
        g("cos"), g("sin"), g("k_cache"), slots, q_norm_scale=mla.q_norm_scale if int8 else None,
        w_qb_scale=g("w_qb_scale"), w_k_scale=g("w_k_scale"), hadamard_q=g("hadamard_q"),
        hadamard_k=g("hadamard_k"), k_scale=g("k_scale"), path=path, block_size=bs,
    )  # fmt: skip
    if prologs_only:
        return mla, ip
    ids, scores = dsa_indexer(
        ip.q, ip.weights, ip.k_cache, bt, lens, q_scale=ip.q_scale if int8 else None,
        k_scale=ip.k_scale if int8 else None, q_lens=g("q_lens"), path=path, topk=topk,
        block_size=bs,
    )  # fmt: skip
    t = g("x").shape[0]
    qn, qr = mla.query_nope.reshape(t * 128, 512), mla.query_rope.reshape(t * 128, 64)
    kw = dict(nq=128, softmax_scale=DEEPSEEK_V32.model_softmax_scale, topk=topk, block_size=bs,
              tiling=params["tiling"])  # fmt: skip
    if mla.kr_cache is not None:
        out = sparse_attention_antiquant_kv_split(
            qn, qr, mla.kv_cache.reshape(-1, 512), mla.kr_cache.reshape(-1, 64),
            mla.kv_scale_cache.reshape(-1, 4), ids, bt, lens, **kw,
        )  # fmt: skip
    else:
        out = sparse_attention_antiquant(qn, qr, mla.kv_cache, ids, bt, lens, layout="pypto", **kw)
    return mla, ip, ids, scores, out.reshape(t, 128, 512)


@pytest.fixture(scope="module", params=PATHS)
def run(request):
    case = dsa_attention_step_make_case(path=request.param, **SMALL)
    snap = {k: _bits(v).copy() for k, v in case["inputs"].items() if isinstance(v, np.ndarray)}
    return case, _call(case), snap


def test_step_is_the_public_goldens_composed_bit_for_bit(run):
    case, res, _ = run
    mla, ip, ids, scores, out = compose(case["inputs"], case["params"])
    assert isinstance(res, AttentionStepResult) and res._fields == STEP_FIELDS
    want = (*mla, ip.q, ip.q_scale, ip.weights, ip.k_cache, ip.k_scale, ids, scores, out)
    for field, w in zip(STEP_FIELDS, want, strict=True):
        assert _same_bits(getattr(res, field), w), field
    # the composition did something a broken step would miss: every row attends
    k = np.minimum(np.asarray([299, 300, 999, 1000]), case["params"]["topk"])
    assert ((res.topk_indices >= 0).sum(axis=1) == k).all()
    assert np.isfinite(res.attn_out.astype(np.float32)).all()
    assert np.abs(res.attn_out.astype(np.float32)).max() > 0


def test_no_argument_is_written(run):
    case, _, snap = run
    for k, v in case["inputs"].items():
        if isinstance(v, np.ndarray):
            assert np.array_equal(_bits(v), snap[k]), k


def _latent_2d(fields, split: bool) -> list:
    """The latent cache as 2-D ``[rows, d]`` arrays (one per field of the layout)."""
    if not split:
        return [fields[0]]
    return [c.reshape(-1, w) for c, w in zip(fields, (512, 64, 4), strict=True)]


def _latent_rows(fields, rows, split: bool):
    """``(codes, rope, scales)`` bytes of ``rows``, decoded through shared/mla_cache."""
    rows = np.asarray(rows, dtype=np.int64)
    if split:
        return tuple(_bits(c[rows]) for c in _latent_2d(fields, True))
    r = unpack_pypto_rows(fields[0][rows])
    return _bits(r.nope), _bits(r.rope), _bits(r.scales)


def test_written_slots_decode_to_the_prologs_quantized_rows(run):
    """Each new token's latent row and index key, read back through the layout modules, are
    what the prologs quantize for it on their own (a fresh cache, token t at row t), and every
    row not written keeps the input's bytes."""
    case, res, _ = run
    inp, prm = case["inputs"], case["params"]
    slots, t = case["meta"]["slots"], inp["x"].shape[0]
    split = "kr_cache" in inp
    fresh = {"kv_cache": np.zeros((t, 656), inp["kv_cache"].dtype)}
    if split:
        fresh = {"kv_cache": np.zeros((t, 512), inp["kv_cache"].dtype),
                 "kr_cache": np.zeros((t, 64), inp["kr_cache"].dtype),
                 "kv_scale_cache": np.zeros((t, 4), np.float32)}  # fmt: skip
    k_cache, k_scale = _fresh_index(prm, t)
    ref_in = {**inp, **fresh, "k_cache": k_cache, "k_scale": k_scale}
    mla, ip = compose(ref_in, prm, slots=np.arange(t), prologs_only=True)
    out_fields = (res.kv_cache, res.kr_cache, res.kv_scale_cache)
    got = _latent_rows(out_fields, slots, split)
    want = _latent_rows((mla.kv_cache, mla.kr_cache, mla.kv_scale_cache), np.arange(t), split)
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g, w)
    bs = prm["block_size"]
    gk, gs = _index_rows(res.k_cache, res.k_scale, slots, bs, prm["path"])
    wk, ws = _index_rows(ip.k_cache, ip.k_scale, np.arange(t), bs, prm["path"])
    assert np.array_equal(gk, wk) and np.array_equal(gs, ws)
    in_fields = (inp["kv_cache"], inp.get("kr_cache"), inp.get("kv_scale_cache"))
    keep = np.ones(_latent_2d(in_fields, split)[0].shape[0], bool)
    keep[slots] = False
    for a, b in zip(_latent_2d(in_fields, split), _latent_2d(out_fields, split), strict=True):
        assert np.array_equal(_bits(a[keep]), _bits(b[keep]))
        assert not np.array_equal(_bits(a[~keep]), _bits(b[~keep]))  # the new rows differ


def _fresh_index(prm, t):
    bs = prm["block_size"]
    nb = -(-t // bs)
    if prm["path"] == "int8":
        return np.zeros((nb, bs, 128), np.int8), np.zeros((nb, bs), np.float16)
    return np.zeros((nb, bs * 132), np.uint8), None


def _index_rows(k_cache, k_scale, rows, bs, path):
    blk, off = np.asarray(rows) // bs, np.asarray(rows) % bs
    if path == "int8":
        return _bits(k_cache[blk, off]), _bits(k_scale[blk, off])
    v = fp8_page_views(k_cache, block_size=bs)
    return _bits(v.codes[blk, off]), _bits(v.scales[blk, off])


# ----------------------------------------------------------------------------- NaN poison
def _poison_latent(inputs: dict, rows: np.ndarray) -> dict:
    if "kr_cache" in inputs:
        kv = inputs["kv_cache"].copy()
        kr = inputs["kr_cache"].copy()
        ks = inputs["kv_scale_cache"].copy()
        kv.view(np.uint8).reshape(-1, 512)[rows] = 0x7F  # INT8 127 / E4M3 NaN
        kr.view(np.uint16).reshape(-1, 64)[rows] = 0x7FC0
        ks.reshape(-1, 4)[rows] = np.nan
        return {"kv_cache": kv, "kr_cache": kr, "kv_scale_cache": ks}
    kv = inputs["kv_cache"].copy()
    kv.view(np.uint8)[rows, :512] = 0x7F
    kv.view(np.uint8)[rows, 512:640] = 0xFF  # rope BF16 NaN
    kv.view(np.uint8)[rows, 640:] = 0xFF  # scales FP32 NaN
    return {"kv_cache": kv}


@pytest.mark.parametrize("path", PATHS)
def test_nan_rows_outside_written_and_selected_change_no_output_bit(path):
    """A clean case (no poison); then every latent row that is neither written nor selected by
    any row's ids, and every index row that is neither written nor visible, set to NaN: every
    output that is not a cache copy keeps its bits, and the written rows too."""
    case = dsa_attention_step_make_case(path=path, poison_unused=False, **SMALL)
    clean = _call(case)
    inp, bs = case["inputs"], case["params"]["block_size"]
    slots = case["meta"]["slots"]
    n_rows = case["meta"]["n_blocks"] * bs
    keep = np.zeros(n_rows, bool)
    keep[slots] = True
    bt, lens = inp["block_table"], inp["seq_lens"]
    row_b = np.repeat(np.arange(lens.size), inp["x"].shape[0] // lens.size)
    for r, ids in enumerate(clean.topk_indices):
        ids = ids[ids >= 0].astype(np.int64)
        keep[bt[row_b[r], ids // bs].astype(np.int64) * bs + ids % bs] = True
    latent = np.flatnonzero(~keep)
    visible = keep.copy()
    for b, n in enumerate(lens):
        pos = np.arange(int(n))
        visible[bt[b, pos // bs].astype(np.int64) * bs + pos % bs] = True
    index_rows = np.flatnonzero(~visible)
    assert latent.size > 1000 and index_rows.size >= 2 * bs  # unselected and spare rows exist
    over = _poison_latent(inp, latent)
    blk, off = index_rows // bs, index_rows % bs
    if path == "int8":
        kc, ksc = inp["k_cache"].copy(), inp["k_scale"].copy()
        kc[blk, off], ksc[blk, off] = 127, np.nan
        over.update(k_cache=kc, k_scale=ksc)
    else:
        kc = inp["k_cache"].copy()
        v = fp8_page_views(kc, block_size=bs)
        v.codes.view(np.uint8)[blk, off] = 0x7F
        v.scales[blk, off] = np.nan
        over["k_cache"] = kc
    poisoned = _call(case, **over)
    caches = {"kv_cache", "kr_cache", "kv_scale_cache", "k_cache", "k_scale"}
    for field in STEP_FIELDS:
        if field not in caches:
            assert _same_bits(getattr(poisoned, field), getattr(clean, field)), field
    got = _latent_rows((poisoned.kv_cache, poisoned.kr_cache, poisoned.kv_scale_cache), slots,
                       "kr_cache" in inp)  # fmt: skip
    want = _latent_rows((clean.kv_cache, clean.kr_cache, clean.kv_scale_cache), slots,
                        "kr_cache" in inp)  # fmt: skip
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    # the poison is visible where a stage does read: one selected, unwritten latent row
    sel = np.flatnonzero(keep & ~np.isin(np.arange(n_rows), slots))[:1]
    hit = _call(case, **_poison_latent(inp, sel))
    assert np.isnan(hit.attn_out.astype(np.float32)).any()


# ----------------------------------------------------------------------------- slot -1
@pytest.mark.parametrize("path", PATHS)
def test_slot_minus_one_is_not_written(path):
    """Token 0's slot -1: its latent and index rows keep the caller's (valid) bytes, the
    other tokens' rows are written as usual, and the step is still the composition of the
    goldens with those slots."""
    case = dsa_attention_step_make_case(path=path, poison_unused=False, **SMALL)
    inp, prm = case["inputs"], case["params"]
    slots = case["meta"]["slots"].copy()
    skipped = int(slots[0])
    slots[0] = -1
    res = _call(case, slot_mapping=slots)
    mla, ip, ids, scores, out = compose(inp, prm, slots=slots)
    want = (*mla, ip.q, ip.q_scale, ip.weights, ip.k_cache, ip.k_scale, ids, scores, out)
    for field, w in zip(STEP_FIELDS, want, strict=True):
        assert _same_bits(getattr(res, field), w), field
    split, bs = "kr_cache" in inp, prm["block_size"]
    fields_in = (inp["kv_cache"], inp.get("kr_cache"), inp.get("kv_scale_cache"))
    fields_out = (res.kv_cache, res.kr_cache, res.kv_scale_cache)
    before = _latent_rows(fields_in, [skipped], split)
    after = _latent_rows(fields_out, [skipped], split)
    assert all(np.array_equal(b, a) for b, a in zip(before, after, strict=True))
    assert np.array_equal(_index_rows(res.k_cache, res.k_scale, [skipped], bs, path)[0],
                          _index_rows(inp["k_cache"], inp.get("k_scale"), [skipped], bs,
                                      path)[0])  # fmt: skip
    full = _call(case)  # the written rows of the other tokens are those of the full step
    got = _latent_rows(fields_out, slots[1:], split)
    want_rows = _latent_rows((full.kv_cache, full.kr_cache, full.kv_scale_cache), slots[1:], split)
    assert all(np.array_equal(g, w) for g, w in zip(got, want_rows, strict=True))
    changed = _latent_rows((full.kv_cache, full.kr_cache, full.kv_scale_cache), [skipped], split)
    assert not all(np.array_equal(b, c) for b, c in zip(before, changed, strict=True))
