"""DeepSeek-V3.2 lightning indexer golden (``dsa_indexer``) against the independent oracle.

Oracle (``tests/oracles/dsa_indexer.py``): one row at a time over its visible keys, the cache
read through the block table by hand (FP8 page bytes cut at their offsets), exact dots (int64 /
float64), the head sum as an explicit FP32 halving loop (or an exact float64 sum for the "pypto"
order), every FP16 / FP32 step an elementwise NumPy operation, top-k as ``sorted`` on ``(-score,
position)``. Data: the case builder's recipe with small blocks and a small ``topk`` so that the
boundary of the selection is crossed.
"""

from __future__ import annotations

import numpy as np
import pytest
from oracles.dsa_indexer import oracle_indexer
from tilesim.reference import dsa_indexer, dsa_indexer_make_case
from tilesim.shared.dsa_indexer import check_meta, check_values, cost
from tilesim.shared.trace import check_record

BS, TOPK = 16, 24


def _case(**kw):
    kw.setdefault("block_size", BS)
    kw.setdefault("topk", TOPK)
    kw.setdefault("seq_lens", (37, 90))
    return dsa_indexer_make_case(None, seed=kw.pop("seed", 3), **kw)


def _run(case):
    return dsa_indexer(**case["inputs"], **case["params"])


def _oracle(case):
    inp = dict(case["inputs"])
    q_lens = inp.pop("q_lens", None)
    p = case["params"]
    return oracle_indexer(inp, path=p["path"], int8_order=p.get("int8_order", "gym"),
                          topk=p["topk"], block_size=p["block_size"], q_lens=q_lens)  # fmt: skip


ARITHMETICS = [
    dict(path="int8", int8_order="gym"),
    dict(path="int8", int8_order="pypto"),
    dict(path="fp8"),
    dict(path="fp8", ue8m0=True),
]


@pytest.mark.parametrize("kw", ARITHMETICS, ids=lambda k: "-".join(map(str, k.values())))
def test_decode_scores_and_ids_equal_the_oracle(kw):
    case = _case(s1=2, **kw)
    ids, scores = _run(case)
    want_ids, want_scores = _oracle(case)
    assert ids.dtype == np.int32 and ids.shape == (4, TOPK)
    width = case["inputs"]["block_table"].shape[1] * BS
    assert scores.dtype == np.float32 and scores.shape == (4, width)
    np.testing.assert_array_equal(scores, want_scores)  # bit-exact, -inf where not visible
    np.testing.assert_array_equal(ids, want_ids)


@pytest.mark.parametrize("path", ["int8", "fp8"])
def test_ragged_prefill_equals_the_oracle(path):
    case = _case(path=path, seq_lens=(30, 9, 50), q_lens=(5, 0, 3))
    ids, scores = _run(case)
    want_ids, want_scores = _oracle(case)
    np.testing.assert_array_equal(scores, want_scores)
    np.testing.assert_array_equal(ids, want_ids)
    vis = [26, 27, 28, 29, 30, 48, 49, 50]  # row r of a batch sees L - (n - 1 - r)
    assert [int((r >= 0).sum()) for r in ids] == [min(v, TOPK) for v in vis]
    assert [int(np.isfinite(r).sum()) for r in scores] == vis


def test_the_two_int8_orders_differ_but_rank_alike():
    gym = _run(_case(s1=1, int8_order="gym", seq_lens=(200,), topk=8))
    pypto = _run(_case(s1=1, int8_order="pypto", seq_lens=(200,), topk=8))
    assert not np.array_equal(gym.scores, pypto.scores)  # different rounding points
    vis = np.isfinite(gym.scores)
    rel = np.abs(gym.scores[vis] - pypto.scores[vis]) / np.abs(gym.scores[vis]).max()
    assert rel.max() < 1e-2  # the same quantity, rounded differently


def test_rows_at_2047_2048_2049_visible():
    case = dsa_indexer_make_case("dsa_indexer_boundary_int8")
    ids, scores = _run(case)
    assert [int((r >= 0).sum()) for r in ids] == [2047, 2048, 2048]
    assert (ids[0, 2047] == -1) and set(ids[0, :2047].tolist()) == set(range(2047))
    assert set(ids[1].tolist()) == set(range(2048))
    dropped = set(range(2049)) - set(ids[2].tolist())  # the one token row 2 leaves out
    assert len(dropped) == 1
    (p,) = dropped
    assert scores[2, p] <= scores[2, ids[2]].min()
    for r in range(3):  # score descending, equal scores: lower position first
        s = scores[r, ids[r][ids[r] >= 0]]
        k = ids[r][ids[r] >= 0]
        pairs = zip(s[:-1], s[1:], k[:-1], k[1:], strict=True)
        assert all((a > b) or (a == b and i < j) for a, b, i, j in pairs)


def test_all_tie_row_takes_the_lowest_positions():
    ids, scores = _run(dsa_indexer_make_case("dsa_indexer_all_tie_int8"))
    for r in range(2):  # batch 0: 2100 tokens with one key; both rows see > 2048
        assert np.unique(scores[r, np.isfinite(scores[r])]).size == 1
        assert ids[r].tolist() == list(range(2048))


