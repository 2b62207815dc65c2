"""MSA lightning indexer: kernel scores and block selection.

Oracles (``tests/oracles/msa.py``): exact dot products (``math.fsum`` / float64 matmul of BF16
values, which is exact for these data), a brute-force per-block max written with Python loops,
and the selection rule as a Python ``sorted`` on ``(-score, block id)`` (MiniMax's exact top-k
contract). Adversarial scores are injected exactly (:func:`oracles.msa.inject`): ``idx_q``
holds unit vectors and ``idx_k`` carries the wanted BF16 scores in the matching column, so
``score[h, t] = idx_k[t, h]`` exactly.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles.msa import inject, oracle_select
from tilesim.reference import msa_indexer, msa_indexer_scores
from tilesim.reference.msa_indexer import msa_indexer_flop
from tilesim.shared.casts import to_bf16
from tilesim.shared.trace import check_record

BF = ml_dtypes.bfloat16
BY = 128


def make(rng, nb, scale=0.1):
    q = to_bf16((rng.standard_normal((4, 128)) * scale).astype(np.float32))
    k = to_bf16((rng.standard_normal((nb * BY, 128)) * scale).astype(np.float32))
    return q, k


# ----------------------------------------------------------------------------- scores
def test_scores_are_correctly_rounded_fp32_dots(rng):
    nb = 3
    q, k = make(rng, nb)
    s = msa_indexer_scores(q, k, nb)
    assert s.dtype == np.float32 and s.shape == (4, nb * BY)
    q64, k64 = q.astype(np.float64), k.astype(np.float64)
    for h in range(4):
        for t in range(0, nb * BY, 7):
            exact = math.fsum((q64[h] * k64[t]).tolist())  # BF16 products are exact in f64
            assert s[h, t] == np.float32(exact), (h, t)


def test_scores_trace_one_record_per_block(rng):
    nb = 5
    q, k = make(rng, nb)
    recs = []
    s = msa_indexer_scores(q, k, nb, trace=recs.append)
    assert [r["step"] for r in recs] == list(range(nb))
    for r in recs:
        check_record(r)
        assert r["op"] == "msa_indexer_scores" and r["lane"] == {}
        assert r["key_range"] == (r["step"] * BY, (r["step"] + 1) * BY) and r["keys_used"] == BY
        blk = s[:, r["key_range"][0] : r["key_range"][1]]
        np.testing.assert_array_equal(r["row_max"], blk.max(axis=1))
        assert r["flop"] == 2 * 16 * BY * 128  # the cube's 16 rows x 128 keys x K 128
    assert sum(r["flop"] for r in recs) == msa_indexer_flop(nb)
    assert msa_indexer_flop(nb, padded=False) == 2 * 4 * nb * BY * 128


# ----------------------------------------------------------------------------- selection
@pytest.mark.parametrize("nb", [1, 2, 8, 15, 16, 17, 32, 33])
def test_selection_matches_bruteforce_oracle(rng, nb):
    q, k = make(rng, nb)
    ids = msa_indexer(q, k, nb)
    assert ids.dtype == np.int32 and ids.shape == (1, min(16, nb))
    scores = q.astype(np.float64) @ k.astype(np.float64).T  # exact for BF16 inputs
    assert ids.tolist() == oracle_select(scores, nb)
    assert len(set(ids[0].tolist())) == ids.shape[1]  # unique
    assert ids[0, -1] == nb - 1  # local block last
    if nb <= 16:
        assert ids[0].tolist() == list(range(nb))


def test_selection_per_head(rng):
    nb = 40
    q, k = make(rng, nb)
    ids = msa_indexer(q, k, nb, head_reduce="none")
    assert ids.shape == (4, 16) and ids.dtype == np.int32
    scores = q.astype(np.float64) @ k.astype(np.float64).T
    assert ids.tolist() == oracle_select(scores, nb, per_head=True)
    assert (ids[:, -1] == nb - 1).all()
    # the max-reduced selection is a different rule: at least one head disagrees with it
    assert any(ids[h].tolist() != msa_indexer(q, k, nb)[0].tolist() for h in range(4))
    short = msa_indexer(*make(rng, 8), 8, head_reduce="none")
    assert short.tolist() == [list(range(8))] * 4


def test_all_equal_scores_take_lowest_ids():
    # MiniMax's tie test: all-zero q and k, 18 blocks -> [0..14, 17]
    nb = 18
    q = to_bf16(np.zeros((4, 128), np.float32))
    k = to_bf16(np.zeros((nb * BY, 128), np.float32))
    assert msa_indexer(q, k, nb).tolist() == [list(range(15)) + [17]]
    sc = np.full((4, 40 * BY), 0.5, np.float32)
    q, k = inject(sc)
    assert msa_indexer(q, k, 40).tolist() == [list(range(15)) + [39]]
    assert msa_indexer(q, k, 40, head_reduce="none").tolist() == [list(range(15)) + [39]] * 4


def test_plus_minus_1e20_scores(rng):
    nb = 33
    sc = np.where(rng.random((4, nb * BY)) < 0.0005, 1e20, -1e20).astype(np.float32)
    sc = to_bf16(sc).astype(np.float32)
    q, k = inject(sc)
    assert np.array_equal(msa_indexer_scores(q, k, nb), sc)
    ids = msa_indexer(q, k, nb)
    assert ids.tolist() == oracle_select(sc, nb)
    bs = sc.reshape(4, nb, BY).max(axis=(0, 2))
    n_hi = int((bs[: nb - 1] == sc.max()).sum())
    assert 0 < n_hi < 15  # some +1e20 blocks and some ties broken by id among the rest
    assert msa_indexer(q, k, nb, head_reduce="none").tolist() == oracle_select(
        sc, nb, per_head=True
    )


def test_scores_one_bf16_step_apart(rng):
    nb = 33
    base = np.float32(1.0)
    steps = (base.view(np.uint32) + (np.arange(nb) << 16)).astype(np.uint32).view(np.float32)
    perm = rng.permutation(nb)
    sc = np.full((4, nb * BY), -2.0, np.float32)
    for j in range(nb):  # block j's max (in one random head and row) is steps[perm[j]]
        sc[rng.integers(4), j * BY + rng.integers(BY)] = steps[perm[j]]
    q, k = inject(sc)
    ids = msa_indexer(q, k, nb)[0].tolist()
    expect = sorted(range(nb - 1), key=lambda j: -perm[j])[:15] + [nb - 1]
    assert ids == expect
    assert ids == oracle_select(sc, nb)[0]


def test_seq_len_keeps_padding_out_of_the_block_max():
    nb, seq_len = 20, 19 * BY + 10
    sc = np.full((4, nb * BY), -3.0, np.float32)
    sc[:, seq_len:] = 0.0  # zero padding of the partial last block scores 0 in the kernel
    sc[1, 19 * BY + 3] = -1.0
    q, k = inject(sc)
    recs_seed, recs_len = [], []
    a = msa_indexer(q, k, nb, trace=recs_seed.append)
    b = msa_indexer(q, k, nb, seq_len=seq_len, trace=recs_len.append)
    assert a.tolist() == b.tolist()  # the local block is forced, never ranked
    assert len(recs_len) == nb and [r["step"] for r in recs_len] == list(range(nb))
    for r in recs_len + recs_seed:
        check_record(r)
        assert r["op"] == "msa_indexer" and r["lane"] == {}
        assert r["key_range"] == (r["step"] * BY, (r["step"] + 1) * BY)
    last, last_seed = recs_len[-1], recs_seed[-1]
    assert last_seed["extra"]["block_score"] == 0.0  # the seeds' rule scores the padding
    assert last["extra"]["block_score"] == -1.0
    assert last["keys_used"] == 10 and last_seed["keys_used"] == BY
    np.testing.assert_array_equal(last["extra"]["head_max"], [-3.0, -1.0, -3.0, -3.0])
    np.testing.assert_array_equal(last["row_max"], last["extra"]["head_max"])
    assert last["extra"]["local"] and last["extra"]["slot"] == 15
    assert not any(r["extra"]["local"] for r in recs_len[:-1])
    slots = [r["extra"]["slot"] for r in recs_len if r["extra"]["slot"] >= 0]
    assert sorted(slots) == list(range(16))
    # slot order = the returned order of the "max" selection
    by_slot = sorted((r["extra"]["slot"], r["step"]) for r in recs_len if r["extra"]["slot"] >= 0)
    assert [blk for _, blk in by_slot] == b[0].tolist()


def test_seed_cases_set_equal_to_bf16_reference():
    """The seeds' rule: set equality with a BF16-matmul reference (hicann/pypto-gym's indexer
    test; docs/ops/msa.md, "Cases")."""
    from tilesim.reference import msa_make_case

    for name, nb in (("msa_indexer_nb8", 8), ("msa_indexer_nb17", 17)):
        case = msa_make_case(name)
        ids = msa_indexer(**case["inputs"], **case["params"])
        q, k = case["inputs"]["idx_q"], case["inputs"]["idx_k"]
        sc_bf16 = to_bf16((q.astype(np.float32) @ k.astype(np.float32).T).astype(np.float32))
        bs = sc_bf16.astype(np.float32).reshape(4, nb, BY).max(axis=(0, 2))
        if nb <= 16:
            ref = set(range(nb))
        else:
            ref = set(np.argpartition(-bs[: nb - 1], 14)[:15].tolist()) | {nb - 1}
        assert set(ids[0].tolist()) == ref


# ----------------------------------------------------------------------------- contract
def test_torch_in_torch_out(rng):
    torch = pytest.importorskip("torch")
    from tilesim.shared.interop import to_torch

    nb = 17
    q, k = make(rng, nb)
    ids = msa_indexer(to_torch(q), to_torch(k), nb)
    assert isinstance(ids, torch.Tensor) and ids.dtype == torch.int32
    assert ids.numpy().tolist() == msa_indexer(q, k, nb).tolist()
    s = msa_indexer_scores(to_torch(q), to_torch(k), nb)
    assert isinstance(s, torch.Tensor)
    np.testing.assert_array_equal(s.numpy(), msa_indexer_scores(q, k, nb))
    # the output kind follows the first array argument (idx_q)
    assert isinstance(msa_indexer(q, to_torch(k), nb), np.ndarray)
    assert isinstance(msa_indexer(to_torch(q), k, nb), torch.Tensor)


test_torch_in_torch_out = pytest.mark.torch(test_torch_in_torch_out)


def test_inputs_unmodified_and_deterministic(rng):
    nb = 20
    q, k = make(rng, nb)
    q0, k0 = q.copy(), k.copy()
    a = msa_indexer(q, k, nb, seq_len=nb * BY - 5)
    b = msa_indexer(q, k, nb, seq_len=nb * BY - 5)
    assert a.tobytes() == b.tobytes()
    assert q.tobytes() == q0.tobytes() and k.tobytes() == k0.tobytes()
    s1, s2 = msa_indexer_scores(q, k, nb), msa_indexer_scores(q, k, nb)
    assert s1.tobytes() == s2.tobytes()


@pytest.mark.parametrize(
    "mutate, exc, words",
    [
        (lambda q, k, nb: (q.astype(np.float32), k, nb), TypeError, ["idx_q", "bfloat16"]),
        (lambda q, k, nb: (q, k.astype(np.float16), nb), TypeError, ["idx_k", "float16"]),
        (lambda q, k, nb: (q[:3], k, nb), ValueError, ["idx_q", "(4, 128)"]),
        (lambda q, k, nb: (q, k[:-1], nb), ValueError, ["idx_k", "(2176, 128)"]),
        (lambda q, k, nb: (q, k, 0), ValueError, ["nb", "[1, inf]"]),
        (lambda q, k, nb: (q, k, 17.0), TypeError, ["nb", "float"]),
        (lambda q, k, nb: (q, k, "17"), TypeError, ["nb", "str"]),
        (lambda q, k, nb: (q.tolist(), k, nb), TypeError, ["idx_q", "list"]),
        (lambda q, k, nb: (q, list(k), nb), TypeError, ["idx_k", "list"]),
    ],
)
def test_bad_inputs(rng, mutate, exc, words):
    q, k = make(rng, 17)
    args = mutate(q, k, 17)
    for fn in (msa_indexer, msa_indexer_scores):
        with pytest.raises(exc) as e:
            fn(*args)
        for w in words:
            assert w in str(e.value)


def test_bad_options(rng):
    q, k = make(rng, 17)
    for bad in (0, -1, 16 * BY, 17 * BY + 1):
        with pytest.raises(ValueError, match=r"seq_len: expected an int with 2048 < seq_len"):
            msa_indexer(q, k, 17, seq_len=bad)
    for bad in (2.5, True, "2100"):
        with pytest.raises(TypeError, match="seq_len: expected an int"):
            msa_indexer(q, k, 17, seq_len=bad)
    with pytest.raises(ValueError, match="head_reduce"):
        msa_indexer(q, k, 17, head_reduce="mean")
    with pytest.raises(TypeError, match="trace"):
        msa_indexer(q, k, 17, trace=3)
    with pytest.raises(TypeError, match="trace"):  # checked before anything else
        msa_indexer(q.tolist(), k, 0, trace=3)
    k_nan = k.copy()
    k_nan[5, 5] = np.nan
    with pytest.raises(ValueError, match="idx_k.*finite"):
        msa_indexer(q, k_nan, 17)


@settings(max_examples=40, deadline=None)
@given(
    nb=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
    levels=st.integers(1, 6),
    partial=st.integers(1, BY),
)
def test_property_selection_equals_oracle(nb, seed, levels, partial):
    """Random block counts, scores drawn from few levels (many ties) and a partial last block."""
    r = np.random.default_rng(seed)
    sc = to_bf16(r.integers(-levels, levels + 1, (4, nb * BY)).astype(np.float32) / 4)
    q, k = inject(sc.astype(np.float32))
    seq_len = (nb - 1) * BY + partial
    sc_masked = sc.astype(np.float32)
    ids = msa_indexer(q, k, nb, seq_len=seq_len)
    assert ids.tolist() == oracle_select(sc_masked, nb, seq_len=seq_len)
    per_head = msa_indexer(q, k, nb, seq_len=seq_len, head_reduce="none")
    assert per_head.tolist() == oracle_select(sc_masked, nb, seq_len=seq_len, per_head=True)
    for row in per_head.tolist() + ids.tolist():
        assert len(set(row)) == len(row) == min(16, nb) and row[-1] == nb - 1


# ----------------------------------------------------------------------------- the contract
def test_contract_module_exports_the_five_things():
    from tilesim.shared import msa_indexer as contract

    for name in ("Args", "check_meta", "check_values", "host_plan", "cost"):
        assert callable(getattr(contract, name)), name


def test_check_meta_reads_no_value_on_meta_tensors():
    """check_meta on torch ``meta`` tensors (no data to read: any read would raise) checks
    shapes, dtypes and the static sizes, and refuses a wrong shape naming the argument."""
    torch = pytest.importorskip("torch")
    from tilesim.shared.msa_indexer import check_meta

    q = torch.empty((4, 128), dtype=torch.bfloat16, device="meta")
    k = torch.empty((20 * BY, 128), dtype=torch.bfloat16, device="meta")
    args = check_meta(q, k, 20, seq_len=19 * BY + 3, head_reduce="none")
    assert (args.nb, args.valid, args.head_reduce) == (20, 19 * BY + 3, "none")
    assert args.idx_q is q and args.idx_k is k  # the caller's objects, not copies
    with pytest.raises(ValueError, match="idx_k"):
        check_meta(q, k, 19)
    with pytest.raises(ValueError, match="seq_len"):
        check_meta(q, k, 20, seq_len=19 * BY)  # not in (19*128, 20*128]
    with pytest.raises(TypeError, match="idx_q"):
        check_meta(torch.empty((4, 128), dtype=torch.float32, device="meta"), k, 20)


def test_check_values_catches_what_check_meta_does_not(rng):
    from tilesim.shared.msa_indexer import check_meta, check_values

    q, k = make(rng, 3)
    k[2 * BY + 7, 3] = np.inf  # a row that counts
    args = check_meta(q, k, 3)  # metadata only: passes
    with pytest.raises(ValueError, match="idx_k.*finite"):
        check_values(args)
    assert check_values(check_meta(q, k, 3, seq_len=2 * BY + 7)).valid == 2 * BY + 7  # past it


def test_host_plan_and_its_torch_twin_agree():
    pytest.importorskip("torch")
    from tilesim.shared.msa_indexer import NOT_CANDIDATE, host_plan, host_plan_torch, sized_args

    args = sized_args(20)._replace(valid=19 * BY + 5, head_reduce="none")
    plan = host_plan(args)
    assert (plan.rows, plan.k) == (4, 16)
    assert plan.key_keep.sum() == 19 * BY + 5 and plan.key_keep[0, : 19 * BY + 5].all()
    assert plan.order[0].tolist() == [*range(19), NOT_CANDIDATE]
    keep, order = host_plan_torch(args, "cpu", 64)
    assert np.array_equal(keep.numpy(), plan.key_keep)
    assert order.shape == (1, 64) and np.array_equal(order[:, :20].numpy(), plan.order)
    assert (order[0, 20:] == NOT_CANDIDATE).all()


def test_cost_counts_flops_and_bytes():
    from tilesim.shared.msa_indexer import cost, sized_args

    c = cost(sized_args(3))
    assert c["flop"] == 2 * 16 * 3 * BY * 128 == msa_indexer_flop(3)
    # BF16 q_pad [16, 128] + BF16 keys [384, 128] read, FP32 scores [16, 384] written
    assert c["bytes"] == 16 * 128 * 2 + 384 * 128 * 2 + 16 * 384 * 4
    assert cost(sized_args(3), padded=False)["flop"] == msa_indexer_flop(3, padded=False)
