"""NaN poisoning of every slot an op never reads, for every reference op (docs/numerics.md).

In real serving, cache rows nobody has written yet hold garbage; FlashMLA's tests fill every
unused slot with NaN to prove the kernel never lets one leak into the output. Here each test
builds one case twice: once with ordinary finite data in the unread slots, once with those
slots poisoned (NaN, or +-inf where the dtype has it; garbage integers for index slots), and
asserts that the two outputs are the same BITS. A generator crosses the corners of each op
(layout, quant rule, chunk width, slot order, which tensor is poisoned, ...) into the
parameter grid, and a control per op poisons one slot that IS read and checks the output
changes, so the comparison is not vacuous.

Unread slots per op (``docs/ops/msa.md``, ``docs/ops/dsa.md``,
``docs/ops/moe.md``, ``docs/numerics.md`` "Masking and NaN"):

* DeepSeek sparse attention (packed ``pypto`` / ``flashmla`` and ``kv_split``): cache rows no
  used top-k entry reaches, cache rows past each sequence's length (the tail of its last
  block), ``topk_indices`` entries past ``cur_seq`` and unused ``block_table`` columns;
* MSA sparse decode: the masked tail of the current block (key rows at or past ``seq_len``),
  selected future blocks and blocks that are not selected;
* MSA main branch: the padding slots of ``key_blocks`` / ``value_blocks`` and the rows of the
  last partial block past ``n``;
* MoE grouped GEMM: rows of ``sorted_tokens`` past ``expert_cumsum[-1]`` and the weights of
  experts with no tokens;
* MSA lightning indexer: key rows at or beyond ``seq_len``.

Every op listed is NaN-robust; an op found not to be gets its corners marked
``xfail(strict=True)`` with the reason and the slot, so they turn into failures (XPASS) the
day the fix lands and the mark must go.
"""

from __future__ import annotations

import itertools
import math

import ml_dtypes
import numpy as np
import pytest
import tilesim.reference as ref
from tilesim.reference import (
    dsa_make_case,
    moe_grouped_gemm,
    moe_make_case,
    msa_indexer,
    msa_main_branch,
    msa_make_case,
    msa_sparse_decode,
)
from tilesim.shared.tiling import MsaTiling, SaTileShapeConfig

BF = ml_dtypes.bfloat16
F32 = np.float32
BY = 128  # MSA key block
INT32_MAX, INT32_MIN = 2**31 - 1, -(2**31)
#: garbage integers for index slots that are never read
INT_GARBAGE = (INT32_MAX, INT32_MIN, -7, 10**6)