@pytest.mark.parametrize("path", ["int8", "fp8"])
def test_poisoned_unread_blocks_and_tail_slots_change_nothing(path):
    clean = _case(path=path, seed=5, spare_blocks=3)
    dirty = _case(path=path, seed=5, spare_blocks=3, poison_unused=True)
    kc = dirty["inputs"]["k_cache"]
    assert not np.array_equal(clean["inputs"]["k_cache"], kc)
    if path == "int8":
        assert np.isnan(dirty["inputs"]["k_scale"][-3:]).all()  # the spare blocks
        assert np.isnan(dirty["inputs"]["k_scale"]).sum() == 3 * BS + (48 - 37) + (96 - 90)
    else:
        assert (kc[-3:, : BS * 128] == 0x7F).all()
    a, b = _run(clean), _run(dirty)
    np.testing.assert_array_equal(a.topk_indices, b.topk_indices)
    np.testing.assert_array_equal(a.scores, b.scores)


def test_inputs_are_not_written_and_torch_in_gives_torch_out():
    case = _case()
    before = {k: v.copy() for k, v in case["inputs"].items()}
    ids, scores = _run(case)
    for k, v in before.items():
        np.testing.assert_array_equal(case["inputs"][k], v)
    torch = pytest.importorskip("torch")
    t_in = {k: torch.from_numpy(v) for k, v in case["inputs"].items()}
    t_ids, t_scores = dsa_indexer(**t_in, **case["params"])
    assert isinstance(t_ids, torch.Tensor) and np.array_equal(t_ids.numpy(), ids)
    assert np.array_equal(t_scores.numpy(), scores)


def test_trace_one_record_per_read_block_and_flops_sum_to_cost():
    case = _case(seq_lens=(37, 90))
    recs = []
    ids, scores = dsa_indexer(**case["inputs"], **case["params"], trace=recs.append)
    blocks = [-(-37 // BS), -(-90 // BS)]
    assert [(r["lane"]["b"], r["step"]) for r in recs] == [
        (b, j) for b in range(2) for j in range(blocks[b])
    ]
    for r in recs:
        check_record(r)
        b, j = r["lane"]["b"], r["step"]
        lo, hi = r["key_range"]
        assert (lo, hi) == (j * BS, min((j + 1) * BS, (37, 90)[b]))
        assert r["extra"]["block"] == case["inputs"]["block_table"][b, j]
        np.testing.assert_array_equal(r["row_max"], scores[2 * b : 2 * b + 2, lo:hi].max(axis=1))
    a = check_values(check_meta(**case["inputs"], **case["params"]))
    c = cost(a)
    assert sum(r["flop"] for r in recs) == c["flop"] == 2 * 64 * 129 * 2 * (37 + 90)
    assert c["keys"] == 127 and c["scored"] == 2 * 127


@pytest.mark.torch
def test_int8_gym_order_is_pypto_gyms_torch_golden():
    """pypto-gym's test golden restated in torch (``_lightning_batch_block_loop``: int32
    matmul, ReLU, x 1/2048, FP16; FP16 ``q_scale * w``; FP32 ``bmm``; x FP32 key scale).
    torch's FP32 ``bmm`` sums in FP32 in an order of its own where tilesim rounds the exact sum
    once, so the scores agree within the FP32 summation bound ``64 u sum_h |w_h v_h|``, and
    the ids agree except among positions that close to the selection boundary."""
    torch = pytest.importorskip("torch")
    case = _case(s1=2, seq_lens=(300, 200), topk=64, block_size=128)
    inp = {k: torch.from_numpy(v) for k, v in case["inputs"].items()}
    ids, scores = _run(case)
    bt, lens = inp["block_table"], inp["seq_lens"]
    for b in range(2):
        n = int(lens[b])
        blocks = bt[b, : -(-n // 128)].long()
        k = inp["k_cache"][blocks].reshape(-1, 128)[:n]
        ks = inp["k_scale"][blocks].reshape(-1)[:n].to(torch.float32)
        q = inp["q"][2 * b : 2 * b + 2].reshape(-1, 128)
        qk = torch.matmul(q.to(torch.int32), k.T.to(torch.int32)).to(torch.float32).relu()
        qk = (qk * (1.0 / 2048)).to(torch.float16).reshape(2, 64, n).to(torch.float32)
        w = (inp["q_scale"][2 * b : 2 * b + 2] * inp["weights"][2 * b : 2 * b + 2])[:, None, :]
        ref = (torch.bmm(w.to(torch.float32), qk)[:, 0] * ks).numpy()
        bound = (torch.bmm(w.abs().to(torch.float32), qk)[:, 0] * ks).numpy() * 64 * 2.0**-23
        for r in range(2):
            v = n - 1 + r
            got, want, tol = scores[2 * b + r, :v], ref[r, :v], bound[r, :v]
            assert (np.abs(got - want) <= tol).all()
            assert (got == want).mean() > 0.25  # many are bit-equal
            top = set(torch.topk(torch.from_numpy(want), 64).indices.tolist())
            thr = np.sort(want)[-64]
            for p in top ^ set(ids[2 * b + r].tolist()):
                assert abs(want[p] - thr) <= 2 * tol.max()