# ----------------------------------------------------------------------------- helpers
def _uint_view(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def assert_same_bits(got, want, what: str = "output") -> None:
    """Same dtype, shape and bit pattern; the message names the first differing element."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    diff = _uint_view(got) != _uint_view(want)
    if diff.any():
        idx = tuple(int(i) for i in np.argwhere(diff)[0])
        raise AssertionError(
            f"{what}: {int(diff.sum())} of {diff.size} elements differ; first at {list(idx)}: "
            f"{got[idx]!r} (poisoned) vs {want[idx]!r} (clean)"
        )


def _canon(v):
    """A comparable form of a trace value (arrays by dtype, shape and bytes)."""
    if isinstance(v, np.ndarray) or isinstance(v, np.generic):
        a = np.asarray(v)
        return ("array", a.dtype.str, a.shape, _uint_view(a.reshape(-1)).tobytes())
    if isinstance(v, dict):
        return tuple(sorted((k, _canon(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_canon(x) for x in v)
    return v


def assert_same_records(got: list, want: list) -> None:
    assert len(got) == len(want) > 0
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert _canon(g) == _canon(w), f"trace record {i} differs: {g} vs {w}"


def poison_float(a: np.ndarray, where: np.ndarray, value: float) -> np.ndarray:
    """A copy of ``a`` with ``value`` (cast to ``a``'s dtype) where ``where`` is True;
    asserts the poison landed (the test would be vacuous otherwise)."""
    out = a.copy()
    out[where] = np.asarray(value, dtype=F32).astype(a.dtype)
    assert where.any(), "nothing to poison: the corner is vacuous"
    return out


def nonfinite_count(a: np.ndarray) -> int:
    return int((~np.isfinite(np.asarray(a).astype(F32))).sum())


# ============================================================================= DeepSeek
DSA_ACTS = (23, 100, 40)  # short (< topk), long (unreached positions), medium
DSA_S1, DSA_TOPK, DSA_BS, DSA_NQ = 2, 64, 16, 16
#: (quant, topk_rule, softmax, invalid_frac, kv_splits): every value of each corner at least
#: once (split-KV combines online states only)
DSA_RECIPES = (
    ("fp8", "seeds", "online", 0.0, 1),
    ("int8", "causal", "online", 0.3, 1),
    ("fp8", "causal", "per_tile", 0.0, 1),
    ("int8", "seeds", "per_tile", 0.3, 1),
    ("fp8", "causal", "online", 0.3, 2),
)
DSA_KINDS = ("unreached_rows", "rows_past_seq_len", "entries_past_cur_seq", "block_table_tail",
             "all")  # fmt: skip
DSA_LAYOUTS = ("pypto", "flashmla", "kv_split")


def dsa_corners():
    for kind, layout, recipe in itertools.product(DSA_KINDS, DSA_LAYOUTS, DSA_RECIPES):
        yield pytest.param(kind, layout, recipe, id=f"{kind}-{layout}-{'-'.join(map(str, recipe))}")


def _dsa_case(layout, recipe, *, poison_unreached: bool, seed=3) -> dict:
    quant, rule, softmax, invalid, splits = recipe
    return dsa_make_case(
        None, seed=seed, actual_seq=DSA_ACTS, s1=DSA_S1, nq=DSA_NQ, topk=DSA_TOPK,
        block_size=DSA_BS, quant=quant, layout=layout, topk_rule=rule, invalid_frac=invalid,
        tiling=SaTileShapeConfig(g_tile=8, s_kv_tile=16, softmax=softmax, kv_splits=splits),
        poison_unreached=poison_unreached, progress=False,
    )  # fmt: skip


def _dsa_run(case: dict, trace=None) -> np.ndarray:
    return getattr(ref, case["op"])(**case["inputs"], **case["params"], trace=trace)


def _cur_seq() -> np.ndarray:
    """Entries each query token uses, restated: ``min(max(act - s1 + 1 + s, 0), topk)``."""
    return np.array(
        [min(max(a - DSA_S1 + 1 + s, 0), DSA_TOPK) for a in DSA_ACTS for s in range(DSA_S1)]
    )


def _rows_past_seq_len(block_table: np.ndarray) -> np.ndarray:
    """Physical cache rows of positions ``>= act`` inside each sequence's allocated blocks."""
    rows = []
    for b, act in enumerate(DSA_ACTS):
        for pos in range(act, math.ceil(act / DSA_BS) * DSA_BS):
            rows.append(int(block_table[b, pos // DSA_BS]) * DSA_BS + pos % DSA_BS)
    return np.array(rows, dtype=np.int64)


def _poison_cache_rows(inputs: dict, rows: np.ndarray) -> None:
    """Every byte of the rows set to 0xFF: E4M3 NaN / INT8 -1 in the nope part, BF16 NaN in
    the rope part, FP32 NaN in the scales, whatever the packing order."""
    names = ("nope_cache",) if "nope_cache" in inputs else ("kn_quant", "kr", "kn_scales")
    for name in names:
        a = inputs[name].copy()
        a.view(np.uint8).reshape(a.shape[0], -1)[rows] = 0xFF
        inputs[name] = a


def _poison_dsa(inputs: dict, kind: str) -> None:
    """Poison (in the dict, with fresh arrays) the slots of ``kind`` that no used entry reads."""
    if kind in ("rows_past_seq_len", "all"):
        rows = _rows_past_seq_len(inputs["block_table"])
        assert rows.size > 0
        _poison_cache_rows(inputs, rows)
    if kind in ("entries_past_cur_seq", "all"):
        ti = inputs["topk_indices"].copy()
        cur = _cur_seq()
        for r in range(ti.shape[0]):
            tail = ti[r, cur[r] :]
            tail[:] = np.resize(np.array(INT_GARBAGE, dtype=np.int64), tail.size)
        assert (cur < DSA_TOPK).any()
        inputs["topk_indices"] = ti
    if kind in ("block_table_tail", "all"):
        bt = inputs["block_table"]
        wide = np.full((bt.shape[0], bt.shape[1] + 2), INT32_MAX, dtype=bt.dtype)
        for b, act in enumerate(DSA_ACTS):
            used = math.ceil(act / DSA_BS)
            wide[b, :used] = bt[b, :used]
            wide[b, used:] = np.resize(np.array(INT_GARBAGE, dtype=np.int64), wide.shape[1] - used)
        inputs["block_table"] = wide


def _widen_clean_block_table(inputs: dict) -> None:
    """The clean twin of the ``block_table_tail`` poison: the same width, unused = -1."""
    bt = inputs["block_table"]
    wide = np.full((bt.shape[0], bt.shape[1] + 2), -1, dtype=bt.dtype)
    wide[:, : bt.shape[1]] = bt
    inputs["block_table"] = wide


@pytest.mark.parametrize(("kind", "layout", "recipe"), list(dsa_corners()))
def test_dsa_unread_slots_never_reach_the_output(kind, layout, recipe):
    clean = _dsa_case(layout, recipe, poison_unreached=False)
    dirty = _dsa_case(layout, recipe, poison_unreached=kind in ("unreached_rows", "all"))
    if kind == "unreached_rows":
        assert dirty["meta"]["poisoned_rows"] > 0
    if kind in ("block_table_tail", "all"):
        _widen_clean_block_table(clean["inputs"])
    _poison_dsa(dirty["inputs"], kind)
    want_rec, got_rec = [], []
    want = _dsa_run(clean, want_rec.append)
    got = _dsa_run(dirty, got_rec.append)
    assert nonfinite_count(want) == 0
    assert_same_bits(got, want)
    assert_same_records(got_rec, want_rec)


@pytest.mark.parametrize("layout", DSA_LAYOUTS)
def test_dsa_control_a_poisoned_row_that_is_read_shows(layout):
    """The control: poison one row an entry of token 0 reaches -> NaN in that token's rows."""
    case = _dsa_case(layout, DSA_RECIPES[0], poison_unreached=False)
    inp = case["inputs"]
    pos = int(inp["topk_indices"][0, 0])
    _poison_cache_rows(inp, np.array([int(inp["block_table"][0, pos // DSA_BS]) * DSA_BS
                                      + pos % DSA_BS]))  # fmt: skip
    out = _dsa_run(case)
    assert nonfinite_count(out[:DSA_NQ]) > 0


# ============================================================================= MSA decode
DEC_HQ, DEC_HKV, DEC_D, DEC_NB, DEC_TOPK = 16, 2, 128, 8, 4
#: per batch row: seq_len (the current block partial) and its past / future selected blocks
DEC_ROWS = (
    dict(seq=3 * BY + 77, past=(0, 2), future=(6,)),  # cur 3: 51 masked tail keys
    dict(seq=5 * BY + 1, past=(1, 4), future=(7,)),  # cur 5: one kept key, 127 masked
)
DEC_KINDS = ("tail", "future", "unselected", "all")
DEC_TENSORS = ("k", "v", "kv")
#: (ntile, seeds_compat): one block per chunk (a future block = a fully masked chunk), the
#: seeds' width, a partial tail chunk kept / dropped (dropped keys are unread too)
DEC_CHUNKS = ((128, False), (512, False), (384, False), (384, True), (512, True))
DEC_ORDERS = ("current_first", "future_first")
DEC_VALUES = (np.nan, np.inf, -np.inf)


def _decode_ids(order: str) -> np.ndarray:
    rows = []
    for r in DEC_ROWS:
        cur = (r["seq"] - 1) // BY
        if order == "current_first":
            rows.append([cur, r["past"][0], r["future"][0], r["past"][1]])
        else:  # the future block in slot 0: the first chunk of ntile=128 is fully masked
            rows.append([r["future"][0], r["past"][0], r["past"][1], cur])
    return np.array(rows, dtype=np.int32)


def _decode_inputs(seed=7):
    rng = np.random.default_rng(seed)

    def bf(shape):
        return (rng.standard_normal(shape, dtype=F32) * F32(0.5)).astype(BF)

    q = bf((len(DEC_ROWS), DEC_HQ, DEC_D))
    k = bf((len(DEC_ROWS), DEC_HKV, DEC_NB, BY, DEC_D))
    v = bf((len(DEC_ROWS), DEC_HKV, DEC_NB, BY, DEC_D))
    return q, k, v, np.array([r["seq"] for r in DEC_ROWS], dtype=np.int64)


def _decode_unread(kind: str, ids: np.ndarray) -> np.ndarray:
    """bool ``[B, HKV, nb, BY, 1]``: the key rows of ``kind`` (by token position, restated)."""
    where = np.zeros((len(DEC_ROWS), DEC_NB, BY), dtype=bool)
    pos = np.arange(DEC_NB)[:, None] * BY + np.arange(BY)[None, :]  # token position
    for b, r in enumerate(DEC_ROWS):
        cur = (r["seq"] - 1) // BY
        selected = np.isin(np.arange(DEC_NB), ids[b])
        if kind in ("tail", "all"):
            where[b, cur] |= pos[cur] >= r["seq"]
        if kind in ("future", "all"):
            where[b] |= (selected & (np.arange(DEC_NB) > cur))[:, None]
        if kind in ("unselected", "all"):
            where[b] |= ~selected[:, None]
    return np.broadcast_to(where[:, None, :, :, None], (len(DEC_ROWS), DEC_HKV, DEC_NB, BY, 1))


def decode_corners():
    grid = itertools.product(DEC_KINDS, DEC_TENSORS, DEC_CHUNKS, DEC_ORDERS)
    for i, (kind, tensors, (ntile, compat), order) in enumerate(grid):
        value = DEC_VALUES[i % len(DEC_VALUES)]
        cid = f"{kind}-{tensors}-ntile{ntile}{'-seeds' if compat else ''}-{order}-{value}"
        yield pytest.param(kind, tensors, ntile, compat, order, value, id=cid)


def _decode(q, k, v, ids, seq, ntile, compat, records=None):
    trace = None if records is None else records.append
    return msa_sparse_decode(q, k, v, ids, seq, tiling=MsaTiling(ntile=ntile),
                             seeds_compat=compat, trace=trace)  # fmt: skip


@pytest.mark.parametrize(("kind", "tensors", "ntile", "compat", "order", "value"),
                         list(decode_corners()))  # fmt: skip
def test_decode_masked_and_unselected_slots_never_reach_the_output(
    kind, tensors, ntile, compat, order, value
):
    q, k, v, seq = _decode_inputs()
    ids = _decode_ids(order)
    where = np.broadcast_to(_decode_unread(kind, ids), k.shape)
    k_bad = poison_float(k, where, value) if "k" in tensors else k
    v_bad = poison_float(v, where, value) if "v" in tensors else v
    want_rec, got_rec = [], []
    want = _decode(q, k, v, ids, seq, ntile, compat, want_rec)
    got = _decode(q, k_bad, v_bad, ids, seq, ntile, compat, got_rec)
    assert nonfinite_count(want) == 0
    assert_same_bits(got, want)
    assert_same_records(got_rec, want_rec)


@pytest.mark.parametrize("tensors", DEC_TENSORS)
def test_decode_row_with_no_kept_key_stays_zero_whatever_its_blocks_hold(tensors):
    """Row 1 selects only blocks after its current block: every key is masked, the output is
    zeros (the default policy) and stays zeros when all of its blocks hold NaN."""
    q, k, v, _ = _decode_inputs()
    seq = np.array([DEC_ROWS[0]["seq"], 5], dtype=np.int64)  # row 1: cur block 0, not selected
    ids = np.array([_decode_ids("current_first")[0], [4, 1, 7, 2]], dtype=np.int32)
    where = np.zeros(k.shape, dtype=bool)
    where[1] = True
    k_bad = poison_float(k, where, np.nan) if "k" in tensors else k
    v_bad = poison_float(v, where, np.nan) if "v" in tensors else v
    want = msa_sparse_decode(q, k, v, ids, seq)
    got = msa_sparse_decode(q, k_bad, v_bad, ids, seq)
    assert not np.asarray(want[1]).astype(F32).any()
    assert_same_bits(got, want)


@pytest.mark.parametrize("tensors", ("k", "v"))
def test_decode_control_a_poisoned_kept_key_shows(tensors):
    """The control: one kept key of row 0 (position 5 of block 0) poisoned -> NaN in row 0."""
    q, k, v, seq = _decode_inputs()
    ids = _decode_ids("current_first")
    where = np.zeros(k.shape, dtype=bool)
    where[0, :, 0, 5] = True
    k_bad = poison_float(k, where, np.nan) if tensors == "k" else k
    v_bad = poison_float(v, where, np.nan) if tensors == "v" else v
    out = msa_sparse_decode(q, k_bad, v_bad, ids, seq)
    assert nonfinite_count(out[0]) > 0 and nonfinite_count(out[1]) == 0


# ============================================================================= MSA main branch
MAIN_N, MAIN_HQ, MAIN_HKV, MAIN_DH = 200, 16, 2, 64  # 2 query blocks, the second partial
MAIN_KINDS = ("padding_slots", "rows_past_n")


def _main_case(dtype: str) -> dict:
    return msa_make_case(None, op="msa_main_branch", seed=5, n=MAIN_N, dtype=dtype,
                         hq=MAIN_HQ, hkv=MAIN_HKV, dh=MAIN_DH)  # fmt: skip


def _main_unread(kind: str, case: dict) -> np.ndarray:
    """bool ``[topk*bk, 1, 1]``: the key rows of ``kind``, from the selected ids."""
    ids = case["meta"]["topk_indices"]
    topk = case["inputs"]["block_mask"].shape[1]
    slot = np.arange(topk * BY) // BY
    if kind == "padding_slots":
        where = slot >= ids.size
    else:  # token positions ids[slot]*bk + t past n, in the real slots
        real = slot < ids.size
        pos = np.where(
            real, ids[np.minimum(slot, ids.size - 1)] * BY + np.arange(topk * BY) % BY, 0
        )
        where = real & (pos >= MAIN_N)
    return where[:, None, None]


def main_corners():
    paths = (("fp32", True), ("fp16", True), ("bf16", True), ("fp32", False))  # dtype, _fast
    for kind, tensors, (dtype, fast) in itertools.product(MAIN_KINDS, DEC_TENSORS, paths):
        cid = f"{kind}-{tensors}-{dtype}-{'fast' if fast else 'plain'}"
        yield pytest.param(kind, tensors, dtype, fast, id=cid)


@pytest.mark.parametrize(("kind", "tensors", "dtype", "fast"), list(main_corners()))
def test_main_branch_padding_never_reaches_the_output(kind, tensors, dtype, fast):
    case = _main_case(dtype)
    inp = case["inputs"]
    where = np.broadcast_to(_main_unread(kind, case), inp["key_blocks"].shape)
    bad = dict(inp)
    for name in ("key_blocks", "value_blocks"):
        if name[0] in tensors:
            bad[name] = poison_float(inp[name], where, np.nan)
    want = msa_main_branch(**inp, **case["params"], _fast=fast)
    got = msa_main_branch(**bad, **case["params"], _fast=fast)
    assert nonfinite_count(want) == 0
    assert_same_bits(got, want)
    if fast and tensors == "kv":  # with a trace hook too (the records, the path a hook takes)
        want_rec, got_rec = [], []
        msa_main_branch(**inp, **case["params"], trace=want_rec.append)
        msa_main_branch(**bad, **case["params"], trace=got_rec.append)
        assert_same_records(got_rec, want_rec)


def test_main_branch_control_a_poisoned_visible_key_shows():
    """The control: key 0 of slot 0 is seen by every query row of a later block."""
    case = _main_case("fp32")
    inp = dict(case["inputs"])
    inp["value_blocks"] = inp["value_blocks"].copy()
    inp["value_blocks"][0] = np.nan
    out = msa_main_branch(**inp, **case["params"])
    assert nonfinite_count(out) > 0


# ============================================================================= MoE
MOE_COUNTS = ((3, 0, 5, 8), (0, 4, 0, 2), (6, 3, 0, 0))  # empty first / middle / last experts
MOE_KINDS = ("rows_past_last_expert", "empty_expert_weights", "all")
MOE_TAIL = 5  # extra rows of sorted_tokens past expert_cumsum[-1]


def moe_corners():
    grid = itertools.product(MOE_KINDS, ("silu", "swigluoai"), MOE_COUNTS, (True, False))
    for i, (kind, act, counts, fast) in enumerate(grid):
        value = DEC_VALUES[i % len(DEC_VALUES)]
        cid = f"{kind}-{act}-{'_'.join(map(str, counts))}-{'fast' if fast else 'plain'}-{value}"
        yield pytest.param(kind, act, counts, fast, value, id=cid)


def _moe_case(act: str, counts) -> dict:
    case = moe_make_case(None, seed=4, activation=act, hidden_size=64, intermediate_size=32,
                         counts=counts, mm1_k=32, mm2_k=16, unroll=(1, 2, 4),
                         input_scale=1.0 if act == "silu" else 3.0)  # fmt: skip
    x = case["inputs"]["sorted_tokens"]
    extra = np.random.default_rng(1).standard_normal((MOE_TAIL, x.shape[1])).astype(F32)
    case["inputs"]["sorted_tokens"] = np.concatenate([x, extra.astype(x.dtype)])
    return case


@pytest.mark.parametrize(("kind", "act", "counts", "fast", "value"), list(moe_corners()))
def test_moe_unrouted_rows_and_empty_experts_never_reach_the_output(
    kind, act, counts, fast, value, monkeypatch
):
    import tilesim.reference.moe as moe_module

    monkeypatch.setattr(moe_module, "_FAST", fast)
    case = _moe_case(act, counts)
    inp, params = case["inputs"], case["params"]
    dims = params["dims"]
    h, i = dims.hidden_size, dims.intermediate_size
    bad = dict(inp)
    if kind in ("rows_past_last_expert", "all"):
        x = inp["sorted_tokens"]
        tail = np.zeros(x.shape, dtype=bool)
        tail[sum(counts) :] = True
        bad["sorted_tokens"] = poison_float(x, tail, value)
    if kind in ("empty_expert_weights", "all"):
        w13, w2 = inp["weights"]
        empty = [e for e, c in enumerate(counts) if c == 0]
        rows13 = np.zeros(w13.shape, dtype=bool)
        rows2 = np.zeros(w2.shape, dtype=bool)
        for e in empty:
            rows13[e * h : (e + 1) * h] = True
            rows2[e * i : (e + 1) * i] = True
        bad["weights"] = (poison_float(w13, rows13, value), poison_float(w2, rows2, value))
    want_rec, got_rec = [], []
    want = moe_grouped_gemm(**inp, **params, trace=want_rec.append)
    got = moe_grouped_gemm(**bad, **params, trace=got_rec.append)
    assert nonfinite_count(want) == 0
    assert_same_bits(got, want)
    assert_same_records(got_rec, want_rec)


def test_moe_control_a_poisoned_routed_row_shows():
    case = _moe_case("silu", MOE_COUNTS[0])
    inp = dict(case["inputs"])
    inp["sorted_tokens"] = inp["sorted_tokens"].copy()
    inp["sorted_tokens"][4] = np.nan  # expert 2's first row
    out = moe_grouped_gemm(**inp, **case["params"])
    assert nonfinite_count(out[4]) > 0 and nonfinite_count(np.delete(out, 4, axis=0)) == 0


# ============================================================================= lightning indexer
IDX_NBS = (5, 17, 40)  # the short-context guard, just past it, several ranked blocks
IDX_PARTIAL = (1, 64, 127)  # keys that count in the last block


def indexer_corners():
    grid = itertools.product(IDX_NBS, IDX_PARTIAL, ("max", "none"))
    for i, (nb, partial, reduce) in enumerate(grid):
        value = DEC_VALUES[i % len(DEC_VALUES)]
        yield pytest.param(nb, partial, reduce, value, id=f"nb{nb}-last{partial}-{reduce}-{value}")


@pytest.mark.parametrize(("nb", "partial", "reduce", "value"), list(indexer_corners()))
def test_indexer_key_rows_past_seq_len_never_reach_the_selection(nb, partial, reduce, value):
    seq_len = (nb - 1) * BY + partial
    case = msa_make_case(None, op="msa_indexer", seed=9, nb=nb, seq_len=seq_len,
                         head_reduce=reduce)  # fmt: skip
    inp, params = case["inputs"], case["params"]
    k = inp["idx_k"]
    # the clean run holds finite garbage past seq_len (the builder writes zeros there)
    garbage = np.random.default_rng(2).standard_normal(k.shape).astype(F32).astype(k.dtype)
    tail = np.zeros(k.shape, dtype=bool)
    tail[seq_len:] = True
    clean = np.where(tail, garbage, k)
    want_rec, got_rec = [], []
    want = msa_indexer(inp["idx_q"], clean, **params, trace=want_rec.append)
    got = msa_indexer(inp["idx_q"], poison_float(k, tail, value), **params, trace=got_rec.append)
    assert_same_bits(got, want, "block ids")
    assert_same_records(got_rec, want_rec)


def test_indexer_control_a_poisoned_row_below_seq_len_is_rejected():
    """Rows that count must be finite (a NaN there makes the ranking void): ValueError."""
    case = msa_make_case(None, op="msa_indexer", seed=9, nb=17, seq_len=16 * BY + 3)
    inp, params = case["inputs"], case["params"]
    k = inp["idx_k"].copy()
    k[16 * BY + 2, 7] = np.nan  # the last row that counts
    with pytest.raises(
        ValueError, match=r"idx_k: expected finite values, got nan at index \[2050, 7\]"
    ):
        msa_indexer(inp["idx_q"], k, **params)


# ============================================================================= the rule itself
def test_select_masking_equals_the_multiply_form_on_finite_scores():
    """``select_masked`` vs the seeds' ``S*m + (1-m)*neg`` (written out here) on FP32 scores
    covering +-0, subnormals, the extremes and random values: the same bits; on NaN / inf
    scores the select still gives ``neg`` where masked, the multiply form does not."""
    from tilesim.reference.util.msa_common import select_masked

    rng = np.random.default_rng(0)
    special = np.array([0.0, -0.0, 1e-45, -1e-45, 3.4e38, -3.4e38, -3e38, 1.0, -1.0], dtype=F32)
    s = np.concatenate([special, rng.standard_normal(4000).astype(F32) * F32(30)])
    neg = F32(-3.0e38)
    for keep_value in (True, False):
        keep = np.full(s.shape, keep_value)
        m = keep.astype(F32)
        want = s * m + (m * F32(-1) + F32(1)) * neg
        assert_same_bits(select_masked(s.copy(), keep, neg), want, f"keep={keep_value}")
    bad = np.array([np.nan, np.inf, -np.inf], dtype=F32)
    assert_same_bits(select_masked(bad.copy(), np.zeros(3, bool), neg), np.full(3, neg))
    with np.errstate(invalid="ignore"):
        assert np.isnan(bad * F32(0) + neg).all()  # why the multiply form is not NaN-proof
